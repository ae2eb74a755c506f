#!/usr/bin/env python3
"""Snapshot benchmark (issue 12): disk snapshot, memory snapshot, restore
(create --from a memory snapshot, to the first exec result), fork n=1 and
n=10 (and how long the source stood still for each fork and memory
snapshot: the engine's `paused_ms`), pause and resume, each as p50/p90 over
--runs, against a baseline
measured in the same run on the same daemon: a template clone (create ->
first exec result of `true`, the shape's template built first).

The source sandbox runs a background counter (a shell loop) so the saved
VM has a live process; every restore and fork is checked to be counting.

Usage: sudo python3 bench/snapshot.py [--image minimal] [--runs 5]
(root: the daemon jails QEMU as in production; AIRLOCK_IMAGE_DIR as for the tests)
"""

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import harness  # noqa: E402

COUNTER = "i=0; while true; do i=$((i+1)); echo $i > /root/count; sleep 0.2; done"


def pct(values, p):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))] if s else float("nan")


def timed(f):
    t0 = time.monotonic()
    r = f()
    return (time.monotonic() - t0) * 1000, r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", default="minimal")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    cls = type("Bench", (harness.DaemonTestCase,), {"daemon_args": []})
    cls.setUpClass()
    api = cls.api
    res = {}
    try:
        spec = {"image": args.image, "timeout": 3600}
        api.delete(api.create(**spec)["id"])  # builds the shape's template
        base = []
        for _ in range(args.runs):
            ms, sb = timed(lambda: api.create(**spec))
            api.exec(sb["id"], argv=["true"])
            base.append(ms)
            api.delete(sb["id"])
        res["baseline: template clone create"] = base
        src = api.create(**spec)["id"]
        api.call("POST", f"/v1/sandboxes/{src}/exec", {"cmd": COUNTER, "background": True})
        time.sleep(1)
        for key in ("disk snapshot", "memory snapshot", "restore (create --from memory)",
                    "fork n=1", "fork n=10", "pause", "resume", "memory snapshot: source paused",
                    "fork n=1: source paused", "fork n=10: source paused",
                    "first fork of a fresh clone", "first fork: source paused"):
            res[key] = []
        for i in range(args.runs):
            # A sandbox's first save is QEMU's first migration, which reads
            # every page of guest RAM through a mapping it never touched.
            fresh = api.create(**spec)["id"]
            ms, r = timed(lambda: api.call("POST", f"/v1/sandboxes/{fresh}/fork", {"count": 1}))
            res["first fork of a fresh clone"].append(ms)
            rec = [e for e in api.call("GET", f"/v1/sandboxes/{fresh}/events")
                   if e.get("event") == "fork"][-1]
            res["first fork: source paused"].append(rec["paused_ms"])
            for f in r["sandboxes"]:
                api.delete(f["id"])
            api.delete(fresh)
            ms, _ = timed(lambda: api.call("POST", f"/v1/sandboxes/{src}/snapshots",
                                           {"name": f"d{i}", "memory": False}))
            res["disk snapshot"].append(ms)
            ms, s = timed(lambda: api.call("POST", f"/v1/sandboxes/{src}/snapshots",
                                           {"name": f"m{i}", "memory": True}))
            res["memory snapshot"].append(ms)
            res["memory snapshot: source paused"].append(s["paused_ms"])

            def restore():
                sb = api.create(**{"from": f"m{i}", "timeout": 3600})
                api.exec(sb["id"], argv=["true"])
                return sb
            ms, sb = timed(restore)
            res["restore (create --from memory)"].append(ms)
            out, _, _ = api.exec(sb["id"], argv=["cat", "/root/count"])
            assert out.strip(), "restored counter has no count"
            api.delete(sb["id"])
            for n in (1, 10) if i < 2 or args.runs <= 2 else (1,):
                ms, r = timed(lambda: api.call("POST", f"/v1/sandboxes/{src}/fork", {"count": n}))
                res[f"fork n={n}"].append(ms)
                # How long the source's vCPUs stood still (the engine's own
                # figure, from the journal's fork record).
                rec = [e for e in api.call("GET", f"/v1/sandboxes/{src}/events")
                       if e.get("event") == "fork"][-1]
                res[f"fork n={n}: source paused"].append(rec["paused_ms"])
                for f in r["sandboxes"]:
                    api.delete(f["id"])
            ms, _ = timed(lambda: api.call("POST", f"/v1/sandboxes/{src}/pause"))
            res["pause"].append(ms)
            ms, _ = timed(lambda: api.call("POST", f"/v1/sandboxes/{src}/resume"))
            res["resume"].append(ms)
            for name in (f"d{i}", f"m{i}"):
                api.call("DELETE", f"/v1/snapshots/{name}")
        api.delete(src)
    finally:
        cls.tearDownClass()
    b = statistics.median(res["baseline: template clone create"])
    print(f"image {args.image}, runs {args.runs} (fork n=10: {len(res['fork n=10'])})")
    for k, v in res.items():
        if v:
            print(f"{k:<34} p50 {pct(v, 50):8.0f} ms  p90 {pct(v, 90):8.0f} ms  "
                  f"x{pct(v, 50) / b:5.2f} of baseline  n={len(v)}")


if __name__ == "__main__":
    main()

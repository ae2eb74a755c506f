#!/usr/bin/env python3
"""Start-up benchmark (issue 3): how fast a sandbox is ready to run code.

One run, one machine, side by side (minimal image, 1 vCPU, 256 MiB):
  cold     create -> first exec result of `true`, daemon with --no-templates
  clone    the same, daemon with templates (the shape's template built first)
  pool     the same, daemon with --pool minimal=N, counting pool hits only
  runsc    `runsc --network=none do true` (gVisor; Debian package runsc)
  qemu     plain QEMU cold boot of the same kernel/initrd/rootfs to the
           agent's ready line (no daemon)
Then, on the template daemon: 50 concurrent creates (p50/p99, failures), the
sustained create+destroy rate, and memory per idle sandbox (PSS of every QEMU,
which counts pages of the shared template RAM file once in total) with
--idle sandboxes alive at once. --cycles N runs N create/exec/destroy cycles
and checks that nothing is left behind.

Usage: sudo python3 bench/start.py [--runs 50] [--concurrent 50] [--idle 100] [--cycles 0]
"""

import argparse
import concurrent.futures
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
sys.path.insert(0, HERE)
import harness  # noqa: E402
from sandbox_bench import raw_qemu_boot  # noqa: E402

SPEC = {"image": "minimal", "cpus": 1, "memory_mb": 256}


def pct(values, p):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))] if s else float("nan")


def line(name, values):
    return (f"{name:<28} p50 {pct(values, 50):8.1f} ms  p90 {pct(values, 90):8.1f} ms  "
            f"p99 {pct(values, 99):8.1f} ms  n={len(values)}")


def daemon(name, args):
    cls = type(name, (harness.DaemonTestCase,), {"daemon_args": args})
    cls.setUpClass()
    return cls


def create_exec(api):
    """ms from create to the exec result of `true`; the sandbox's start kind."""
    t0 = time.monotonic()
    sb = api.create(**SPEC)
    _, _, ex = api.exec(sb["id"], argv=["true"])
    ms = (time.monotonic() - t0) * 1000
    api.delete(sb["id"])
    if ex.get("exit_code") != 0:
        raise RuntimeError(f"exec failed: {ex}")
    return ms, sb["start"]


def wait_pool(api, n, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        slots = api.call("GET", "/v1/pool")
        if slots and slots[0]["ready"] >= n:
            return True
        time.sleep(0.2)
    return False


def qemu_pss_kib(marker):
    """Summed Pss and Rss (KiB) of the QEMUs whose command line names `marker`."""
    pss = rss = n = 0
    for pid in harness.qemu_pids_for(marker):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for ln in f:
                    if ln.startswith("Pss:"):
                        pss += int(ln.split()[1])
                    elif ln.startswith("Rss:"):
                        rss += int(ln.split()[1])
            n += 1
        except OSError:
            pass
    return pss, rss, n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--concurrent", type=int, default=50)
    ap.add_argument("--idle", type=int, default=100)
    ap.add_argument("--cycles", type=int, default=0)
    ap.add_argument("--pool", type=int, default=2)
    args = ap.parse_args()
    results = {}
    failures = {}

    # --- cold boot and the plain-QEMU baseline, interleaved -----------------
    cold = daemon("Cold", ["--no-templates"])
    try:
        info = cold.api.call("GET", "/v1/info")
        print(f"accelerator={info['accelerator']} ({info['accelerator_reason']})", flush=True)
        built = next(i for i in info["images"] if i["name"] == "minimal")
        d = os.path.join(harness.IMAGE_DIR, "minimal", built["key"])
        image = {"kernel": os.path.join(d, "vmlinuz"), "initrd": os.path.join(d, "initrd.img"),
                 "rootfs": os.path.join(d, "rootfs.ext4")}
        results["cold"], results["qemu"], failures["cold"] = [], [], 0
        for i in range(args.runs):
            try:
                results["cold"].append(create_exec(cold.api)[0])
            except Exception as e:  # counted and reported
                failures["cold"] += 1
                print("cold failure:", e, file=sys.stderr)
            r = raw_qemu_boot(image)
            if r is not None:
                results["qemu"].append(r)
            print(f"cold {i + 1}/{args.runs}", file=sys.stderr, flush=True)
    finally:
        cold.tearDownClass()

    # --- runsc ---------------------------------------------------------------
    results["runsc"] = []
    if shutil.which("runsc"):
        for _ in range(args.runs):
            t0 = time.monotonic()
            p = subprocess.run(["runsc", "--network=none", "do", "true"], capture_output=True)
            if p.returncode == 0:
                results["runsc"].append((time.monotonic() - t0) * 1000)
    else:
        print("runsc not installed (apt-get install runsc): peer skipped", flush=True)

    # --- clones, concurrency, rate, memory ----------------------------------
    warm = daemon("Warm", [])
    try:
        warm.api.create(**SPEC)  # builds the shape's template
        for sb in warm.api.call("GET", "/v1/sandboxes"):
            warm.api.delete(sb["id"])
        results["clone"], failures["clone"], kinds = [], 0, set()
        for i in range(args.runs):
            try:
                ms, kind = create_exec(warm.api)
                results["clone"].append(ms)
                kinds.add(kind)
            except Exception as e:
                failures["clone"] += 1
                print("clone failure:", e, file=sys.stderr)
        print(f"clone runs started as {sorted(kinds)}", flush=True)

        def one_create(_):
            t0 = time.monotonic()
            sb = warm.api.create(**SPEC)
            return (time.monotonic() - t0) * 1000, sb["id"]

        conc, ids, conc_fail = [], [], 0
        with concurrent.futures.ThreadPoolExecutor(args.concurrent) as ex:
            for fut in [ex.submit(one_create, i) for i in range(args.concurrent)]:
                try:
                    ms, sid = fut.result()
                    conc.append(ms)
                    ids.append(sid)
                except Exception as e:
                    conc_fail += 1
                    print("concurrent failure:", e, file=sys.stderr)
        for sid in ids:
            warm.api.delete(sid)
        results["concurrent"], failures["concurrent"] = conc, conc_fail

        t0, n = time.monotonic(), 0
        while time.monotonic() - t0 < 30:
            sb = warm.api.create(**SPEC)
            warm.api.delete(sb["id"])
            n += 1
        rate = n / (time.monotonic() - t0)

        idle_ids, idle_fail = [], 0
        for _ in range(args.idle):
            try:
                idle_ids.append(warm.api.create(**SPEC, timeout=3600)["id"])
            except Exception as e:
                idle_fail += 1
                print("idle create failure:", e, file=sys.stderr)
        time.sleep(10)  # settle: idle guests
        pss, rss, nq = qemu_pss_kib(warm.data_dir)
        alive = sum(1 for sid in idle_ids if warm.api.exec(sid, argv=["true"])[2]["exit_code"] == 0)
        for sid in idle_ids:
            warm.api.delete(sid)

        cycles_fail = 0
        for i in range(args.cycles):
            try:
                sid = warm.api.create(**SPEC)["id"]
                if warm.api.exec(sid, argv=["true"])[2]["exit_code"] != 0:
                    cycles_fail += 1
                warm.api.delete(sid)
            except Exception as e:
                cycles_fail += 1
                print("cycle failure:", e, file=sys.stderr)
        leftovers = harness.qemu_pids_for(os.path.join(warm.data_dir, "sandboxes"))
        run_dirs = os.listdir(os.path.join(warm.data_dir, "sandboxes"))
    finally:
        warm.tearDownClass()

    # --- pool hits -----------------------------------------------------------
    pooled = daemon("Pooled", ["--pool", f"minimal={args.pool}"])
    try:
        results["pool"], failures["pool"], misses = [], 0, 0
        for _ in range(args.runs):
            if not wait_pool(pooled.api, 1):
                failures["pool"] += 1
                continue
            try:
                ms, kind = create_exec(pooled.api)
                if kind == "pool":
                    results["pool"].append(ms)
                else:
                    misses += 1
            except Exception as e:
                failures["pool"] += 1
                print("pool failure:", e, file=sys.stderr)
    finally:
        pooled.tearDownClass()

    print()
    print("create -> first exec result of `true` (minimal image, 1 vCPU, 256 MiB):")
    for k, label in [("pool", "pool hit"), ("clone", "template clone"), ("cold", "cold boot"),
                     ("runsc", "peer: runsc do true"), ("qemu", "peer: plain QEMU boot")]:
        print(line(label, results[k]))
    med = {k: statistics.median(v) for k, v in results.items() if v}
    if "runsc" in med and "clone" in med:
        print(f"{'clone / runsc (p50)':<28} {med['clone'] / med['runsc']:.2f}x")
    if "cold" in med and "clone" in med:
        print(f"{'cold / clone (p50)':<28} {med['cold'] / med['clone']:.1f}x")
    if "pool" in med and "runsc" in med:
        print(f"{'pool / runsc (p50)':<28} {med['pool'] / med['runsc']:.2f}x")
    print(f"{'pool misses (not counted)':<28} {misses}")
    print(line(f"{args.concurrent} concurrent creates", results["concurrent"]) +
          f"  failures={failures['concurrent']}")
    print(f"{'sustained create+destroy':<28} {rate:.2f} /s (one client, 30 s)")
    if nq:
        print(f"{'idle sandboxes alive':<28} {alive}/{args.idle} (create failures {idle_fail})")
        print(f"{'PSS per idle QEMU':<28} {pss / nq / 1024:.1f} MiB  (RSS {rss / nq / 1024:.1f} MiB, n={nq})")
    if args.cycles:
        print(f"{'create/exec/destroy cycles':<28} {args.cycles}, failures {cycles_fail}, "
              f"leftover QEMUs {len(leftovers)}, leftover run dirs {len(run_dirs)}")
    print(f"failures: {failures}")
    print(json.dumps({k: v for k, v in results.items()}), file=sys.stderr)
    return 1 if any(failures.values()) or idle_fail else 0


if __name__ == "__main__":
    sys.exit(main())

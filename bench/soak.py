#!/usr/bin/env python3
"""Soak: N create/exec/destroy cycles against one real airlockd.

Starts its own airlockd (temp data dir, template RAM in the temp dir, the
shared image dir), then, one cycle after another: create a `minimal` sandbox
(a template clone after the first), exec `echo cycle-N` and check its output
and exit code, delete it, and check that nothing of it is left behind (no
QEMU, helper process, run directory, cgroup or file but its journal: the
checks of tests/integration/harness.py). Every --sample-every cycles it
samples the daemon's RSS and open fd count.

Reports failures (any error, wrong output or leftover), cycle time p50/p90,
and RSS/fds first/median/last with last/first. Exits 1 on any failure or
leftover.

Usage: python3 bench/soak.py [--cycles 500] [--sample-every 25] [--image minimal]
"""

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import shutil

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "integration"))
import harness  # noqa: E402


def daemon_sample(pid):
    with open(f"/proc/{pid}/status") as f:
        rss_kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    return rss_kb / 1024.0, fds


def pct(values, p):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def start_daemon(tmp):
    data = os.path.join(tmp, "data")
    sock = os.path.join(tmp, "airlockd.sock")
    log = open(os.path.join(tmp, "airlockd.log"), "wb")
    proc = subprocess.Popen(
        [os.path.join(harness.BIN, "airlockd"), "--data-dir", data, "--socket", sock,
         "--image-dir", harness.IMAGE_DIR, "--template-ram-dir", os.path.join(tmp, "template-ram"),
         "--log-level", "warn", "--pool-learn", "0"],  # figures comparable with earlier runs
        stdout=log, stderr=subprocess.STDOUT)
    api = harness.Client(sock)
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("airlockd exited; see " + log.name)
        try:
            api.call("GET", "/v1/info", timeout=5)
            return proc, api, data, log
        except (OSError, harness.ApiError):
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("airlockd did not answer")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, default=500)
    ap.add_argument("--sample-every", type=int, default=25)
    ap.add_argument("--image", default="minimal")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="airlock-soak-")
    proc, api, data, log = start_daemon(tmp)
    failures, leftovers, cycle_ms, samples = [], [], [], []
    starts = {}
    t_all = time.monotonic()
    try:
        for i in range(args.cycles):
            t0 = time.monotonic()
            sid = None
            try:
                sb = api.create(image=args.image)
                sid = sb["id"]
                starts[sb.get("start", "?")] = starts.get(sb.get("start", "?"), 0) + 1
                out, err, exit_event = api.exec(sid, argv=["echo", f"cycle-{i}"])
                if out != f"cycle-{i}\n".encode() or not exit_event or exit_event.get("exit_code") != 0:
                    failures.append(f"cycle {i}: exec gave {out!r} {err!r} {exit_event}")
            except Exception as e:  # noqa: BLE001 - every failure counts, none stops the soak
                failures.append(f"cycle {i}: {type(e).__name__}: {e}")
            finally:
                if sid:
                    try:
                        api.delete(sid)
                    except Exception as e:  # noqa: BLE001
                        failures.append(f"cycle {i}: delete {sid}: {e}")
            cycle_ms.append((time.monotonic() - t0) * 1000)
            if sid:
                left = harness.leftovers_of(data, sid)
                if left:
                    leftovers.append(f"cycle {i} ({sid}): {left}")
            if i == 0 or (i + 1) % args.sample_every == 0 or i == args.cycles - 1:
                rss, fds = daemon_sample(proc.pid)
                samples.append((i + 1, rss, fds))
                print(f"cycle {i + 1:4d}: daemon RSS {rss:7.1f} MiB, fds {fds:4d}, "
                      f"failures {len(failures)}, leftovers {len(leftovers)}, "
                      f"last cycle {cycle_ms[-1]:.0f} ms", flush=True)
    finally:
        live = []
        try:
            live = api.call("GET", "/v1/sandboxes")
        except (OSError, harness.ApiError):
            pass
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        stray_qemu = harness.qemu_pids_for(data)
        for pid in stray_qemu + harness.pids_mentioning(data):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        sandbox_dirs = os.listdir(os.path.join(data, "sandboxes")) if os.path.isdir(
            os.path.join(data, "sandboxes")) else []
        keep_log = failures or leftovers
        if keep_log:
            print(f"daemon log kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    total_s = time.monotonic() - t_all
    rss = [s[1] for s in samples]
    fds = [s[2] for s in samples]
    print()
    print(f"cycles {args.cycles} in {total_s:.0f} s ({args.cycles / total_s:.2f}/s), starts {starts}")
    print(f"failures {len(failures)}, leftovers {len(leftovers)}, sandboxes still listed {len(live)}, "
          f"sandbox dirs left {len(sandbox_dirs)}, QEMU left after daemon stop {len(stray_qemu)}")
    print(f"cycle time p50 {pct(cycle_ms, 50):.0f} ms, p90 {pct(cycle_ms, 90):.0f} ms, "
          f"max {max(cycle_ms):.0f} ms")
    print(f"daemon RSS MiB first {rss[0]:.1f} median {statistics.median(rss):.1f} last {rss[-1]:.1f} "
          f"(last/first {rss[-1] / rss[0]:.2f}, last/median {rss[-1] / statistics.median(rss):.2f}); "
          f"samples after cycles {[s[0] for s in samples]}")
    print(f"daemon fds     first {fds[0]} median {statistics.median(fds):.0f} last {fds[-1]} "
          f"(last/first {fds[-1] / fds[0]:.2f})")
    for f in (failures + leftovers)[:20]:
        print("  " + f)
    bad = failures or leftovers or live or sandbox_dirs or stray_qemu
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

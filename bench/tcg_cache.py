#!/usr/bin/env python3
"""TCG translation-cache size vs workload time and QEMU memory (issue 9).

For each `--tcg-tb-size` value (MiB; 0 = QEMU 7.2's default, 1 GiB) it starts
its own airlockd with that value, inside the workload suite's little internet
(tests/workloads/little_repos.py: network namespaces it creates and deletes),
and runs two code-heavy workloads, each in a fresh `debian` sandbox at
512 MiB, --runs times:
  apt     apt-get update + install from the test's own apt repository, run it
  python  import most of the standard library + a fixed amount of CPU-heavy
          work (little_repos.PYTHON_SCRIPT with --rounds rounds)
  mixed   apt, then pip install from the test's index, then python, in one
          sandbox: the most distinct guest code through one cache
and prints, per size and workload, the median wall time of the exec and
QEMU's peak RSS (VmHWM from /proc, max over the runs), with ratios against
QEMU's default (0).

Usage: sudo python3 bench/tcg_cache.py [--sizes 32,64,128,256,0] [--runs 3] [--rounds 40]
Needs root, the debian image (airlock image build debian) and dpkg-dev, git.
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "workloads"))
import harness  # noqa: E402
import little_repos as lr  # noqa: E402

MIB = 1024 * 1024
WORKLOADS = ("apt", "python", "mixed")


def run_workload(api, name, rounds):
    """(seconds, VmHWM bytes) of one workload in a fresh sandbox."""
    sb = api.create(image="debian", memory_mb=512, timeout=1800,
                    network={"mode": "allowlist", "allow": [lr.NAME]})
    try:
        api.put_file(sb["id"], "/root/work.py", lr.PYTHON_SCRIPT.encode())
        py = f"python3 /root/work.py 0 {rounds}"
        cmd = {"apt": lr.apt_script(), "python": py,
               "mixed": f"({lr.apt_script()}) && ({lr.pip_script()}) && {py}"}[name]
        t0 = time.monotonic()
        out, err, ex = api.exec(sb["id"], cmd=cmd, timeout=1200, http_timeout=1300)
        took = time.monotonic() - t0
        if ex.get("exit_code") != 0:
            raise RuntimeError(f"{name} failed: {ex} {(out + err)[-2000:]!r}")
        hwm, _ = lr.qemu_memory(sb["pid"])
        return took, hwm
    finally:
        api.delete(sb["id"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="32,64,128,256,0")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=40)
    args = ap.parse_args()
    why = lr.can_run()
    if why:
        sys.exit(f"tcg_cache: {why}")
    sizes = [int(s) for s in args.sizes.split(",")]
    served = tempfile.mkdtemp(prefix="airlock-tcgbench-")
    net = lr.LittleInternet(served, tag="tb")
    results = {}
    try:
        lr.build_all(served)
        net.start()
        os.environ["AIRLOCK_NET_DNS_UPSTREAM"] = lr.DNS
        for size in sizes:
            cls = type(f"Tb{size}", (harness.DaemonTestCase,),
                       {"daemon_args": ["--tcg-tb-size", str(size)], "daemon_prefix": net.prefix})
            cls.setUpClass()
            try:
                # The first create builds the debian template: not measured.
                first = cls.api.create(image="debian", memory_mb=512, timeout=600,
                                       network={"mode": "allowlist", "allow": [lr.NAME]})
                cls.api.delete(first["id"])
                for name in WORKLOADS:
                    times, hwms = [], []
                    for _ in range(args.runs):
                        t, h = run_workload(cls.api, name, args.rounds)
                        times.append(t)
                        hwms.append(h)
                        print(f"tb-size {size:4d} {name:6s} {t:7.1f} s  VmHWM {h / MIB:6.0f} MiB",
                              file=sys.stderr, flush=True)
                    results[(size, name)] = (statistics.median(times), max(hwms))
            finally:
                cls.tearDownClass()
    finally:
        net.stop()
        shutil.rmtree(served, ignore_errors=True)

    print(f"\nTCG translation cache vs workload (debian, 512 MiB, median of {args.runs}, "
          f"python rounds {args.rounds})")
    print(f"{'tb-size':>9} {'workload':>8} {'time s':>8} {'vs default':>10} {'VmHWM MiB':>10} "
          f"{'vs default':>10} {'over RAM':>9}")
    for size in sizes:
        for name in WORKLOADS:
            t, h = results[(size, name)]
            base = results.get((0, name))
            rt = f"{t / base[0]:.2f}x" if base else "-"
            rh = f"{h / base[1]:.2f}x" if base else "-"
            label = "0 (1 GiB)" if size == 0 else str(size)
            print(f"{label:>9} {name:>8} {t:8.1f} {rt:>10} {h / MIB:10.0f} {rh:>10} "
                  f"{h / MIB - 512:+9.0f}")


if __name__ == "__main__":
    main()

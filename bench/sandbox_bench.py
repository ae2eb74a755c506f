#!/usr/bin/env python3
"""Sandbox benchmark: cold boot, exec round trip, file upload.

Starts its own airlockd (temp data dir, shared image dir) and measures, in one
run, airlock against a baseline taken on the same machine at the same time:

  boot     create -> agent ready (the daemon's boot_ms) and create -> first
           exec result, p50/p90 over N boots; baseline: the same QEMU, kernel,
           initramfs and rootfs started by hand until the agent's "ready" line
           appears on the console (no daemon, no engine).
  exec     round trip of `true` through daemon + guest (p50/p90);
           baseline: fork+exec of `true` on the host.
  upload   MB/s of a 32 MiB file PUT into the guest's /tmp;
           baseline: the same bytes written to a host tmpfs file.

Usage: python3 bench/sandbox_bench.py [--boots 20] [--execs 50]
"""

import argparse
import glob
import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "integration"))
import harness  # noqa: E402


def pct(values, p):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def summary(name, values, unit="ms"):
    return f"{name:<34} p50 {pct(values, 50):8.1f} {unit}   p90 {pct(values, 90):8.1f} {unit}   n={len(values)}"


def raw_qemu_boot(image):
    """Plain QEMU cold boot of the same kernel/initrd/rootfs to the agent's ready line."""
    with tempfile.TemporaryDirectory() as tmp:
        overlay = os.path.join(tmp, "disk.qcow2")
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b",
                        image["rootfs"], overlay], check=True)
        start = time.monotonic()
        p = subprocess.Popen(
            ["qemu-system-x86_64", "-M", "pc", "-accel", "tcg", "-cpu", "max", "-m", "256",
             "-nodefaults", "-no-user-config", "-display", "none", "-serial", "stdio",
             "-no-reboot", "-kernel", image["kernel"], "-initrd", image["initrd"],
             "-append", "console=ttyS0 panic=-1",
             "-drive", f"file={overlay},if=virtio,format=qcow2",
             "-device", "virtio-serial-pci",
             "-chardev", f"socket,id=agent,path={tmp}/agent.sock,server=on,wait=off",
             "-device", "virtserialport,chardev=agent,name=airlock.0"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        elapsed = None
        buf = b""
        while time.monotonic() - start < 60:
            ready, _, _ = select.select([p.stdout], [], [], 1.0)
            if not ready:
                continue
            chunk = os.read(p.stdout.fileno(), 4096)
            if not chunk:
                break
            buf += chunk
            if b"airlock-guest: ready" in buf:
                elapsed = (time.monotonic() - start) * 1000
                break
        p.kill()
        p.wait()
        return elapsed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--boots", type=int, default=20)
    ap.add_argument("--execs", type=int, default=50)
    ap.add_argument("--upload-mb", type=int, default=32)
    args = ap.parse_args()

    harness.DaemonTestCase.setUpClass()
    api = harness.DaemonTestCase.api
    try:
        info = api.call("GET", "/v1/info")
        print(f"airlock {info.get('version')}  accelerator={info['accelerator']} ({info['accelerator_reason']})")
        built = next(i for i in info["images"] if i["name"] == "minimal")
        d = os.path.join(harness.IMAGE_DIR, "minimal", built["key"])
        image = {"kernel": os.path.join(d, "vmlinuz"), "initrd": os.path.join(d, "initrd.img"),
                 "rootfs": os.path.join(d, "rootfs.ext4")}

        boot_ms, first_exec_ms, raw_ms, failures = [], [], [], 0
        for _ in range(args.boots):
            t0 = time.monotonic()
            try:
                sb = api.create(image="minimal")
                _, _, ex = api.exec(sb["id"], argv=["true"])
                first_exec_ms.append((time.monotonic() - t0) * 1000)
                boot_ms.append(sb["boot_ms"])
                api.delete(sb["id"])
                if ex["exit_code"] != 0:
                    failures += 1
            except Exception as e:  # counted, reported
                failures += 1
                print("boot failure:", e)
            r = raw_qemu_boot(image)
            if r is not None:
                raw_ms.append(r)
            print(f"boot {len(boot_ms)}: airlock {boot_ms[-1] if boot_ms else None} ms, plain QEMU {r} ms",
                  file=sys.stderr, flush=True)

        sb = api.create(image="minimal")
        exec_ms = []
        for _ in range(args.execs):
            t0 = time.monotonic()
            api.exec(sb["id"], argv=["true"])
            exec_ms.append((time.monotonic() - t0) * 1000)
        host_ms = []
        for _ in range(args.execs):
            t0 = time.monotonic()
            subprocess.run(["true"])
            host_ms.append((time.monotonic() - t0) * 1000)

        data = os.urandom(args.upload_mb * 1024 * 1024)
        up = []
        for _ in range(3):
            t0 = time.monotonic()
            api.put_file(sb["id"], "/tmp/upload.bin", data)
            up.append(len(data) / (1024 * 1024) / (time.monotonic() - t0))
        host_up = []
        for _ in range(3):
            with tempfile.NamedTemporaryFile(dir="/dev/shm") as f:
                t0 = time.monotonic()
                f.write(data)
                f.flush()
                host_up.append(len(data) / (1024 * 1024) / (time.monotonic() - t0))
        api.delete(sb["id"])

        print()
        print(summary("cold boot: create -> agent ready", boot_ms))
        print(summary("cold boot: create -> exec result", first_exec_ms))
        print(summary("baseline: plain QEMU -> agent ready", raw_ms))
        if raw_ms and boot_ms:
            print(f"{'ratio airlock/plain (p50)':<34} {statistics.median(boot_ms) / statistics.median(raw_ms):.2f}x")
        print(f"{'boots reaching the agent':<34} {len(boot_ms)}/{args.boots}  failures={failures}")
        print(summary("exec round trip of `true`", exec_ms))
        print(summary("baseline: host fork+exec `true`", host_ms))
        print(f"{'ratio (p50)':<34} {statistics.median(exec_ms) / statistics.median(host_ms):.1f}x")
        print(f"{'file upload into guest /tmp':<34} median {statistics.median(up):8.1f} MB/s")
        print(f"{'baseline: host write to tmpfs':<34} median {statistics.median(host_up):8.1f} MB/s")
        print(json.dumps({"boot_ms": boot_ms, "first_exec_ms": first_exec_ms, "raw_qemu_ms": raw_ms,
                          "exec_ms": exec_ms, "upload_mbs": up, "failures": failures}), file=sys.stderr)
        return 1 if failures else 0
    finally:
        harness.DaemonTestCase.tearDownClass()


if __name__ == "__main__":
    sys.exit(main())

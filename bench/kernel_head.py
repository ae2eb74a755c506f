#!/usr/bin/env python3
"""What a restoring QEMU saves by getting the kernel's boot header instead of
the kernel and initrd (src/engine/vmm/kernel_head.h, issue 13's idle PSS).

Plain QEMU, the clone's machine (pc, TCG with the engine's 128 MiB cache,
256 MiB, no devices), paused (-S) as a restore waits: once with the image's
whole kernel and initrd, once with the header alone, interleaved run by
run. Reports, per variant, the median time from exec to the first answer of a QMP command and
the QEMU's PSS/RSS at that moment, and the ratios (header / whole).

Usage: AIRLOCK_IMAGE_DIR=$PWD/build/guest-images python3 bench/kernel_head.py [--runs 15]
"""

import argparse
import glob
import os
import socket
import statistics
import subprocess
import tempfile
import time

SETUP_SECTS, MAGIC = 0x1F1, 0x202
PAYLOAD = 4096  # vmm::kKernelHeadPayload


def header(kernel):
    with open(kernel, "rb") as f:
        data = f.read(64 * 1024 + PAYLOAD)
    assert data[MAGIC:MAGIC + 4] == b"HdrS", f"{kernel} is not a bzImage"
    sects = data[SETUP_SECTS] or 4
    return data[:(sects + 1) * 512 + PAYLOAD]


def start(tmp, kernel, initrd):
    sock = os.path.join(tmp, "qmp.sock")
    if os.path.exists(sock):
        os.unlink(sock)
    argv = ["qemu-system-x86_64", "-machine", "pc", "-accel", "tcg,tb-size=128", "-cpu", "max",
            "-m", "256", "-nodefaults", "-no-user-config", "-display", "none", "-S",
            "-kernel", kernel, "-qmp", f"unix:{sock},server=on,wait=off"]
    if initrd:
        argv += ["-initrd", initrd]
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while True:
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(sock)
            s.recv(4096)  # the greeting: from QMP's own thread, maybe before the machine
            break
        except OSError:
            s.close()
            if proc.poll() is not None:
                raise RuntimeError("QEMU exited")
            time.sleep(0.0005)
    # A command's answer comes from the main loop: the machine (and the
    # kernel QEMU loads for it) is built by then.
    s.sendall(b'{"execute":"qmp_capabilities"}\n{"execute":"query-status"}\n')
    got = b""
    while got.count(b'"return"') < 2:
        got += s.recv(4096)
    ms = (time.monotonic() - t0) * 1000
    mem = {}
    with open(f"/proc/{proc.pid}/smaps_rollup") as f:
        for ln in f:
            k, _, rest = ln.partition(":")
            if k in ("Pss", "Rss"):
                mem[k] = int(rest.split()[0]) / 1024
    s.close()
    proc.kill()
    proc.wait()
    return ms, mem["Pss"], mem["Rss"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    images = os.environ.get("AIRLOCK_IMAGE_DIR", "build/guest-images")
    kdir = sorted(glob.glob(os.path.join(images, "minimal", "*", "vmlinuz")), key=os.path.getmtime)[-1]
    kernel, initrd = kdir, os.path.join(os.path.dirname(kdir), "initrd.img")
    with tempfile.TemporaryDirectory() as tmp:
        head = os.path.join(tmp, "kernel.head")
        with open(head, "wb") as f:
            f.write(header(kernel))
        print(f"kernel {os.path.getsize(kernel)} B + initrd {os.path.getsize(initrd)} B; "
              f"header {os.path.getsize(head)} B; load {os.getloadavg()[0]:.2f}")
        res = {"whole": [], "header": []}
        for _ in range(args.runs):
            res["whole"].append(start(tmp, kernel, initrd))
            res["header"].append(start(tmp, head, None))
        med = {}
        for name, rows in res.items():
            med[name] = [statistics.median(r[i] for r in rows) for i in range(3)]
            print(f"{name:7s} exec -> first QMP answer p50 {med[name][0]:6.1f} ms   "
                  f"PSS {med[name][1]:5.1f} MiB   RSS {med[name][2]:5.1f} MiB   (n={len(rows)})")
        w, h = med["whole"], med["header"]
        print(f"header / whole: start {h[0] / w[0]:.2f}x, PSS {h[1] / w[1]:.2f}x "
              f"({w[1] - h[1]:.1f} MiB less), RSS {h[2] / w[2]:.2f}x; load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

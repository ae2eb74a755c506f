#!/usr/bin/env python3
"""OCI import benchmark (issue 14): time and size to import a generated
~200 MiB multi-layer OCI image through airlockd (POST
/v1/images/{name}/import: upload, verify digests, apply layers, mkfs.ext4,
initramfs), against a baseline measured in the same run on the same layers:
GNU tar extracting them in order into a directory + `mkfs.ext4 -d` (what an
import does at least, without checks, whiteouts or the initramfs).

The image: 4 gzip layers of ~50 MiB each, half incompressible random files
and half text, many small files in the last one, plus a whiteout.

Usage: python3 bench/import_bench.py [--runs 3] [--mib 200]
(AIRLOCK_BIN / AIRLOCK_IMAGE_DIR as for the integration tests: the kernel is
taken from AIRLOCK_IMAGE_DIR/cache/kernel.)
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import harness  # noqa: E402
import oci_build as ob  # noqa: E402


def make_layers(total_mib):
    per = total_mib // 4
    rnd = os.urandom
    layers = []
    for i in range(4):
        entries = [ob.directory(f"l{i}")]
        if i < 3:
            for j in range(per // 2):  # 1 MiB random files (incompressible)
                entries.append(ob.file(f"l{i}/r{j}.bin", rnd(1 << 20)))
            text = b"".join(b"line %d of some text that compresses\n" % k for k in range(28000))
            for j in range(per // 2):
                entries.append(ob.file(f"l{i}/t{j}.txt", text[: 1 << 20]))
        else:
            for j in range(per * 64):  # 16 KiB files: many entries
                entries.append(ob.file(f"l{i}/s{j // 256}/f{j}", rnd(16 << 10)))
            entries.append(ob.whiteout("l0/r0.bin"))
        layers.append(ob.make_layer(entries, compress=True))
    return layers


def baseline(layers, work):
    root = os.path.join(work, "root")
    os.makedirs(root)
    t0 = time.monotonic()
    for i, l in enumerate(layers):
        p = os.path.join(work, f"layer{i}.tar.gz")
        with open(p, "wb") as f:
            f.write(l)
        subprocess.run(["tar", "-xzf", p, "-C", root], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-d", root, os.path.join(work, "b.ext4"), "512M"], check=True,
                   stdout=subprocess.DEVNULL)
    dt = time.monotonic() - t0
    shutil.rmtree(work)
    return dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--mib", type=int, default=200)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="airlock-import-bench-")
    images = os.path.join(tmp, "images")
    os.makedirs(os.path.join(images, "cache"))
    os.symlink(os.path.join(harness.IMAGE_DIR, "cache", "kernel"), os.path.join(images, "cache", "kernel"))
    layers = make_layers(a.mib)
    archive = ob.oci_archive(layers, ob.config(env=["PATH=/bin"]), compressed=True)
    unpacked = sum(len(l) for l in layers)
    print(f"image: {len(layers)} layers, archive {len(archive) / 2**20:.1f} MiB")
    sock = os.path.join(tmp, "d.sock")
    log = open(os.path.join(tmp, "d.log"), "wb")
    d = subprocess.Popen([os.path.join(harness.BIN, "airlockd"), "--data-dir", os.path.join(tmp, "data"),
                          "--socket", sock, "--image-dir", images, "--pool-learn", "0"], stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(300):
            if os.path.exists(sock):
                break
            time.sleep(0.1)
        time.sleep(0.5)
        api = harness.Client(sock)
        imp, base = [], []
        for r in range(a.runs):
            t0 = time.monotonic()
            img = api.call("POST", "/v1/images/bench/import" + ("?replace=true" if r else ""), archive,
                           timeout=1800)
            imp.append(time.monotonic() - t0)
            base.append(baseline(layers, tempfile.mkdtemp(dir=tmp)))
            api.call("POST", "/v1/prune")
        size = img["size_bytes"]
        with open(f"/proc/{d.pid}/status") as f:  # the upload is streamed to a file, never held
            hwm = next(int(l.split()[1]) for l in f if l.startswith("VmHWM:")) * 1024
        mi, mb = statistics.median(imp), statistics.median(base)
        print(f"import (upload+verify+apply+mkfs+initramfs): median {mi:.2f} s over {a.runs} runs "
              f"({', '.join(f'{x:.2f}' for x in imp)})")
        print(f"baseline (tar -xzf + mkfs.ext4 -d):          median {mb:.2f} s ({', '.join(f'{x:.2f}' for x in base)})")
        print(f"ratio import/baseline: {mi / mb:.2f}")
        print(f"image on disk: {size / 2**20:.1f} MiB allocated (rootfs {img['rootfs_bytes'] / 2**20:.0f} MiB "
              f"sparse), compressed layers {unpacked / 2**20:.1f} MiB")
        print(f"airlockd peak RSS (VmHWM) over all runs: {hwm / 2**20:.1f} MiB "
              f"(archive {len(archive) / 2**20:.1f} MiB)")
    finally:
        d.terminate()
        d.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

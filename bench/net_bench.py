#!/usr/bin/env python3
"""Network benchmark (issue 4): airlock-net (libslirp behind the egress
filter) against QEMU's own user-mode networking (`-netdev user`, libslirp
without a filter), measured in the same run, same kernel and initramfs.

    sudo python3 bench/net_bench.py [--image-dir build/guest-images] [--mib 32] [--runs 3] [--connects 40]

Needs root (it creates two network namespaces, `alnb-PID` and
`alnbs-PID`, joined by a veth pair, and removes them). Both QEMUs and the
helper run in the first; the sink servers listen in the second on
198.51.100.1 (a documentation address that exists only there; it cannot be
in the first: the helper never allows its host's own addresses). No traffic
leaves the two namespaces.

The guest is the minimal image's kernel and initramfs with a benchmark
script appended as an extra cpio archive and run as `rdinit` (no agent,
no disk): it loads the virtio modules, configures eth0 10.0.2.15/24 (slirp's
addresses, the same for both back ends) and then
  - throughput: `dd if=/dev/zero bs=64k | nc 198.51.100.1 5001`, MIB MiB per
    run; the host's sink times first byte to EOF;
  - connection setup: CONNECTS sequential `nc 198.51.100.1 5002` (the server
    accepts and closes), each timed in the guest (µs, busybox adjtimex); the same
    loop against a closed guest-local port (refused at once, no network) is
    the baseline of exec/fork cost, reported and subtracted.
Printed: medians over runs, p50/p90 of the setup times, and ratios
airlock-net / qemu-user.
"""

import argparse
import glob
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NS = f"alnb-{os.getpid()}"      # QEMU and the helper
NS_S = f"alnbs-{os.getpid()}"  # the servers (the VM host's own addresses are always denied)
SERVER = "198.51.100.1"

GUEST_SCRIPT = r"""#!/bin/sh
# The initramfs links only a few applets: everything else via `busybox X`.
export PATH=/bin
b=busybox
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
while read -r m; do insmod "/lib/modules/$m.ko" 2>/dev/null; done </lib/modules/load-order
i=0; while [ ! -e /sys/class/net/eth0 ] && [ $i -lt 500 ]; do usleep 10000; i=$((i+1)); done
$b ip link set lo up; $b ip link set eth0 up
$b ip addr add 10.0.2.15/24 dev eth0; $b ip route add default via 10.0.2.2
echo BENCH up
# Microseconds (busybox date has no %N; adjtimex prints tv_sec/tv_usec).
us() { set -- $($b adjtimex | $b sed -n 's/.*tv_sec: *//p;s/.*tv_usec: *//p'); echo $(($1*1000000+$2)); }
r=0
while [ $r -lt @RUNS@ ]; do
  $b dd if=/dev/zero bs=65536 count=@BLOCKS@ 2>/dev/null | $b nc @SERVER@ 5001
  r=$((r+1)); echo BENCH tput-done
done
c=0
while [ $c -lt @CONNECTS@ ]; do
  a=$(us); $b nc -w 5 127.0.0.1 9 </dev/null 2>/dev/null; z=$(us)
  echo "BENCH base $((z-a))"
  a=$(us); $b nc -w 5 @SERVER@ 5002 </dev/null; z=$(us)
  echo "BENCH lat $((z-a))"
  c=$((c+1))
done
echo BENCH end
poweroff -f
"""

SERVER_CODE = r"""
import socket, sys, threading, time
addr = sys.argv[1]
def sink():
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, 5001)); s.listen(8)
    while True:
        c, _ = s.accept()
        n, t0 = 0, None
        while True:
            d = c.recv(1 << 20)
            if not d: break
            if t0 is None: t0 = time.monotonic()
            n += len(d)
        t1 = time.monotonic()
        c.close()
        print(f"TPUT {n} {t1 - (t0 or t1)}", flush=True)
def closer():
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, 5002)); s.listen(64)
    while True:
        c, _ = s.accept(); c.close()
threading.Thread(target=sink, daemon=True).start()
threading.Thread(target=closer, daemon=True).start()
print("ready", flush=True)
while True: time.sleep(3600)
"""


def sh(*a):
    subprocess.run(a, check=True, capture_output=True)


def newest_image(image_dir):
    cands = sorted(glob.glob(os.path.join(image_dir, "minimal", "*", "image.json")), key=os.path.getmtime)
    if not cands:
        sys.exit(f"no minimal image under {image_dir} (build it first)")
    return os.path.dirname(cands[-1])


def make_initrd(image, tmp, args):
    d = os.path.join(tmp, "extra")
    os.makedirs(d)
    script = (GUEST_SCRIPT.replace("@RUNS@", str(args.runs)).replace("@BLOCKS@", str(args.mib * 16))
              .replace("@CONNECTS@", str(args.connects)).replace("@SERVER@", SERVER))
    with open(os.path.join(d, "bench.sh"), "w") as f:
        f.write(script)
    os.chmod(os.path.join(d, "bench.sh"), 0o755)
    extra = subprocess.run("echo bench.sh | cpio -o -H newc", shell=True, cwd=d,
                           capture_output=True, check=True).stdout
    out = os.path.join(tmp, "initrd-bench.img")
    with open(out, "wb") as f, open(os.path.join(image, "initrd.img"), "rb") as base:
        shutil.copyfileobj(base, f)
        f.write(extra)  # the kernel unpacks concatenated cpio archives in order
    return out


def run_vm(image, initrd, netdev, sink, timeout):
    cmd = ["ip", "netns", "exec", NS, "qemu-system-x86_64", "-accel", "tcg", "-m", "256", "-smp", "1",
           "-nographic", "-no-reboot", "-nodefaults", "-serial", "stdio",
           "-kernel", os.path.join(image, "vmlinuz"), "-initrd", initrd,
           "-append", "console=ttyS0 rdinit=/bench.sh quiet panic=-1",
           "-netdev", netdev, "-device", "virtio-net-pci,netdev=n0,mac=52:54:00:12:34:56"]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    lines = [l.strip() for l in p.stdout.splitlines() if l.startswith("BENCH")]
    if "BENCH end" not in lines:
        raise RuntimeError(f"guest did not finish ({netdev}):\n" + p.stdout[-3000:] + p.stderr[-2000:])
    tputs = []
    while len(tputs) < sum(1 for l in lines if l == "BENCH tput-done"):
        n, secs = sink.get(timeout=30)
        tputs.append(n / secs / 2**20 if secs > 0 else 0.0)
    lat = [int(l.split()[2]) / 1e3 for l in lines if l.startswith("BENCH lat ")]
    base = [int(l.split()[2]) / 1e3 for l in lines if l.startswith("BENCH base ")]
    return {"tput_mib_s": tputs, "setup_ms": lat, "base_ms": base, "wall_s": time.time() - t0}


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--image-dir", default=os.environ.get("AIRLOCK_IMAGE_DIR",
                                                          os.path.join(ROOT, "build", "guest-images")))
    ap.add_argument("--helper", default=os.path.join(ROOT, "build", "bin", "airlock-net"))
    ap.add_argument("--mib", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--connects", type=int, default=40)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (ip netns add)")
    image = newest_image(args.image_dir)
    tmp = tempfile.mkdtemp(prefix="airlock-netbench-")
    procs = []
    try:
        for ns in (NS, NS_S):
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        # A veth pair created inside NS with its peer in NS_S: never in the host's namespace.
        sh("ip", "-n", NS, "link", "add", "vb", "type", "veth", "peer", "name", "vs", "netns", NS_S)
        sh("ip", "-n", NS, "addr", "add", "192.0.2.2/24", "dev", "vb")
        sh("ip", "-n", NS, "link", "set", "vb", "up")
        sh("ip", "-n", NS, "route", "add", "default", "via", "192.0.2.1")
        sh("ip", "-n", NS_S, "addr", "add", "192.0.2.1/24", "dev", "vs")
        sh("ip", "-n", NS_S, "addr", "add", SERVER + "/32", "dev", "vs")
        sh("ip", "-n", NS_S, "link", "set", "vs", "up")
        srv = subprocess.Popen(["ip", "netns", "exec", NS_S, sys.executable, "-c", SERVER_CODE, SERVER],
                               stdout=subprocess.PIPE, text=True)
        procs.append(srv)
        if srv.stdout.readline().strip() != "ready":
            raise RuntimeError("sink server did not start")
        import queue
        sink = queue.Queue()

        def reader():
            for line in srv.stdout:
                if line.startswith("TPUT "):
                    _, n, secs = line.split()
                    sink.put((int(n), float(secs)))
        threading.Thread(target=reader, daemon=True).start()
        initrd = make_initrd(image, tmp, args)
        timeout = 120 + args.runs * args.mib * 3 + args.connects * 3
        results = {}
        # Alternate the back ends so drift in machine load hits both alike.
        for rnd in range(2):
            for backend in ("qemu-user", "airlock-net"):
                if backend == "qemu-user":
                    netdev = "user,id=n0"
                else:
                    sock, ctl = os.path.join(tmp, f"net{rnd}.sock"), os.path.join(tmp, f"ctl{rnd}.sock")
                    h = subprocess.Popen(["ip", "netns", "exec", NS, args.helper, "--qemu-socket", sock,
                                          "--control-socket", ctl, "--events", os.path.join(tmp, "events.jsonl"),
                                          "--policy", json.dumps({"mode": "allowlist", "allow": [SERVER + "/32"]})],
                                         stdout=subprocess.PIPE, stderr=open(os.path.join(tmp, "helper.log"), "a"),
                                         text=True)
                    procs.append(h)
                    if not json.loads(h.stdout.readline() or "{}").get("ready"):
                        raise RuntimeError("airlock-net did not start: " + open(os.path.join(tmp, "helper.log")).read())
                    netdev = f"stream,id=n0,server=off,addr.type=unix,addr.path={sock}"
                r = run_vm(image, initrd, netdev, sink, timeout)
                agg = results.setdefault(backend, {"tput_mib_s": [], "setup_ms": [], "base_ms": []})
                for k in agg:
                    agg[k] += r[k]
                print(f"round {rnd} {backend}: tput {['%.1f' % x for x in r['tput_mib_s']]} MiB/s, "
                      f"setup p50 {pct(r['setup_ms'], 50):.1f} ms", file=sys.stderr)
        summary = {}
        for b, agg in results.items():
            net = [l - bs for l, bs in zip(agg["setup_ms"], agg["base_ms"])]
            summary[b] = {"tput_median_mib_s": statistics.median(agg["tput_mib_s"]),
                          "setup_p50_ms": pct(agg["setup_ms"], 50), "setup_p90_ms": pct(agg["setup_ms"], 90),
                          "exec_baseline_p50_ms": pct(agg["base_ms"], 50),
                          "setup_net_p50_ms": pct(net, 50), "setup_net_p90_ms": pct(net, 90),
                          "samples": {"tput": len(agg["tput_mib_s"]), "setup": len(agg["setup_ms"])}}
        a, q = summary["airlock-net"], summary["qemu-user"]
        summary["ratio_airlock_over_qemu_user"] = {
            "tput": a["tput_median_mib_s"] / q["tput_median_mib_s"],
            "setup_p50": a["setup_p50_ms"] / q["setup_p50_ms"],
            "setup_p90": a["setup_p90_ms"] / q["setup_p90_ms"]}
        summary["config"] = {"mib_per_run": args.mib, "runs_per_round": args.runs, "rounds": 2,
                             "connects_per_round": args.connects, "image": image, "accel": "tcg",
                             "kernel": open(os.path.join(image, "image.json")).read() and
                             json.load(open(os.path.join(image, "image.json"))).get("kernel_release")}
        print(json.dumps(summary, indent=2))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for ns in (NS, NS_S):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Start-up and answer-time benchmark (issues 3 and 13): how fast a sandbox is
ready to run code, answers an exec and goes away, against gVisor in the same
run.

Peers and airlock paths are interleaved run by run (the host's load moves
both alike); every figure is a median (p50) with p90/p99, and ratios are
taken inside the run. Minimal image, 1 vCPU, 256 MiB unless said otherwise.

  runsc true     `runsc --network=none do true` (gVisor, Debian package runsc)
  runsc python   `runsc --network=none do python3 -c 'print(1)'`
  cli pool hit   `airlock run -- true`, whole CLI process, pool hits only
  create (pool)  POST /v1/sandboxes answered from the pool (client-timed over
                 the unix socket, and the engine's own share from its trace)
  exec true      POST .../exec of `true` in a warm sandbox, round trip
  guest spawn    the guest's own fork+exec+wait of the same /bin/true, timed
                 inside the same sandbox (a loop of N spawns minus a loop of N
                 shell built-ins, divided by N)
  delete         DELETE /v1/sandboxes/{id} until the answer
  cli overhead   `airlock ls` and `airlock run -- true` against a stand-in
                 socket server: process start to the first byte of its first
                 connection, last answer sent to exit, and the process's CPU
                 (user + system, from wait4); baseline: spawn and wait of
                 /bin/true, same loop (section "cli")
  networked      `airlock run --network allowlist --allow 198.51.100.1/32 -- true`
                 (clone; and "networked pool hit": a pool of members with a NIC)
  clone          create -> exec result, daemon with templates and no pool
  cold           the same, daemon with --no-templates (plus plain QEMU boot)
  refill         a pool of 4 drained by one client (create, exec `true`,
                 delete, four times): that client's cycle, and the time until
                 the pool is full again per member (the first starts on the
                 pool's next tick, <= 500 ms)
  burst          20 creates at once against a pool of 4; 50 concurrent creates
  idle PSS       --idle N minimal sandboxes alive at once, PSS per QEMU
  debian python  `airlock run --image debian -- python3 -c 'print(1)'` (only
                 if the debian image is built)

The daemons run with AIRLOCK_TRACE=1: the engine logs each create, exec and
delete phase by phase (src/engine/trace.h), and the breakdown printed at the
end is the median of each phase.

Usage: sudo AIRLOCK_IMAGE_DIR=... python3 bench/start.py [--runs 30] [--py-runs 5]
           [--cold-runs 5] [--idle 0] [--skip pool,cli,clone,net,netpool,cold,refill,burst,debian]
"""

import argparse
import concurrent.futures
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
sys.path.insert(0, HERE)
import harness  # noqa: E402
from sandbox_bench import raw_qemu_boot  # noqa: E402

SPEC = {"image": "minimal", "cpus": 1, "memory_mb": 256}
CLI = os.path.join(harness.BIN, "airlock")
SPAWNS = 100


def pct(values, p):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))] if s else float("nan")


def line(name, values, unit="ms"):
    return (f"  {name:<34} p50 {pct(values, 50):9.2f} {unit}  p90 {pct(values, 90):9.2f}  "
            f"p99 {pct(values, 99):9.2f}  n={len(values)}")


def load():
    return "load average " + " ".join(open("/proc/loadavg").read().split()[:3])


def ms_since(t0):
    return (time.monotonic() - t0) * 1000


DAEMON_ARGS = []  # --daemon-arg: appended to every daemon's flags (A/B runs)


def daemon(name, args, env=None):
    old = dict(os.environ)
    os.environ.update(env or {})
    os.environ["AIRLOCK_TRACE"] = "1"
    args = list(args) + DAEMON_ARGS
    cls = type(name, (harness.DaemonTestCase,), {"daemon_args": args})
    try:
        cls.setUpClass()
    finally:
        os.environ.clear()
        os.environ.update(old)
    return cls


def traces(d):
    """{op: [{phase: us}]} from the daemon's trace lines (src/engine/trace.h)."""
    out = {}
    d.log.flush()
    with open(os.path.join(d.tmp, "airlockd.log"), errors="replace") as f:
        for ln in f:
            m = re.search(r"trace (\w+) (\S+)((?: \w+=-?\d+)+)", ln)
            if m:
                out.setdefault(m.group(1), []).append(
                    {k: int(v) for k, v in re.findall(r"(\w+)=(-?\d+)", m.group(3))} | {"id": m.group(2)})
    return out


def wait_pool(api, n, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if sum(s["ready"] for s in api.call("GET", "/v1/pool")) >= n:
            return True
        time.sleep(0.05)
    return False


def pool_hits(api):
    return sum(s["hits"] for s in api.call("GET", "/v1/pool"))


def runsc(argv):
    t0 = time.monotonic()
    p = subprocess.run(["runsc", "--network=none", "do"] + argv, capture_output=True)
    return ms_since(t0) if p.returncode == 0 else None


def cli(d, args):
    t0 = time.monotonic()
    p = subprocess.run([CLI, "--socket", d.sock] + args, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"airlock {args}: {p.returncode} {p.stderr}")
    return ms_since(t0), p.stdout


def create_exec(api, spec=SPEC):
    t0 = time.monotonic()
    sb = api.create(**spec)
    _, _, ex = api.exec(sb["id"], argv=["true"])
    ms = ms_since(t0)
    api.delete(sb["id"], wait=False)
    if ex.get("exit_code") != 0:
        raise RuntimeError(f"exec failed: {ex}")
    return ms, sb["start"]


class StandIn:
    """A unix-socket server answering each request as airlockd would in
    shape (GET /v1/sandboxes and /v1/info: [] / {}; POST /v1/sandboxes: an
    id; POST .../exec: a start and an exit event; DELETE: 204), so the CLI's
    own work is what is timed. Records when the first request byte of a CLI
    run arrived (its first connection), when its last answer went, and how
    many connections the run made."""

    def __init__(self, path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.bind(path)
        self.sock.listen(8)
        self.reset()
        threading.Thread(target=self.serve, daemon=True).start()

    def reset(self):
        self.first_byte = self.answered = None
        self.conns = 0

    @staticmethod
    def answer(head):
        method, target = (head.split(b"\r\n", 1)[0].split(b" ") + [b"", b""])[:2]
        if method == b"DELETE":
            return b"HTTP/1.1 204 No Content\r\n\r\n"
        if method == b"POST" and target.endswith(b"/exec"):
            ctype, body = b"application/x-ndjson", (b'{"type":"start","exec_id":"ex-1"}\n'
                                                   b'{"type":"exit","exit_code":0}\n')
        elif method == b"POST":
            ctype, body = b"application/json", b'{"id":"sb-standin"}'
        else:
            ctype, body = b"application/json", b"{}" if target == b"/v1/info" else b"[]"
        return (b"HTTP/1.1 200 OK\r\nContent-Type: " + ctype + b"\r\nContent-Length: "
                + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)

    def serve(self):
        while True:
            c, _ = self.sock.accept()
            try:
                data = c.recv(65536)
                if self.first_byte is None and data:
                    self.first_byte = time.monotonic()
                self.conns += 1
                while data and b"\r\n\r\n" not in data:
                    more = c.recv(65536)
                    if not more:
                        break
                    data += more
                head, _, body = data.partition(b"\r\n\r\n")
                m = re.search(rb"(?i)content-length: *(\d+)", head)
                while m and len(body) < int(m.group(1)):
                    more = c.recv(65536)
                    if not more:
                        break
                    body += more
                if data:
                    # Stamped before the send: the CLI may read the answer
                    # and exit before this thread runs again.
                    self.answered = time.monotonic()
                    c.sendall(self.answer(head))
            except OSError:
                pass
            finally:
                c.close()


def spawn_timed(argv):
    """Wall ms from spawn to reap, and the child's CPU ms (user + system)."""
    t0 = time.monotonic()
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    _, status, ru = os.wait4(p.pid, 0)
    t1 = time.monotonic()
    p.returncode = os.waitstatus_to_exitcode(status)
    return t0, t1, p.returncode, (ru.ru_utime + ru.ru_stime) * 1000


def cli_overhead(runs):
    """The CLI's own cost against the stand-in: {row: [ms]} for `airlock ls`
    and `airlock run -- true`, and the baseline spawn of /bin/true."""
    tmp = tempfile.mkdtemp(prefix="airlock-bench-")
    out = {k: [] for k in ("cli to socket", "cli exit", "cli cpu (ls)", "cli run to socket",
                           "cli run exit", "cli cpu (run)", "spawn /bin/true",
                           "cpu /bin/true")}
    conns = {}
    try:
        srv = StandIn(os.path.join(tmp, "s.sock"))
        for _ in range(runs):
            # The baseline: the same spawn and wait of a process that does
            # nothing (/bin/true), so what is left is the CLI's own.
            t0, t1, _, cpu = spawn_timed(["/bin/true"])
            out["spawn /bin/true"].append((t1 - t0) * 1000)
            out["cpu /bin/true"].append(cpu)
            for name, args in (("", ["ls"]), (" run", ["run", "--", "true"])):
                srv.reset()
                t0, t1, rc, cpu = spawn_timed([CLI, "--socket", srv.path] + args)
                if rc == 0 and srv.first_byte and srv.answered:
                    out[f"cli{name} to socket"].append((srv.first_byte - t0) * 1000)
                    out[f"cli{name} exit"].append((t1 - srv.answered) * 1000)
                    out[f"cli cpu ({args[0]})"].append(cpu)
                    conns[args[0]] = srv.conns
        print(f"cli connections per call: {conns}", flush=True)
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def guest_spawn_us(d, sid):
    """Per-spawn µs of /bin/true inside sandbox `sid`, from the guest's own run_us."""
    loops = {}
    for name, body in (("true", "/bin/true"), ("builtin", ":")):
        script = f"i=0; while [ $i -lt {SPAWNS} ]; do {body}; i=$((i+1)); done"
        d.api.exec(sid, argv=["sh", "-c", script])
        loops[name] = traces(d)["exec"][-1]["run_us"]
    return (loops["true"] - loops["builtin"]) / SPAWNS


def phase_table(title, recs, skip=("id",)):
    if not recs:
        return
    keys = [k for k in recs[0] if k not in skip]
    print(f"  {title} (median µs per phase, n={len(recs)}): " +
          ", ".join(f"{k} {statistics.median(r.get(k, 0) for r in recs):.0f}" for k in keys))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--py-runs", type=int, default=5)
    ap.add_argument("--cold-runs", type=int, default=5)
    ap.add_argument("--net-runs", type=int, default=10)
    ap.add_argument("--idle", type=int, default=0)
    ap.add_argument("--pool", type=int, default=2)
    ap.add_argument("--daemon-arg", action="append", default=[],
                    help="an extra airlockd flag for every daemon, e.g. --daemon-arg=--pool-cpu-weight=100")
    ap.add_argument("--skip", default="", help="comma-separated sections: pool, cli, clone, net, "
                    "netpool, cold, refill, burst, debian")
    args = ap.parse_args()
    DAEMON_ARGS.extend(args.daemon_arg)
    skip = set(filter(None, args.skip.split(",")))
    R, fails = {}, {}
    have_runsc = shutil.which("runsc") is not None
    if not have_runsc:
        print("runsc not installed (apt-get install runsc): peers skipped")
    print(f"start: {load()}", flush=True)

    # --- pool hits, interleaved with runsc ----------------------------------
    T_pool = {}
    if "pool" not in skip:
        pooled = daemon("Pooled", ["--pool", f"minimal={args.pool}"])
        try:
            info = pooled.api.call("GET", "/v1/info")
            print(f"accelerator={info['accelerator']} ({info['accelerator_reason']})", flush=True)
            for k in ("runsc true", "runsc python", "cli pool hit", "create (pool)", "exec true",
                      "delete", "cli misses"):
                R[k] = []
            for i in range(args.runs):
                if have_runsc:
                    ms = runsc(["true"])
                    if ms:
                        R["runsc true"].append(ms)
                    if i < args.py_runs:
                        ms = runsc(["python3", "-c", "print(1)"])
                        if ms:
                            R["runsc python"].append(ms)
                wait_pool(pooled.api, 1)
                h0 = pool_hits(pooled.api)
                ms, _ = cli(pooled, ["run", "--", "true"])
                (R["cli pool hit"] if pool_hits(pooled.api) > h0 else R["cli misses"]).append(ms)
                wait_pool(pooled.api, 1)
                t0 = time.monotonic()
                sb = pooled.api.create(**SPEC)
                ms = ms_since(t0)
                if sb["start"] == "pool":
                    R["create (pool)"].append(ms)
                for _ in range(3):
                    t0 = time.monotonic()
                    pooled.api.exec(sb["id"], argv=["true"])
                    R["exec true"].append(ms_since(t0))
                t0 = time.monotonic()
                pooled.api.delete(sb["id"], wait=False)
                R["delete"].append(ms_since(t0))
                print(f"pool {i + 1}/{args.runs}", file=sys.stderr, flush=True)
            # The guest's own spawn cost, in one warm sandbox, next to its execs:
            # measured once the hand-out's refill is done, so that this pair
            # is the exec path itself; the rows above include execs that
            # competed with a refill's clone for the 2 cores.
            wait_pool(pooled.api, 1)
            sb = pooled.api.create(**SPEC)
            wait_pool(pooled.api, args.pool)
            time.sleep(1)  # the new member's warm-up exec and its settling
            R["exec true (same sb)"], R["guest spawn"] = [], []
            for _ in range(5):
                for _ in range(5):
                    t0 = time.monotonic()
                    pooled.api.exec(sb["id"], argv=["true"])
                    R["exec true (same sb)"].append(ms_since(t0))
                R["guest spawn"].append(guest_spawn_us(pooled, sb["id"]) / 1000)
            pooled.api.delete(sb["id"], wait=False)
            T_pool = traces(pooled)
        finally:
            pooled.tearDownClass()
        print(f"after pool runs: {load()}", flush=True)

    if "cli" not in skip:
        R.update(cli_overhead(args.runs))

    # --- clone and networked runs, interleaved with runsc --------------------
    if not {"clone", "net"} <= skip:
        warm = daemon("Warm", [])
        try:
            warm.api.delete(warm.api.create(**SPEC)["id"], wait=False)  # builds the shape's template
            R["clone"], R["runsc true (clone runs)"], R["networked run"] = [], [], []
            for i in range(args.runs if "clone" not in skip else 0):
                if have_runsc and (ms := runsc(["true"])):
                    R["runsc true (clone runs)"].append(ms)
                R["clone"].append(create_exec(warm.api)[0])
            for i in range(args.net_runs if "net" not in skip else 0):
                R["networked run"].append(cli(warm, ["run", "--network", "allowlist", "--allow",
                                                     "198.51.100.1/32", "--", "true"])[0])
        finally:
            warm.tearDownClass()
        print(f"after clone runs: {load()}", flush=True)

    # --- networked pool hits (members with a NIC under deny-everything) -----
    if "netpool" not in skip:
        npool = daemon("NetPool", [])
        try:
            npool.api.call("PUT", "/v1/pool", {"image": "minimal", "size": args.pool,
                                               "network": True})
            R["networked pool hit"], R["networked misses"] = [], []
            for i in range(args.net_runs):
                wait_pool(npool.api, 1)
                h0 = pool_hits(npool.api)
                ms, _ = cli(npool, ["run", "--network", "allowlist", "--allow",
                                    "198.51.100.1/32", "--", "true"])
                (R["networked pool hit"] if pool_hits(npool.api) > h0
                 else R["networked misses"]).append(ms)
        finally:
            npool.tearDownClass()
        print(f"after networked pool runs: {load()}", flush=True)

    # --- cold boot and plain QEMU --------------------------------------------
    if "cold" not in skip:
        cold = daemon("Cold", ["--no-templates"])
        try:
            built = next(i for i in cold.api.call("GET", "/v1/info")["images"] if i["name"] == "minimal")
            dd = os.path.join(harness.IMAGE_DIR, "minimal", built["key"])
            image = {"kernel": os.path.join(dd, "vmlinuz"), "initrd": os.path.join(dd, "initrd.img"),
                     "rootfs": os.path.join(dd, "rootfs.ext4")}
            R["cold"], R["plain qemu boot"] = [], []
            for _ in range(args.cold_runs):
                R["cold"].append(create_exec(cold.api)[0])
                if (r := raw_qemu_boot(image)) is not None:
                    R["plain qemu boot"].append(r)
        finally:
            cold.tearDownClass()

    # --- refill: a drained pool of 4 against one client's consumption -------
    if "refill" not in skip:
        f = daemon("Refill", ["--pool", "minimal=4"])
        try:
            R["client cycle (pool hit)"], R["refill per member"] = [], []
            for _ in range(max(1, args.runs // 5)):
                wait_pool(f.api, 4)
                for _ in range(4):  # one client: create, exec, delete, again
                    t0 = time.monotonic()
                    sb = f.api.create(**SPEC)
                    f.api.exec(sb["id"], argv=["true"])
                    f.api.delete(sb["id"], wait=False)
                    R["client cycle (pool hit)"].append(ms_since(t0))
                t0 = time.monotonic()
                wait_pool(f.api, 4)
                R["refill per member"].append(ms_since(t0) / 4)
        finally:
            f.tearDownClass()

    # --- burst against a pool of 4, 50 concurrent ---------------------------
    if "burst" not in skip:
        b = daemon("Burst", ["--pool", "minimal=4"])
        try:
            def one(_):
                t0 = time.monotonic()
                sb = b.api.create(**SPEC)
                return ms_since(t0), sb
            for name, n in (("burst 20 vs pool 4", 20), ("50 concurrent", 50)):
                wait_pool(b.api, 4)
                R[name], fails[name], kinds = [], 0, {}
                with concurrent.futures.ThreadPoolExecutor(n) as ex:
                    for fut in [ex.submit(one, i) for i in range(n)]:
                        try:
                            ms, sb = fut.result()
                            R[name].append(ms)
                            kinds[sb["start"]] = kinds.get(sb["start"], 0) + 1
                            b.api.delete(sb["id"], wait=False)
                        except Exception as e:
                            fails[name] += 1
                            print(f"{name} failure: {e}", file=sys.stderr)
                print(f"{name}: starts {kinds}, failures {fails[name]}", flush=True)
        finally:
            b.tearDownClass()

    # --- idle PSS -------------------------------------------------------------
    pss_line = None
    if args.idle:
        w = daemon("Idle", [])
        try:
            # 256 MiB disks: the daemon admits disk_mb against the data dir's
            # free space, and 100 x the default 1 GiB is more than this host has.
            ids = [w.api.create(**SPEC, disk_mb=256, timeout=3600)["id"] for _ in range(args.idle)]
            time.sleep(10)
            pss = rss = nq = 0
            for pid in harness.qemu_pids_for(w.data_dir):
                with open(f"/proc/{pid}/smaps_rollup") as f:
                    for ln in f:
                        if ln.startswith("Pss:"):
                            pss += int(ln.split()[1])
                        elif ln.startswith("Rss:"):
                            rss += int(ln.split()[1])
                nq += 1
            alive = sum(1 for s in ids if w.api.exec(s, argv=["true"])[2]["exit_code"] == 0)
            for s in ids:
                w.api.delete(s, wait=False)
            pss_line = (f"  idle sandboxes alive {alive}/{args.idle}: PSS per QEMU "
                        f"{pss / max(nq, 1) / 1024:.1f} MiB (RSS {rss / max(nq, 1) / 1024:.1f} MiB, n={nq})")
        except Exception as e:  # keep the figures measured so far
            fails["idle"] = 1
            print(f"idle PSS failed: {e}", file=sys.stderr, flush=True)
        finally:
            w.tearDownClass()

    # --- debian python ----------------------------------------------------------
    if "debian" not in skip:
        d = daemon("Debian", ["--pool", "debian=1"])
        try:
            info = d.api.call("GET", "/v1/info")
            built = any(i["name"] == "debian" for i in info["images"])
            if built or "debian" in info.get("recipes", []):
                if not built:  # the pool builds it (an agent change is a new image key)
                    print("debian image not built for this agent: the pool builds it first", flush=True)
                R["debian python run"] = []
                for _ in range(args.py_runs):
                    wait_pool(d.api, 1, timeout=900)
                    R["debian python run"].append(
                        cli(d, ["run", "--image", "debian", "--", "python3", "-c", "print(1)"])[0])
            else:
                print("no debian image or recipe: debian python skipped")
        except Exception as e:  # keep the figures measured so far
            fails["debian python"] = 1
            print(f"debian python failed: {e}", file=sys.stderr, flush=True)
        finally:
            d.tearDownClass()

    print(f"end: {load()}")
    print()
    for k, v in R.items():
        if v:
            print(line(k, v))
    if pss_line:
        print(pss_line)
    med = {k: statistics.median(v) for k, v in R.items() if v}

    def ratio(a, b, label):
        if a in med and b in med:
            print(f"  {label:<34} {med[a] / med[b]:.2f}x")
    print("ratios (p50):")
    ratio("cli pool hit", "runsc true", "cli pool hit / runsc true")
    ratio("clone", "runsc true (clone runs)", "clone / runsc true")
    ratio("networked pool hit", "runsc true", "networked pool hit / runsc true")
    ratio("exec true (same sb)", "guest spawn", "exec true / guest spawn")
    ratio("refill per member", "client cycle (pool hit)", "refill / one client's cycle")
    ratio("debian python run", "runsc python", "debian python / runsc python")
    for a, b in (("cli to socket", "spawn /bin/true"), ("cli run to socket", "spawn /bin/true"),
                 ("cli cpu (ls)", "cpu /bin/true"), ("cli cpu (run)", "cpu /bin/true")):
        if a in med and b in med:
            print(f"  {a + ' - ' + b:<34} {med[a] - med[b]:.2f} ms")
    print(f"  cli misses (not counted): {len(R.get('cli misses', []))}; failures: {fails}")
    print("breakdown (engine trace, AIRLOCK_TRACE=1):")
    pool_creates = [t for t in T_pool.get("create", []) if "take" in t]
    phase_table("pool-hit create", pool_creates)
    phase_table("exec", T_pool.get("exec", []))
    phase_table("delete", T_pool.get("delete", []))
    return 1 if any(fails.values()) else 0


if __name__ == "__main__":
    sys.exit(main())

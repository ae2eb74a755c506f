"""End to end through the real daemon: one real VM (minimal image) per class."""

import base64
import hashlib
import json
import os
import socket
import threading
import time
import unittest

from harness import ApiError, DaemonTestCase, UnixHTTPConnection


class ExecTest(DaemonTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.sb = cls.api.create(image="minimal", timeout=900, env={"SANDBOX_VAR": "from-create"})
        cls.sid = cls.sb["id"]

    def test_sandbox_is_running_and_listed(self):
        self.assertEqual(self.sb["state"], "running")
        self.assertIn(self.sb["accel"], ("kvm", "tcg"))
        ids = [s["id"] for s in self.api.call("GET", "/v1/sandboxes")]
        self.assertIn(self.sid, ids)
        self.assertEqual(self.api.call("GET", f"/v1/sandboxes/{self.sid}")["id"], self.sid)

    def test_binary_output_all_256_byte_values(self):
        # printf with octal escapes for every byte value, written by the guest's shell.
        script = "printf '" + "".join("\\%03o" % b for b in range(256)) + "'"
        out, err, ex = self.api.exec(self.sid, argv=["sh", "-c", script])
        self.assertEqual(ex["exit_code"], 0, err)
        self.assertEqual(out, bytes(range(256)))

    def test_stdout_and_stderr_kept_apart_and_exit_code(self):
        out, err, ex = self.api.exec(self.sid, cmd="echo out; echo err >&2; exit 7")
        self.assertEqual(out, b"out\n")
        self.assertEqual(err, b"err\n")
        self.assertEqual(ex["exit_code"], 7)

    def test_one_mib_of_stdout(self):
        out, _, ex = self.api.exec(self.sid, argv=["head", "-c", "1048576", "/dev/urandom"])
        self.assertEqual(ex["exit_code"], 0)
        self.assertEqual(len(out), 1048576)
        self.assertEqual(ex["stdout_bytes"], 1048576)

    def test_stdin(self):
        data = os.urandom(100_000)
        out, _, ex = self.api.exec(self.sid, argv=["cat"], stdin_b64=base64.b64encode(data).decode())
        self.assertEqual(ex["exit_code"], 0)
        self.assertEqual(out, data)
        out, _, _ = self.api.exec(self.sid, argv=["wc", "-c"], stdin="hello")
        self.assertEqual(out.strip(), b"5")

    def test_env_merges_create_env(self):
        out, _, _ = self.api.exec(self.sid, cmd='echo "$SANDBOX_VAR $EXEC_VAR"', env={"EXEC_VAR": "x y"})
        self.assertEqual(out, b"from-create x y\n")

    def test_cwd(self):
        out, _, _ = self.api.exec(self.sid, argv=["pwd"], cwd="/tmp")
        self.assertEqual(out, b"/tmp\n")
        with self.assertRaises(ApiError):
            self.api.exec(self.sid, argv=["pwd"], cwd="/does/not/exist")

    def test_non_root_user(self):
        out, _, _ = self.api.exec(self.sid, argv=["id", "-u"], user="user")
        self.assertEqual(out, b"1000\n")
        out, _, _ = self.api.exec(self.sid, argv=["id", "-u"], user="1000")
        self.assertEqual(out, b"1000\n")
        out, _, ex = self.api.exec(self.sid, cmd="touch /root/x", user="user")
        self.assertNotEqual(ex["exit_code"], 0)

    def test_concurrent_execs(self):
        results = {}

        def run(i):
            results[i] = self.api.exec(self.sid, cmd=f"sleep 1; echo {i}")

        threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
        start = time.time()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i in range(4):
            self.assertEqual(results[i][0], f"{i}\n".encode())
        # Run at once, not one after another (4 x 1 s sleeps).
        self.assertLess(time.time() - start, 3.9)

    def test_exec_timeout_kills_process_tree(self):
        out, _, ex = self.api.exec(self.sid, cmd="(sleep 300 &) ; sleep 300", timeout=1)
        self.assertTrue(ex["timed_out"])
        self.assertIsNone(ex["exit_code"])
        out, _, _ = self.api.exec(self.sid, cmd="ps | grep -c '[s]leep 300' || true")
        self.assertEqual(out.strip(), b"0")

    def test_unknown_binary_is_an_error_naming_it(self):
        with self.assertRaises(ApiError) as cm:
            self.api.exec(self.sid, argv=["/no/such/binary"])
        self.assertIn("/no/such/binary", str(cm.exception))

    def test_files_round_trip_10_mib_binary(self):
        data = os.urandom(10 * 1024 * 1024)
        self.api.put_file(self.sid, "/tmp/big.bin", data)
        out, _, _ = self.api.exec(self.sid, argv=["sha256sum", "/tmp/big.bin"])
        self.assertEqual(out.split()[0].decode(), hashlib.sha256(data).hexdigest())
        self.assertEqual(self.api.get_file(self.sid, "/tmp/big.bin"), data)

    def test_file_ops(self):
        self.api.call("POST", f"/v1/sandboxes/{self.sid}/files/mkdir", {"path": "/tmp/d/e", "parents": True})
        self.api.put_file(self.sid, "/tmp/d/e/f.txt", b"abc")
        st = self.api.call("GET", f"/v1/sandboxes/{self.sid}/files/stat?path=/tmp/d/e/f.txt")
        self.assertEqual(st["size"], 3)
        self.assertEqual(st["type"], "file")
        names = [e["name"] for e in self.api.call("GET", f"/v1/sandboxes/{self.sid}/files/list?path=/tmp/d/e")["entries"]]
        self.assertEqual(names, ["f.txt"])
        self.api.call("DELETE", f"/v1/sandboxes/{self.sid}/files?path=/tmp/d&recursive=true")
        with self.assertRaises(ApiError) as cm:
            self.api.get_file(self.sid, "/tmp/d/e/f.txt")
        self.assertEqual(cm.exception.status, 404)

    def test_move_and_list_with_depth(self):
        base = f"/v1/sandboxes/{self.sid}/files"
        self.api.put_file(self.sid, "/tmp/mv/a/one.txt", b"1")
        self.api.exec(self.sid, argv=["ln", "-s", "/tmp/mv/a", "/tmp/mv/link"])
        moved = self.api.call("POST", f"{base}/move", {"from": "/tmp/mv/a/one.txt", "to": "/tmp/mv/b/c/two.txt"})
        self.assertEqual((moved["path"], moved["name"], moved["size"]), ("/tmp/mv/b/c/two.txt", "two.txt", 1))
        self.assertEqual((moved["owner"], moved["group"]), ("root", "root"))
        deep = self.api.call("GET", f"{base}/list?path=/tmp/mv&depth=3")["entries"]
        self.assertEqual([e["path"] for e in deep],
                         ["/tmp/mv/a", "/tmp/mv/b", "/tmp/mv/b/c", "/tmp/mv/b/c/two.txt", "/tmp/mv/link"])
        self.assertEqual((deep[-1]["target"], deep[-1]["target_type"]), ("/tmp/mv/a", "dir"))
        self.assertEqual(len(self.api.call("GET", f"{base}/list?path=/tmp/mv")["entries"]), 3)
        with self.assertRaises(ApiError) as cm:
            self.api.call("POST", f"{base}/move", {"from": "/tmp/mv/nope", "to": "/tmp/mv/x"})
        self.assertEqual(cm.exception.status, 404)
        for body, field in (({"from": "/tmp/mv/b", "to": "relative"}, "to"),
                            ({"from": "/tmp/mv/b"}, "to"), ({"from": "/tmp/mv/b", "to": "/x", "y": 1}, "y")):
            with self.assertRaises(ApiError) as cm:
                self.api.call("POST", f"{base}/move", body)
            self.assertEqual((cm.exception.status, cm.exception.field), (400, field))
        with self.assertRaises(ApiError) as cm:
            self.api.call("GET", f"{base}/list?path=/tmp/mv&depth=0")
        self.assertEqual((cm.exception.status, cm.exception.field), (400, "depth"))

    def test_bad_exec_input(self):
        for body, field in ((dict(argv="ls"), "argv"), (dict(argv=[]), "argv"),
                            (dict(argv=["ls"], bogus=1), "bogus"),
                            (dict(argv=["ls"], timeout=-1), "timeout"),
                            (dict(argv=["ls"], cmd="ls"), "argv")):
            with self.assertRaises(ApiError, msg=str(body)) as cm:
                self.api.exec(self.sid, **body)
            self.assertEqual(cm.exception.status, 400, cm.exception.body)
            self.assertEqual(cm.exception.field, field, cm.exception.body)
        # The sandbox still works after bad input.
        self.assertEqual(self.api.exec(self.sid, argv=["true"])[2]["exit_code"], 0)

    def test_grown_root_fs_zeroes_nothing_in_the_background(self):
        # The sandbox's disk is larger than the image's filesystem: the agent
        # grows it at boot (src/guest/init.cc, grow_root_fs); / is mounted
        # noinit_itable (images/init.sh), so the new groups' inode tables are
        # left to the overlay's zeros and no ext4lazyinit thread takes the
        # vCPU from the sandbox's execs.
        out, _, ex = self.api.exec(self.sid, cmd="df -k / | tail -1; cat /proc/[0-9]*/comm")
        self.assertEqual(ex["exit_code"], 0)
        lines = out.decode().split("\n")
        self.assertGreater(int(lines[0].split()[1]), 900 * 1024, lines[0])  # grown to ~1 GiB
        self.assertIn("kthreadd", lines)
        self.assertNotIn("ext4lazyinit", lines)

    def test_guest_info(self):
        info = self.api.call("GET", f"/v1/sandboxes/{self.sid}/info")
        self.assertTrue(info["kernel"])
        self.assertGreater(info["mem_total_kb"], 0)
        self.assertGreater(info["disk_total_bytes"], 0)

    def test_exec_runs_in_a_cgroup_of_its_own(self):
        # The agent starts each exec's process inside its own cgroup (clone3
        # CLONE_INTO_CGROUP, src/guest/spawn.h); its children too. An exec
        # without limits that left it empty hands it on to the next one
        # (Server::recycle_cgroup): it is empty then, never shared.
        own = ["sh", "-c", "cg=$(cut -d: -f3 /proc/self/cgroup); echo $cg; "
               "cat /sys/fs/cgroup$cg/cgroup.procs /sys/fs/cgroup$cg/pids.max"]
        out, _, ex = self.api.exec(self.sid, argv=["cat", "/proc/self/cgroup"])
        self.assertEqual(ex["exit_code"], 0)
        self.assertRegex(out.decode().strip(), r"^0::/airlock/exec-\d+$")
        first = out.decode().strip()[3:]
        out, _, ex = self.api.exec(self.sid, argv=own)
        lines = out.decode().split()
        self.assertRegex(lines[0], r"^/airlock/exec-\d+$")
        # The next exec got the cgroup the last one left empty: no mkdir
        # while its process starts, no rmdir after its reply.
        self.assertEqual(lines[0], first)
        # Only the shell and its cat (1-2 pids); no pids limit.
        self.assertIn(len(lines), (3, 4), lines)
        self.assertEqual(lines[-1], "max")
        # A background exec keeps its cgroup: a concurrent one gets another.
        self.api.call("POST", f"/v1/sandboxes/{self.sid}/exec",
                      {"cmd": "echo $(cut -d: -f3 /proc/self/cgroup) > /tmp/bg-cg; sleep 20",
                       "background": True})
        deadline = time.time() + 30
        bg = b""
        while not bg and time.time() < deadline:
            bg = self.api.exec(self.sid, cmd="cat /tmp/bg-cg 2>/dev/null")[0].strip()
            time.sleep(0.2)
        self.assertRegex(bg.decode(), r"^/airlock/exec-\d+$")
        out, _, _ = self.api.exec(self.sid, argv=own)
        self.assertNotEqual(out.decode().split()[0].encode(), bg)
        self.assertIn(len(out.decode().split()), (3, 4), out)
        # An exec with limits gets a fresh cgroup with its limit; the next
        # one without limits has none.
        out, _, ex = self.api.exec(self.sid, argv=own, limits={"pids": 50})
        self.assertEqual(out.decode().split()[-1], "50", out)
        out, _, ex = self.api.exec(self.sid, argv=own)
        self.assertEqual(out.decode().split()[-1], "max", out)

    def test_start_event_of_a_long_exec_is_not_held_back(self):
        # The agent holds an exec's started event up to 25 ms so that a short
        # exec answers in one write; a long one still reports its start at once.
        conn = UnixHTTPConnection(self.sock, timeout=60)
        t0 = time.monotonic()
        conn.request("POST", f"/v1/sandboxes/{self.sid}/exec",
                     body=json.dumps({"argv": ["sleep", "3"]}),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        self.assertEqual(resp.status, 200)
        first = json.loads(resp.readline())
        t_start = time.monotonic() - t0
        rest = [json.loads(ln) for ln in resp if ln.strip()]
        t_end = time.monotonic() - t0
        conn.close()
        self.assertEqual(first["type"], "start")
        self.assertEqual(rest[-1]["type"], "exit")
        self.assertLess(t_start, t_end - 2.0, (t_start, t_end))

    def test_exec_cgroups_favour_dynamic_changes(self):
        # An exec whose agent cannot clone3 into its cgroup (the fork
        # fallback, src/guest/spawn.h) joins it right after its fork; the
        # agent mounts cgroup2 with favordynmods so that join does not wait
        # for an RCU grace period (src/guest/init.cc: ~25 ms against ~11 ms).
        out, _, ex = self.api.exec(self.sid, argv=["cat", "/proc/mounts"])
        self.assertEqual(ex["exit_code"], 0)
        cg = [ln for ln in out.decode().splitlines() if ln.split()[2:3] == ["cgroup2"]]
        self.assertEqual(len(cg), 1, cg)
        self.assertIn("favordynmods", cg[0].split()[3].split(","), cg[0])

    def test_audit_records_execs(self):
        self.api.exec(self.sid, argv=["echo", "audited"])
        events = self.api.call("GET", f"/v1/sandboxes/{self.sid}/logs")
        # A create may first build (or replace) its shape's template.
        kinds = [e["event"] for e in events if not e["event"].startswith("template_")]
        self.assertEqual(kinds[0], "created")
        execs = [e for e in events if e["event"] == "exec" and e.get("argv") == ["echo", "audited"]]
        self.assertEqual(len(execs), 1)
        self.assertEqual(execs[0]["exit_code"], 0)
        self.assertEqual(execs[0]["stdout_bytes"], 8)


class LifecycleTest(DaemonTestCase):
    def test_delete_leaves_nothing_behind(self):
        sb = self.api.create(image="minimal")
        self.assertTrue(self.api.exec(sb["id"], argv=["true"])[2]["exit_code"] == 0)
        self.api.delete(sb["id"])
        self.assertNothingLeft(sb["id"])
        self.assertEqual(self.api.call("GET", f"/v1/sandboxes/{sb['id']}")["state"], "deleted")
        with self.assertRaises(ApiError) as cm:
            self.api.exec(sb["id"], argv=["true"])
        self.assertEqual(cm.exception.status, 409)
        events = [e["event"] for e in self.api.call("GET", f"/v1/sandboxes/{sb['id']}/logs")]
        self.assertEqual(events[-1], "deleted")

    def test_lifetime_timeout_enforced_by_host(self):
        sb = self.api.create(image="minimal", timeout=20)
        # Wedge the guest's agent as far as user code can: it still must die on time.
        deadline = time.time() + 90
        while time.time() < deadline:
            if self.api.call("GET", f"/v1/sandboxes/{sb['id']}")["state"] == "timed_out":
                break
            time.sleep(1)
        self.assertEqual(self.api.call("GET", f"/v1/sandboxes/{sb['id']}")["state"], "timed_out")
        self.assertNothingLeft(sb["id"])
        events = [e["event"] for e in self.api.call("GET", f"/v1/sandboxes/{sb['id']}/logs")]
        self.assertIn("timed_out", events)

    def test_set_timeout_moves_the_expiry_both_ways(self):
        sb = self.api.create(image="minimal", timeout=600)
        sid = sb["id"]
        longer = self.api.call("POST", f"/v1/sandboxes/{sid}/timeout", {"timeout": 7200})
        self.assertGreater(longer["expires_at_ms"], sb["expires_at_ms"] + 6000 * 1000)
        self.assertEqual(longer["timeout"], 7200)
        self.assertEqual(self.api.call("GET", f"/v1/sandboxes/{sid}")["expires_at_ms"],
                         longer["expires_at_ms"])
        for body, field in (({"timeout": 0}, "timeout"), ({"timeout": "x"}, "timeout"),
                            ({}, "timeout"), ({"timeout": 5, "extra": 1}, "extra")):
            with self.assertRaises(ApiError, msg=str(body)) as cm:
                self.api.call("POST", f"/v1/sandboxes/{sid}/timeout", body)
            self.assertEqual(cm.exception.status, 400)
            self.assertEqual(cm.exception.body["error"]["field"], field, body)
        with self.assertRaises(ApiError) as cm:
            self.api.call("POST", "/v1/sandboxes/sb-nosuch/timeout", {"timeout": 5})
        self.assertEqual(cm.exception.status, 404)
        # Shortened: the host ends it at the new time, well before the old one.
        t0 = time.time()
        self.api.call("POST", f"/v1/sandboxes/{sid}/timeout", {"timeout": 2})
        deadline = time.time() + 60
        state = "running"
        while state in ("running", "stopping") and time.time() < deadline:
            time.sleep(0.5)
            state = self.api.call("GET", f"/v1/sandboxes/{sid}")["state"]
        self.assertEqual(state, "timed_out")
        self.assertLess(time.time() - t0, 60)
        self.assertNothingLeft(sid)
        events = [e["event"] for e in self.api.call("GET", f"/v1/sandboxes/{sid}/logs")]
        self.assertIn("timeout_changed", events)
        with self.assertRaises(ApiError) as cm:
            self.api.call("POST", f"/v1/sandboxes/{sid}/timeout", {"timeout": 5})
        self.assertEqual(cm.exception.status, 409)

    def wait_not_running(self, sid, limit=60):
        deadline = time.time() + limit
        sb = self.api.call("GET", f"/v1/sandboxes/{sid}")
        while sb["state"] in ("running", "stopping") and time.time() < deadline:
            time.sleep(0.5)
            sb = self.api.call("GET", f"/v1/sandboxes/{sid}")
        return sb

    def test_guest_panic_is_failed_guest_panic(self):
        sb = self.api.create(image="minimal")
        self.assertEqual(sb["failure"], "")
        # Panics the guest kernel; QEMU exits (-no-reboot). The exec in flight
        # fails, naming the cause, instead of hanging.
        t0 = time.time()
        try:
            self.api.exec(sb["id"], cmd="echo c > /proc/sysrq-trigger; sleep 30")
            self.fail("the exec survived a kernel panic")
        except ApiError as e:
            self.assertIn("guest_panic", json.dumps(e.body))
        self.assertLess(time.time() - t0, 20)
        got = self.wait_not_running(sb["id"])
        self.assertEqual((got["state"], got["failure"]), ("failed", "guest_panic"), got)
        self.assertIn("panic", got["reason"])
        failed = [e for e in self.api.call("GET", f"/v1/sandboxes/{sb['id']}/logs")
                  if e["event"] == "failed"]
        self.assertEqual(len(failed), 1)
        self.assertEqual(failed[0]["failure"], "guest_panic")
        # The panic's own line is always in the excerpt (the engine puts it
        # first when a long stack trace pushed it out of the last 40 lines).
        self.assertIn("Kernel panic - not syncing: sysrq triggered crash", failed[0]["console_tail"])
        self.assertNothingLeft(sb["id"])

    def test_idle_timeout_enforced_by_host(self):
        sb = self.api.create(image="minimal", idle_timeout=3)
        self.assertEqual(sb["idle_timeout"], 3)
        self.assertEqual(self.api.exec(sb["id"], cmd="sleep 5")[2]["exit_code"], 0)
        self.assertEqual(self.api.call("GET", f"/v1/sandboxes/{sb['id']}")["state"], "running")
        got = self.wait_not_running(sb["id"], 30)
        self.assertEqual((got["state"], got["reason"], got["failure"]),
                         ("timed_out", "idle for 3 s", ""))
        self.assertNothingLeft(sb["id"])

    def test_metadata_filter(self):
        a = self.api.create(image="minimal", metadata={"team": "a"})
        try:
            listed = self.api.call("GET", "/v1/sandboxes?metadata.team=a")
            self.assertEqual([s["id"] for s in listed], [a["id"]])
            self.assertEqual(self.api.call("GET", "/v1/sandboxes?metadata.team=b"), [])
        finally:
            self.api.delete(a["id"])
        self.assertNothingLeft(a["id"])


class BadInputTest(DaemonTestCase):
    def assertRejected(self, body, field, status=(400,)):
        before = set(os.listdir(os.path.join(self.data_dir, "sandboxes"))) \
            if os.path.isdir(os.path.join(self.data_dir, "sandboxes")) else set()
        with self.assertRaises(ApiError) as cm:
            self.api.call("POST", "/v1/sandboxes", body)
        self.assertIn(cm.exception.status, status, cm.exception.body)
        self.assertEqual(cm.exception.field, field, cm.exception.body)
        self.assertTrue(cm.exception.message)
        after = set(os.listdir(os.path.join(self.data_dir, "sandboxes"))) \
            if os.path.isdir(os.path.join(self.data_dir, "sandboxes")) else set()
        self.assertEqual(before, after, "a rejected create left something behind")

    def test_bad_create_specs(self):
        self.assertRejected({"image": "minimal", "bogus": 1}, "bogus")
        self.assertRejected({"image": "minimal", "cpus": "two"}, "cpus")
        self.assertRejected({"image": "minimal", "cpus": -1}, "cpus")
        self.assertRejected({"image": "minimal", "memory_mb": 10**9}, "memory_mb")
        self.assertRejected({"image": "minimal", "disk_mb": -5}, "disk_mb")
        self.assertRejected({"image": "minimal", "timeout": 0}, "timeout")
        self.assertRejected({"image": "minimal", "env": {"A": 1}}, "env.A")
        self.assertRejected({"image": "no-such-image"}, "image", status=(400, 404))
        self.assertEqual(self.api.call("GET", "/v1/sandboxes"), [])

    def test_malformed_json(self):
        with self.assertRaises(ApiError) as cm:
            self.api.call("POST", "/v1/sandboxes", "{not json")
        self.assertEqual(cm.exception.status, 400)

    def test_bad_ids_and_routes(self):
        for path in ("/v1/sandboxes/sb-000000000000", "/v1/sandboxes/..%2Fetc"):
            with self.assertRaises(ApiError) as cm:
                self.api.call("GET", path)
            self.assertIn(cm.exception.status, (400, 404))
        with self.assertRaises(ApiError) as cm:
            self.api.call("GET", "/v1/nope")
        self.assertEqual(cm.exception.status, 404)
        with self.assertRaises(ApiError) as cm:
            self.api.exec("sb-000000000000", argv=["true"])
        self.assertEqual(cm.exception.status, 404)

    def test_daemon_info(self):
        info = self.api.call("GET", "/v1/info")
        self.assertIn(info["accelerator"], ("kvm", "tcg"))
        self.assertTrue(info["accelerator_reason"])
        self.assertIn("minimal", [i["name"] for i in info["images"]])


class ConnectionLimitsTest(DaemonTestCase):
    """The daemon bounds what clients hold: a connection cap and an idle timeout."""

    daemon_args = ["--max-connections", "4", "--idle-timeout", "2"]

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(30)
        s.connect(self.sock)
        return s

    @staticmethod
    def read_to_eof(s):
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return data
            data += chunk

    def test_connection_beyond_the_cap_is_refused_with_an_error(self):
        # Four kept-alive connections, each proven served (a connection of an
        # earlier test may still be closing: retry a refused one).
        held = []
        try:
            deadline = time.monotonic() + 10
            while len(held) < 4 and time.monotonic() < deadline:
                conn = UnixHTTPConnection(self.sock, timeout=30)
                conn.request("GET", "/v1/info")
                resp = conn.getresponse()
                resp.read()
                if resp.status == 200:
                    held.append(conn)
                else:
                    conn.close()
                    time.sleep(0.05)
            self.assertEqual(len(held), 4)
            extra = self.connect()
            extra.sendall(b"GET /v1/info HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = self.read_to_eof(extra)
            extra.close()
            self.assertTrue(answer.startswith(b"HTTP/1.1 503"), answer)
            body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
            self.assertEqual(body["error"]["code"], "unavailable")
            self.assertIn("--max-connections", body["error"]["message"])
        finally:
            for conn in held:
                conn.close()
        deadline = time.monotonic() + 10
        while True:  # slots free again once the held connections are gone
            try:
                info = self.api.call("GET", "/v1/info")
                break
            except ApiError as e:
                if time.monotonic() > deadline or e.status != 503:
                    raise
                time.sleep(0.1)
        self.assertGreaterEqual(info["daemon"]["connections"]["refused"], 1)
        self.assertEqual(info["daemon"]["connections"]["max"], 4)

    def test_idle_connection_is_closed_after_the_timeout(self):
        s = self.connect()
        start = time.monotonic()
        self.assertEqual(self.read_to_eof(s), b"")  # closed by the daemon, nothing said
        self.assertGreaterEqual(time.monotonic() - start, 1.9)
        s.close()
        s = self.connect()
        s.sendall(b"GET /v1/info HTTP/1.1\r\nHost:")  # stops mid-request
        answer = self.read_to_eof(s)
        s.close()
        self.assertTrue(answer.startswith(b"HTTP/1.1 408"), answer)
        self.assertGreaterEqual(self.api.call("GET", "/v1/info")["daemon"]["connections"]["idle_closed"], 2)

    def test_exec_stream_outlives_the_idle_timeout(self):
        sid = self.api.create()["id"]
        try:
            # Silent for twice the idle timeout before its first output, then between outputs.
            out, err, exit_event = self.api.exec(sid, argv=["sh", "-c", "sleep 4; echo a; sleep 4; echo b"])
            self.assertEqual((out, exit_event["exit_code"]), (b"a\nb\n", 0), err)
        finally:
            self.api.delete(sid)
        self.assertNothingLeft(sid)


if __name__ == "__main__":
    unittest.main()

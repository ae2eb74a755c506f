"""The Python SDK against a real airlockd and real VMs (sync API)."""

import hashlib
import io
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import unittest

from sdk_harness import SDK_DIR, DaemonTestCase  # sets sys.path too

import airlock
from airlock import (Client, Conflict, DaemonUnavailable, InvalidArgument, NotFound, Sandbox,
                     SandboxFailed, SandboxNotFound, Timeout)

IMAGE = "minimal"


class SdkCase(DaemonTestCase):
    """One daemon and one shared sandbox for the class."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.client = Client(socket=cls.sock)
        try:
            cls.sb = Sandbox.create(image=IMAGE, memory_mb=256, timeout=600,
                                    network={"mode": "allowlist", "allow": ["example.com"]},
                                    metadata={"suite": "sdk", "task": "t-17"}, client=cls.client)
        except BaseException:
            super().tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        try:
            cls.sb.destroy()
        except airlock.AirlockError:
            pass
        cls.client.close()
        super().tearDownClass()


class ExecTests:
    def test_exec_result(self):
        r = self.sb.exec("sh", "-c", "echo $((6*7)); echo oops >&2; exit 3")
        self.assertEqual((r.exit_code, r.stdout, r.stderr, r.reason),
                         (3, b"42\n", b"oops\n", "exited"))
        self.assertFalse(r.ok)
        self.assertFalse(r.truncated)
        self.assertTrue(r.exec_id)
        r = self.sb.exec(cmd="pwd; echo $GREETING", cwd="/tmp", env={"GREETING": "hello"})
        self.assertEqual((r.exit_code, r.stdout_text), (0, "/tmp\nhello\n"))

    def test_stdin_bytes_and_str(self):
        self.assertEqual(self.sb.exec("cat", stdin=b"\x00\x01bin").stdout, b"\x00\x01bin")
        self.assertEqual(self.sb.exec("wc", "-c", stdin="héllo").stdout.split()[0], b"6")

    def test_truncation_flags(self):
        r = self.sb.exec("sh", "-c", "head -c 100 /dev/zero", output_limit_bytes=10)
        self.assertEqual((r.stdout, r.truncated, r.stdout_dropped), (b"\0" * 10, True, 90))
        self.assertEqual(r.stdout_bytes, 100)

    def test_exec_timeout(self):
        t0 = time.time()
        r = self.sb.exec("sleep", "30", timeout=1)
        self.assertLess(time.time() - t0, 15)
        self.assertEqual((r.reason, r.timed_out, r.exit_code), ("timeout", True, None))

    def test_exec_stream_is_live(self):
        t0 = time.time()
        seen = []
        with self.sb.exec_stream("sh", "-c", "echo one; sleep 2; echo two >&2") as s:
            for ev in s:
                seen.append((ev.stream, ev.data, time.time() - t0))
        self.assertEqual([(a, b) for a, b, _ in seen], [("stdout", b"one\n"), ("stderr", b"two\n")])
        # The first line arrived while the process still slept: streamed, not buffered.
        self.assertLess(seen[0][2], seen[1][2] - 1.0)
        self.assertEqual((s.result.exit_code, s.result.reason), (0, "exited"))
        self.assertTrue(s.exec_id)

    def test_closing_a_stream_kills_the_process(self):
        s = self.sb.exec_stream("sh", "-c", "echo ready; exec sleep 4242")
        ev = next(iter(s))
        self.assertEqual(ev.data, b"ready\n")
        s.close()
        deadline = time.time() + 10
        while time.time() < deadline:
            if b"sleep 4242" not in self.sb.exec("ps").stdout:
                break
            time.sleep(0.2)
        else:
            self.fail("the process of an abandoned stream still runs")

    def test_background_wait_and_kill(self):
        p = self.sb.exec("sh", "-c", "sleep 1; exit 7", background=True)
        self.assertTrue(p.id)
        self.assertIn(p.id, [q.id for q in self.sb.processes()])
        r = p.wait(30)
        self.assertEqual((r.exit_code, r.reason, r.output_captured), (7, "exited", False))
        q = self.sb.exec("sleep", "300", background=True)
        self.assertTrue(q.running)
        with self.assertRaises(Timeout) as cm:
            q.wait(timeout=0.5)
        self.assertEqual(cm.exception.code, "timeout")
        q.kill()
        r = q.wait(30)
        self.assertEqual((r.exit_code, r.signal), (None, 9))
        self.assertIn(r.reason, ("killed", "signaled"))
        self.assertFalse(q.running)

    def test_exec_bad_input_names_the_field(self):
        with self.assertRaises(InvalidArgument) as cm:
            self.sb.exec("true", cwd="relative")
        self.assertEqual((cm.exception.code, cm.exception.field, cm.exception.status),
                         ("invalid_argument", "cwd", 400))
        self.assertIn("absolute", cm.exception.message)
        with self.assertRaises(InvalidArgument) as cm:
            self.sb.exec("true", limits={"pids": 0})
        self.assertEqual(cm.exception.field, "limits.pids")
        with self.assertRaises(InvalidArgument) as cm:
            self.sb.exec()
        self.assertEqual(cm.exception.field, "argv")


class FilesTests:
    def test_write_read_list_stat_mkdir_remove(self):
        fs = self.sb.files
        fs.mkdir("/work/sub/deep", parents=True)
        self.assertEqual(fs.write("/work/a.txt", b"hello"), 5)
        fs.write("/work/sub/b.txt", "text", mode=0o600)
        self.assertEqual(fs.read("/work/a.txt"), b"hello")
        self.assertEqual(fs.read_text("/work/sub/b.txt"), "text")
        names = {e.name: e for e in fs.list("/work")}
        self.assertEqual(set(names), {"a.txt", "sub"})
        self.assertTrue(names["sub"].is_dir)
        st = fs.stat("/work/sub/b.txt")
        self.assertEqual((st.name, st.type, st.size, st.mode & 0o777), ("b.txt", "file", 4, 0o600))
        fs.remove("/work/a.txt")
        self.assertFalse(fs.exists("/work/a.txt"))
        with self.assertRaises(NotFound):
            fs.read("/work/a.txt")
        with self.assertRaises(airlock.AirlockError):
            fs.remove("/work/sub")  # not empty without recursive
        fs.remove("/work/sub", recursive=True)
        self.assertEqual(fs.list("/work"), [])
        with self.assertRaises(InvalidArgument) as cm:
            fs.list("work")
        self.assertEqual(cm.exception.field, "path")

    def test_file_object_streamed_both_ways(self):
        data = os.urandom(3 << 20)
        self.assertEqual(self.sb.files.write("/tmp/blob", io.BytesIO(data)), len(data))
        r = self.sb.exec("sha256sum", "/tmp/blob")
        self.assertEqual(r.stdout.split()[0].decode(), hashlib.sha256(data).hexdigest())
        out = io.BytesIO()
        self.assertEqual(self.sb.files.download("/tmp/blob", out), len(data))
        self.assertEqual(out.getvalue(), data)


class NetworkLogsTests:
    def test_network_set_get_events(self):
        self.assertEqual(self.sb.network.get()["mode"], "allowlist")
        got = self.sb.network.set(allow=["*.example.org"])
        self.assertEqual(got["policy"], {"mode": "allowlist", "allow": ["*.example.org"], "deny": []})
        self.assertEqual(self.sb.network.get(), got["policy"])
        # A refused connection (private addresses are always denied) is recorded.
        self.sb.exec("sh", "-c", "printf x | nc -w 3 10.1.2.3 80")
        denied = [e for e in self.sb.network.events()
                  if e.get("event") == "net_flow" and e.get("dst") == "10.1.2.3"]
        self.assertTrue(denied and not denied[0]["allowed"], denied)
        # Followed: a new event arrives on the open stream.
        got = None
        with self.sb.network.events(follow=True) as follow:
            guard = threading.Timer(30, follow._resp.abort)  # never hang the suite
            guard.start()
            self.sb.exec("sh", "-c", "printf x | nc -w 3 10.1.2.4 80")
            try:
                for ev in follow:
                    if ev.get("event") == "net_flow" and ev.get("dst") == "10.1.2.4":
                        got = ev
                        break
            except airlock.AirlockError:
                pass
            guard.cancel()
        self.assertTrue(got and not got["allowed"], got)
        with self.assertRaises(InvalidArgument) as cm:
            self.sb.network.set(mode="sideways")
        self.assertEqual(cm.exception.field, "network.mode")
        with self.assertRaises(InvalidArgument) as cm:
            self.sb.network.set(allow=[""])
        self.assertEqual(cm.exception.field, "network.allow[0]")
        self.assertEqual(self.sb.network.get()["allow"], ["*.example.org"])  # unchanged

    def test_ports(self):
        fwd = self.sb.ports.add(8080)
        hp = fwd["host_port"]
        self.assertGreater(hp, 0)
        self.assertIn(hp, [p["host_port"] for p in self.sb.ports.list()])
        self.sb.ports.remove(hp)
        self.assertNotIn(hp, [p["host_port"] for p in self.sb.ports.list()])
        with self.assertRaises(InvalidArgument) as cm:
            self.sb.ports.add(70000)
        self.assertEqual(cm.exception.field, "guest_port")

    def test_logs_are_the_audit_journal(self):
        self.sb.exec("echo", "audited-marker")
        events = self.sb.logs()
        kinds = [e.get("event") for e in events]
        self.assertIn("created", kinds)
        self.assertTrue(any("audited-marker" in str(e) for e in events), kinds)


class LifecycleTests:
    def test_create_as_context_manager_destroys(self):
        with Sandbox.create(image=IMAGE, metadata={"suite": "sdk", "kind": "ctx"},
                            client=self.client) as sb:
            self.assertEqual(sb.state, "running")
            self.assertEqual(sb.metadata, {"suite": "sdk", "kind": "ctx"})
            self.assertEqual(sb.exec("echo", "hi").stdout, b"hi\n")
            sid = sb.id
        self.assertEqual(Sandbox.connect(sid, client=self.client).info["state"], "deleted")
        self.assertNothingLeft(sid)
        # Gone: a second destroy is a conflict naming the state, execs too.
        with self.assertRaises(Conflict) as cm:
            sb.destroy()
        self.assertIn("deleted", cm.exception.message)
        with self.assertRaises(Conflict) as cm:
            sb.exec("true")
        self.assertNotIsInstance(cm.exception, SandboxFailed)

    def test_list_by_metadata_and_connect(self):
        ids = [s.id for s in Sandbox.list(metadata={"task": "t-17"}, client=self.client)]
        self.assertEqual(ids, [self.sb.id])
        self.assertEqual(Sandbox.list(metadata={"task": "t-18"}, client=self.client), [])
        again = Sandbox.connect(self.sb.id, client=self.client)
        self.assertEqual(again.exec("echo", "same").stdout, b"same\n")

    def test_errors(self):
        with self.assertRaises(SandboxNotFound) as cm:
            Sandbox.connect("sb-doesnotexist", client=self.client)
        self.assertEqual((cm.exception.code, cm.exception.status), ("not_found", 404))
        with self.assertRaises(InvalidArgument) as cm:
            Sandbox.connect("bad id!", client=self.client)
        self.assertEqual(cm.exception.field, "id")
        before = len(Sandbox.list(all=True, client=self.client))
        with self.assertRaises(InvalidArgument) as cm:
            Sandbox.create(image=IMAGE, memory_mb=1, client=self.client)
        self.assertEqual(cm.exception.field, "memory_mb")
        self.assertIn("between 64 and", cm.exception.message)
        with self.assertRaises(InvalidArgument) as cm:
            Sandbox.create(image=IMAGE, network={"mode": "allowlist", "allow": [5]},
                           client=self.client)
        self.assertEqual(cm.exception.field, "network.allow[0]")
        self.assertEqual(len(Sandbox.list(all=True, client=self.client)), before)  # nothing half-made
        with self.assertRaises(DaemonUnavailable):
            Client(socket=os.path.join(self.tmp, "no-such.sock")).info()

    def test_failed_sandbox_raises_sandbox_failed(self):
        sb = Sandbox.create(image=IMAGE, client=self.client)
        with self.assertRaises(SandboxFailed) as cm:
            sb.exec("sh", "-c", "echo c > /proc/sysrq-trigger; sleep 30")
        self.assertEqual((cm.exception.failure, cm.exception.sandbox_id), ("guest_panic", sb.id))
        self.assertIn("panic", cm.exception.reason)
        with self.assertRaises(SandboxFailed):
            sb.files.read("/etc/hostname")
        sb.__exit__(None, None, None)  # destroying a failed sandbox is a no-op on exit
        self.assertNothingLeft(sb.id)


class ConcurrencyTests:
    def test_eight_threads_share_a_client(self):
        errors, results = [], {}

        def work(n):
            try:
                for i in range(4):
                    r = self.sb.exec("sh", "-c", f"echo {n}-{i}; echo e{n} >&2")
                    assert (r.stdout, r.stderr) == (f"{n}-{i}\n".encode(), f"e{n}\n".encode()), r
                    self.sb.files.write(f"/tmp/t{n}", f"payload {n} {i}")
                    assert self.sb.files.read(f"/tmp/t{n}") == f"payload {n} {i}".encode()
                events = list(self.sb.exec_stream("echo", f"stream{n}"))
                results[n] = events[0].data
            except BaseException as e:  # reported by the main thread
                errors.append((n, e))

        threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        self.assertEqual(errors, [])
        self.assertEqual(results, {n: f"stream{n}\n".encode() for n in range(8)})


class ConnectTests:
    """How the SDK finds the daemon: env as the CLI reads it, or AIRLOCK_URL."""

    def run_sdk(self, env, code):
        env = dict(os.environ, PYTHONPATH=SDK_DIR, **env)
        for k in ("AIRLOCK_SOCKET", "AIRLOCK_DATA_DIR", "AIRLOCK_URL", "AIRLOCK_TOKEN"):
            if k not in env or env[k] is None:
                env.pop(k, None)
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=120)

    def test_default_socket_from_env(self):
        code = ("import airlock; print(airlock.default_socket()); "
                f"print(airlock.Sandbox.connect({self.sb.id!r}).exec('echo', 'via-env').stdout)")
        for env in ({"AIRLOCK_SOCKET": self.sock}, {"AIRLOCK_DATA_DIR": self.tmp}):
            p = self.run_sdk(env, code)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual(p.stdout.splitlines(), [self.sock, "b'via-env\\n'"])

    def test_airlock_url_sends_the_token(self):
        # A loopback TCP listener relaying to the daemon's socket stands in for
        # a TCP front; it records what the client sent.
        lsock = socket.socket()
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(4)
        seen = bytearray()

        def pump(src, dst, record):
            try:
                while True:
                    b = src.recv(65536)
                    if not b:
                        break
                    if record:
                        seen.extend(b)
                    dst.sendall(b)
            except OSError:
                pass
            finally:
                for s in (src, dst):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

        def serve():
            while True:
                try:
                    c, _ = lsock.accept()
                except OSError:
                    return
                u = socket.socket(socket.AF_UNIX)
                u.connect(self.sock)
                threading.Thread(target=pump, args=(c, u, True), daemon=True).start()
                threading.Thread(target=pump, args=(u, c, False), daemon=True).start()

        threading.Thread(target=serve, daemon=True).start()
        try:
            url = f"http://127.0.0.1:{lsock.getsockname()[1]}"
            p = self.run_sdk({"AIRLOCK_URL": url, "AIRLOCK_TOKEN": "s3cret",
                              "AIRLOCK_SOCKET": "/nonexistent"},
                             f"import airlock; print(airlock.Sandbox.connect({self.sb.id!r}).id)")
            self.assertEqual((p.returncode, p.stdout.strip()), (0, self.sb.id), p.stderr)
            self.assertIn(b"\r\nAuthorization: Bearer s3cret\r\n", bytes(seen))
        finally:
            lsock.close()

    def test_pip_installs_the_package(self):
        pythons = [sys.executable, "/usr/bin/python3"]
        # Debian's setuptools with its own distutils shim needs this to import.
        env = dict(os.environ, SETUPTOOLS_USE_DISTUTILS="stdlib", PIP_NO_CACHE_DIR="1")
        usable = [py for py in pythons if os.path.exists(py) and subprocess.run(
            [py, "-c", "import pip, setuptools, wheel"], capture_output=True,
            env=env).returncode == 0]
        if not usable:
            self.skipTest("no interpreter with pip, setuptools and wheel "
                          "(scripts/setup.sh installs them)")
        # From a copy: setuptools writes build/ and *.egg-info beside the sources.
        src = os.path.join(self.tmp, "sdk-src")
        shutil.copytree(SDK_DIR, src, ignore=shutil.ignore_patterns("tests", "build", "*.egg-info",
                                                                  "__pycache__"))
        target = os.path.join(self.tmp, "site")
        p = subprocess.run([usable[0], "-m", "pip", "install", "--no-index", "--no-deps",
                            "--no-build-isolation", "--target", target, src],
                           capture_output=True, text=True, timeout=300,
                           cwd=self.tmp, env=env)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertTrue(os.path.exists(os.path.join(target, "airlock", "py.typed")))
        q = subprocess.run([usable[0], "-c", "import airlock, sys; print(airlock.__file__); "
                            f"print(airlock.Client(socket={self.sock!r}).info()['daemon']['version'])"],
                           env=dict(os.environ, PYTHONPATH=target), capture_output=True, text=True,
                           cwd=self.tmp, timeout=60)
        self.assertEqual(q.returncode, 0, q.stderr)
        self.assertTrue(q.stdout.startswith(target), q.stdout)


class SdkTest(ExecTests, FilesTests, NetworkLogsTests, LifecycleTests, ConcurrencyTests,
              ConnectTests, SdkCase):
    """All of the above against one daemon and one shared sandbox."""


class KeepAliveTest(DaemonTestCase):
    """Pooled connections survive the daemon closing them while idle."""

    daemon_args = ["--idle-timeout", "0.5"]

    def test_reuse_and_reconnect_after_idle_close(self):
        c = Client(socket=self.sock)
        first = c.info()["daemon"]["connections"]
        c.info()
        self.assertEqual(len(c.transport._idle), 1)  # one connection, kept alive
        time.sleep(1.5)  # the daemon closes it
        after = c.info()["daemon"]["connections"]  # sent again on a fresh one
        self.assertGreater(after["idle_closed"], first["idle_closed"])
        c.close()

    def test_daemon_timeout_is_timeout_with_its_field(self):
        # A request body that stalls past the daemon's idle timeout is
        # answered 504 timeout (field "body") while the client is still
        # sending: the SDK reports that answer, not the broken pipe.
        def stalling():
            yield b'{"image": '
            time.sleep(1.5)
            yield b'"minimal"}'

        c = Client(socket=self.sock)
        with self.assertRaises(Timeout) as cm:
            c.transport.call("POST", "/v1/sandboxes", body=stalling(),
                             content_type="application/json")
        self.assertEqual((cm.exception.code, cm.exception.status, cm.exception.field),
                         ("timeout", 504, "body"))
        self.assertIn("stalled", cm.exception.message)
        self.assertEqual(Sandbox.list(all=True, client=c), [])
        c.close()


if __name__ == "__main__":
    unittest.main()

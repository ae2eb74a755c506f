"""The CLI as a user runs it: verbs, exit codes, streams, auto-started daemon."""

import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

import harness
from harness import BIN, IMAGE_DIR, ApiError, DaemonTestCase, qemu_pids_for


def airlock(env, *args, stdin=None, check=False, timeout=300):
    return subprocess.run([os.path.join(BIN, "airlock"), *args], env=env, input=stdin,
                          capture_output=True, timeout=timeout, check=check)


class CliTest(DaemonTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.env = dict(os.environ, AIRLOCK_SOCKET=cls.sock, AIRLOCK_DATA_DIR=cls.data_dir,
                       AIRLOCK_IMAGE_DIR=IMAGE_DIR)
        cls.sid = airlock(cls.env, "create", "--image", "minimal", "--env", "GREETING=hi",
                          check=True).stdout.decode().strip()

    def test_exec_keeps_streams_apart_and_propagates_exit_code(self):
        r = airlock(self.env, "exec", self.sid, "--", "sh", "-c", "echo $GREETING; echo e >&2; exit 3")
        self.assertEqual(r.returncode, 3)
        self.assertEqual(r.stdout, b"hi\n")
        self.assertEqual(r.stderr, b"e\n")

    def test_exec_forwards_stdin(self):
        r = airlock(self.env, "exec", self.sid, "--", "tr", "a-z", "A-Z", stdin=b"shout")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, b"SHOUT")

    def test_exec_signal_and_timeout_exit_codes(self):
        self.assertEqual(airlock(self.env, "exec", self.sid, "--", "sh", "-c", "kill -9 $$").returncode, 137)
        self.assertEqual(airlock(self.env, "exec", "--timeout", "1", self.sid, "--", "sleep", "30").returncode, 124)

    def test_cp_in_and_out(self):
        tmp = tempfile.mkdtemp()
        try:
            src = os.path.join(tmp, "in.bin")
            data = os.urandom(300_000)
            with open(src, "wb") as f:
                f.write(data)
            airlock(self.env, "cp", src, f"{self.sid}:/tmp/in.bin", check=True)
            dst = os.path.join(tmp, "out.bin")
            airlock(self.env, "cp", f"{self.sid}:/tmp/in.bin", dst, check=True)
            with open(dst, "rb") as f:
                self.assertEqual(f.read(), data)
            r = airlock(self.env, "cp", f"{self.sid}:/no/such", dst)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn(b"/no/such", r.stderr)
        finally:
            shutil.rmtree(tmp)

    def test_ls_logs_info(self):
        self.assertIn(self.sid.encode(), airlock(self.env, "ls", check=True).stdout)
        airlock(self.env, "exec", self.sid, "--", "true", check=True)
        logs = airlock(self.env, "logs", self.sid, check=True).stdout
        self.assertIn(b"created", logs)
        self.assertIn(b"exec", logs)
        self.assertIn(b"tcg", airlock(self.env, "info", check=True).stdout + b"kvm")

    def test_logs_follow_network_streams_new_events_until_delete(self):
        # The follower starts before the events: what it prints must be what
        # the journal holds at the end, in order, each once (the real
        # airlock-net helper appends them from its own process).
        sid = airlock(self.env, "create", "--image", "minimal", "--network", "allowlist",
                      "--allow", "192.0.2.1", check=True).stdout.decode().strip()
        follow = subprocess.Popen([os.path.join(BIN, "airlock"), "logs", "--network", "--json",
                                   "-f", sid], env=self.env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)
        try:
            for i in range(3):
                airlock(self.env, "exec", sid, "--", "nslookup", f"n{i}.denied.example")
            final = airlock(self.env, "logs", "--network", "--json", sid, check=True).stdout
            airlock(self.env, "rm", sid, check=True)
            out, err = follow.communicate(timeout=30)  # the stream ends with the sandbox
        finally:
            if follow.poll() is None:
                follow.kill()
                follow.wait()
        self.assertEqual(follow.returncode, 0, err)
        followed = [json.loads(line) for line in out.decode().splitlines()]
        recorded = [json.loads(line) for line in final.decode().splitlines()]
        names = [e.get("name", "") for e in followed if e["event"] == "net_dns"]
        for i in range(3):
            self.assertTrue(any(n.startswith(f"n{i}.denied.example") for n in names), followed)
        self.assertEqual(followed[:len(recorded)], recorded)

    def test_run_propagates_exit_code_and_cleans_up(self):
        r = airlock(self.env, "run", "--", "sh", "-c", "exit 7")
        self.assertEqual(r.returncode, 7, r.stderr)
        live = airlock(self.env, "ls", "--json", check=True).stdout.decode()
        self.assertEqual(live.count('"id"'), 1)  # only the class's sandbox remains

    def test_rm_wait_returns_once_all_is_gone(self):
        sid = airlock(self.env, "create", "--image", "minimal", check=True).stdout.decode().strip()
        r = airlock(self.env, "rm", "--wait", sid, check=True)
        self.assertEqual(r.stdout.decode().strip(), sid)
        # No polling: the journal is complete and nothing is left when it returns.
        self.assertEqual(self.api.call("GET", f"/v1/sandboxes/{sid}/logs")[-1]["event"], "deleted")
        self.assertEqual(harness.leftovers_of(self.data_dir, sid, wait=0), [])

    def test_bad_usage(self):
        r = airlock(self.env, "create", "--env", "NOEQUALS")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(b"NOEQUALS", r.stderr)
        r = airlock(self.env, "exec", "sb-000000000000", "--", "true")
        self.assertEqual(r.returncode, 1)
        self.assertIn(b"sb-000000000000", r.stderr)


def airlock_popen(env, *args):
    return subprocess.Popen([os.path.join(BIN, "airlock"), *args], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def read_line_within(pipe, seconds):
    """The first line on `pipe`, or None if none is complete within `seconds`."""
    data = b""
    deadline = time.monotonic() + seconds
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([pipe], [], [], left)[0]:
            return None
        chunk = os.read(pipe.fileno(), 1)
        if not chunk:
            return data or None
        data += chunk
    return data


class CliStreamTest(DaemonTestCase):
    """Output reaches a pipe as it is produced; a daemon killed mid-exec is reported."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.env = dict(os.environ, AIRLOCK_SOCKET=cls.sock, AIRLOCK_DATA_DIR=cls.data_dir,
                       AIRLOCK_IMAGE_DIR=IMAGE_DIR)

    def test_exec_streams_into_a_pipe_while_the_command_runs(self):
        sid = self.api.create()["id"]
        # The command prints "a", then waits for the test's go before "b":
        # "a" must come out of the pipe while the command (and the CLI) still run.
        p = airlock_popen(self.env, "exec", sid, "--", "sh", "-c",
                          "echo a; while [ ! -e /tmp/go ]; do sleep 0.1; done; echo b")
        try:
            first = read_line_within(p.stdout, 120)
            self.assertEqual(first, b"a\n", "the first line did not reach the pipe while the command ran")
            self.assertIsNone(p.poll(), "the CLI had ended before the first line arrived")
            self.api.exec(sid, argv=["touch", "/tmp/go"])
            rest, err = p.communicate(timeout=120)
            self.assertEqual(p.returncode, 0, err)
            self.assertEqual(rest, b"b\n")
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        self.api.delete(sid)
        self.assertNothingLeft(sid)

    def test_daemon_killed_mid_exec_is_a_lost_connection(self):
        sid = self.api.create()["id"]
        # Without reattaching (test_reattach covers the CLI resuming).
        env = dict(self.env, AIRLOCK_REATTACH_SECONDS="0")
        p = airlock_popen(env, "exec", sid, "--", "sh", "-c", "echo a; sleep 60; echo b")
        try:
            self.assertEqual(read_line_within(p.stdout, 120), b"a\n")
            self.assertIsNone(p.poll())
            self.daemon.kill()  # SIGKILL: no goodbye on the stream
            self.daemon.wait()
            rest, err = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            if self.daemon.poll() is not None:
                self.start_daemon()  # the class's other tests need one
        self.assertEqual(rest, b"", "nothing but what arrived before the daemon died")
        self.assertEqual(p.returncode, 255, err)
        self.assertIn(b"lost the connection to airlockd", err)
        # A new daemon (started above) takes the sandbox over; deleting it
        # leaves nothing behind.
        try:
            self.api.delete(sid)
        except ApiError as e:
            self.assertIn(e.status, (404, 409), e)
        self.assertNothingLeft(sid)


class AutoStartTest(unittest.TestCase):
    @staticmethod
    def private_env():
        """(tmp, data dir, env) for a CLI that finds no daemon and starts its own."""
        tmp = tempfile.mkdtemp(prefix="airlock-auto-")
        data = os.path.join(tmp, "data")
        # Template RAM inside tmp too, so nothing is left in /dev/shm.
        # No learned pool: no member is being made when the daemon is stopped.
        env = dict(os.environ, AIRLOCK_DATA_DIR=data, AIRLOCK_IMAGE_DIR=IMAGE_DIR,
                   AIRLOCK_TEMPLATE_RAM_DIR=os.path.join(tmp, "template-ram"),
                   AIRLOCK_POOL_LEARN="0")
        env.pop("AIRLOCK_SOCKET", None)
        return tmp, data, env

    def test_cli_starts_a_daemon_when_none_runs(self):
        tmp, data, env = self.private_env()
        try:
            r = airlock(env, "run", "--", "echo", "auto")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout, b"auto\n")
            self.assertTrue(os.path.exists(os.path.join(data, "airlockd.sock")))
        finally:
            subprocess.run(["pkill", "-TERM", "-f", f"airlockd --data-dir {data}"])
            time.sleep(1)
            for pid in qemu_pids_for(data):
                os.kill(pid, signal.SIGKILL)
            shutil.rmtree(tmp, ignore_errors=True)

    def test_auto_started_daemon_inherits_no_descriptor_and_no_ignored_signal(self):
        # The CLI starts airlockd like every other detached spawn
        # (common/spawn.h): a descriptor the CLI's caller left open, and a
        # signal it ignores, must not reach the long-lived daemon.
        tmp, data, env = self.private_env()
        leak_r, leak_w = os.pipe()
        try:
            r = subprocess.run([os.path.join(BIN, "airlock"), "ls"], env=env, capture_output=True,
                               pass_fds=(leak_w,), timeout=120,
                               preexec_fn=lambda: signal.signal(signal.SIGUSR2, signal.SIG_IGN))
            self.assertEqual(r.returncode, 0, r.stderr)
            pids = [int(p) for p in subprocess.run(
                ["pgrep", "-f", f"airlockd --data-dir {data}"], capture_output=True,
                text=True).stdout.split()]
            self.assertEqual(len(pids), 1, pids)
            leaked = os.fstat(leak_w)
            fd_dir = f"/proc/{pids[0]}/fd"
            for fd in os.listdir(fd_dir):
                try:
                    st = os.stat(os.path.join(fd_dir, fd))
                except OSError:
                    continue
                self.assertFalse((st.st_dev, st.st_ino) == (leaked.st_dev, leaked.st_ino),
                                 f"the caller's pipe leaked into airlockd as fd {fd}")
            with open(f"/proc/{pids[0]}/status") as f:
                ign = int(next(l for l in f if l.startswith("SigIgn:")).split()[1], 16)
            self.assertFalse(ign & (1 << (signal.SIGUSR2 - 1)), f"SigIgn {ign:x}")
        finally:
            os.close(leak_r)
            os.close(leak_w)
            subprocess.run(["pkill", "-TERM", "-f", f"airlockd --data-dir {data}"])
            time.sleep(1)
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()

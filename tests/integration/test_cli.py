"""The CLI as a user runs it: verbs, exit codes, streams, auto-started daemon."""

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

from harness import BIN, IMAGE_DIR, DaemonTestCase, qemu_pids_for


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

    def test_bad_usage(self):
        r = airlock(self.env, "create", "--env", "NOEQUALS")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(b"NOEQUALS", r.stderr)
        r = airlock(self.env, "exec", "sb-000000000000", "--", "true")
        self.assertEqual(r.returncode, 1)
        self.assertIn(b"sb-000000000000", r.stderr)


class AutoStartTest(unittest.TestCase):
    def test_cli_starts_a_daemon_when_none_runs(self):
        tmp = tempfile.mkdtemp(prefix="airlock-auto-")
        data = os.path.join(tmp, "data")
        # Template RAM inside tmp too, so nothing is left in /dev/shm.
        env = dict(os.environ, AIRLOCK_DATA_DIR=data, AIRLOCK_IMAGE_DIR=IMAGE_DIR,
                   AIRLOCK_TEMPLATE_RAM_DIR=os.path.join(tmp, "template-ram"))
        env.pop("AIRLOCK_SOCKET", None)
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


if __name__ == "__main__":
    unittest.main()

"""Hostile code in a real VM (minimal image, 256 MiB) through the real daemon.

Every case ends with a typed outcome (`reason`) and is followed by an
ordinary exec in the same sandbox that must still work: the agent survives
whatever the code does. The minimal image has busybox only (no python).
"""

import json
import time
import unittest

from harness import ApiError, DaemonTestCase, UnixHTTPConnection

# Lists the command lines of every process in the guest (busybox only).
PS = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done"


class HostileTest(DaemonTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        # The smallest disk the image allows, so filling it is quick.
        cls.sb = cls.api.create(image="minimal", memory_mb=256, disk_mb=128, timeout=1800)
        cls.sid = cls.sb["id"]

    def assertStillWorks(self):
        out, err, ex = self.api.exec(self.sid, cmd="echo ok", timeout=60)
        self.assertEqual((out, ex["exit_code"], ex["reason"]), (b"ok\n", 0, "exited"), err)

    def guest_processes(self):
        out, _, _ = self.api.exec(self.sid, cmd=PS, timeout=60)
        return out.decode(errors="replace")

    def test_normal_exec_reports_exited_and_signaled(self):
        _, _, ex = self.api.exec(self.sid, cmd="exit 3")
        self.assertEqual((ex["exit_code"], ex["reason"], ex["truncated"]), (3, "exited", False))
        _, _, ex = self.api.exec(self.sid, cmd="kill -TERM $$")
        self.assertEqual((ex["signal"], ex["reason"]), (15, "signaled"))

    def test_infinite_loop_times_out(self):
        t0 = time.time()
        _, _, ex = self.api.exec(self.sid, cmd="while :; do :; done", timeout=2)
        self.assertEqual(ex["reason"], "timeout")
        self.assertTrue(ex["timed_out"])
        self.assertEqual(ex["signal"], 9)
        self.assertLess(time.time() - t0, 30)
        self.assertStillWorks()

    def test_cpu_seconds_limit(self):
        _, _, ex = self.api.exec(self.sid, cmd="while :; do :; done", timeout=120,
                                 limits={"cpu_seconds": 1})
        self.assertEqual(ex["reason"], "cpu_limit")
        self.assertFalse(ex["timed_out"])
        self.assertStillWorks()

    def test_fork_bomb_hits_pids_limit(self):
        _, _, ex = self.api.exec(self.sid, cmd="bomb() { bomb | bomb & }; bomb; sleep 30",
                                 timeout=15, limits={"pids": 32})
        self.assertEqual(ex["reason"], "pids_limit", ex)
        self.assertNotIn("sleep 30", self.guest_processes())
        self.assertStillWorks()

    def test_memory_hog_with_limit_is_oom_killed(self):
        # dd's 64 MiB buffer is filled from /dev/zero: every page is touched.
        _, _, ex = self.api.exec(self.sid, argv=["dd", "if=/dev/zero", "of=/dev/null", "bs=64M",
                                                 "count=1"], timeout=120, limits={"memory_mb": 24})
        self.assertEqual(ex["reason"], "oom_killed", ex)
        self.assertEqual(ex["signal"], 9)
        self.assertStillWorks()

    def test_memory_hog_past_guest_ram_is_oom_killed(self):
        # No limit: 5 x 60 MiB held at once is past the 256 MiB VM. The
        # kernel's OOM killer takes the exec (never the agent: -1000).
        _, _, ex = self.api.exec(
            self.sid, timeout=300,
            cmd="for i in 1 2 3 4 5; do dd if=/dev/zero of=/dev/null bs=60M count=100000 & done; wait")
        self.assertEqual(ex["reason"], "oom_killed", ex)
        self.assertStillWorks()

    def test_disk_fill_is_no_space(self):
        try:
            _, err, ex = self.api.exec(self.sid, cmd="dd if=/dev/zero of=/root/fill bs=1M",
                                       timeout=600)
            self.assertEqual(ex["reason"], "no_space", (ex, err))
            self.assertNotEqual(ex["exit_code"], 0)
            # Still full: an exec ended by its timeout is a timeout (the
            # agent's own kill, not the disk-space heuristic).
            _, err, ex = self.api.exec(self.sid, argv=["sleep", "100"], timeout=1)
            self.assertEqual((ex["reason"], ex["timed_out"]), ("timeout", True), (ex, err))
            self.assertStillWorks()
        finally:
            self.api.exec(self.sid, argv=["rm", "-f", "/root/fill"], timeout=120)
        _, _, ex = self.api.exec(self.sid, cmd="echo data > /root/after && cat /root/after")
        self.assertEqual(ex["reason"], "exited")

    def test_wget_without_network_fails_cleanly(self):
        # busybox 1.35's wget segfaulted on -T (images/minimal.sh patches
        # its option string); with no NIC every fetch fails with an ordinary
        # error, never a signal, started from sh or directly.
        for cmd in ["wget -T 3 -q -O - http://www.example.com/",
                    "wget -q -O - http://www.example.com/",
                    "wget -T 2 -O /dev/null http://192.0.2.1/",
                    "wget -O - http://localhost:1/"]:
            _, err, ex = self.api.exec(self.sid, cmd=cmd, timeout=60)
            self.assertNotEqual(ex["exit_code"], 0, (cmd, ex, err))
            self.assertLess(ex["exit_code"], 128, (cmd, ex, err))
            self.assertEqual((ex["signal"], ex["reason"]), (None, "exited"), (cmd, ex, err))
            self.assertIn(b"wget: ", err, cmd)
        _, err, ex = self.api.exec(self.sid, argv=["wget", "-T", "3", "http://www.example.com/"])
        self.assertEqual((ex["exit_code"], ex["signal"]), (1, None), err)
        # Names: /etc/hosts through the image's nsswitch.conf.
        out, err, ex = self.api.exec(self.sid, cmd="cat /etc/nsswitch.conf; ping -c 1 -W 2 localhost")
        self.assertEqual(ex["exit_code"], 0, (out, err))
        self.assertIn(b"hosts: files dns", out)
        self.assertIn(b"127.0.0.1", out)

    def test_inode_fill_is_no_space(self):
        try:
            _, err, ex = self.api.exec(
                self.sid, timeout=900,
                cmd="mkdir -p /root/inodes && cd /root/inodes && seq 1 40000 | xargs touch")
            self.assertEqual(ex["reason"], "no_space", (ex, err[-500:]))
            self.assertStillWorks()
        finally:
            self.api.exec(self.sid, argv=["rm", "-rf", "/root/inodes"], timeout=600)
        _, _, ex = self.api.exec(self.sid, cmd="touch /root/x && rm /root/x")
        self.assertEqual((ex["exit_code"], ex["reason"]), (0, "exited"))

    def test_output_flood_is_capped_and_counted(self):
        out, err, ex = self.api.exec(
            self.sid, cmd="head -c 3000000 /dev/zero; head -c 500000 /dev/zero >&2",
            output_limit_bytes=100000, timeout=300)
        self.assertEqual(ex["exit_code"], 0)
        self.assertTrue(ex["truncated"])
        self.assertEqual((len(out), len(err)), (100000, 100000))
        self.assertEqual((ex["stdout_bytes"], ex["stdout_dropped"]), (3000000, 2900000))
        self.assertEqual((ex["stderr_bytes"], ex["stderr_dropped"]), (500000, 400000))
        self.assertStillWorks()

    def test_double_forked_daemons_die_with_the_exec(self):
        # One keeps the exec's stdout open, one detaches fully: neither may
        # outlive the exec, nor hold its response back.
        t0 = time.time()
        out, _, ex = self.api.exec(self.sid, timeout=120, cmd=(
            "(setsid sleep 987001 &); "
            "(setsid sh -c 'sleep 987002 </dev/null >/dev/null 2>&1 &' &); "
            "sleep 1; echo started"))
        self.assertEqual((out, ex["reason"]), (b"started\n", "exited"))
        self.assertLess(time.time() - t0, 60)
        procs = self.guest_processes()
        self.assertNotIn("987001", procs)
        self.assertNotIn("987002", procs)
        self.assertStillWorks()

    def test_kill_exec_reports_killed(self):
        # Read the NDJSON stream line by line: the start event names the exec.
        conn = UnixHTTPConnection(self.sock, timeout=300)
        conn.request("POST", f"/v1/sandboxes/{self.sid}/exec",
                     body=json.dumps({"cmd": "sleep 600", "timeout": 300}),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        self.assertEqual(resp.status, 200)
        start = json.loads(resp.readline())
        self.assertEqual(start["type"], "start")
        self.api.call("DELETE", f"/v1/sandboxes/{self.sid}/exec/{start['exec_id']}")
        events = [json.loads(line) for line in resp if line.strip()]
        conn.close()
        self.assertEqual(events[-1]["type"], "exit")
        self.assertEqual((events[-1]["reason"], events[-1]["signal"]), ("killed", 9))
        self.assertStillWorks()

    def test_reader_that_stops_reading_bounds_daemon_memory(self):
        def rss_kb():
            with open(f"/proc/{self.daemon.pid}/status") as f:
                return int(next(l for l in f if l.startswith("VmRSS")).split()[1])
        before = rss_kb()
        conn = UnixHTTPConnection(self.sock, timeout=300)
        conn.request("POST", f"/v1/sandboxes/{self.sid}/exec",
                     body=json.dumps({"cmd": "cat /dev/zero", "timeout": 120}),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        self.assertEqual(resp.status, 200)
        resp.readline()  # the start event; then read nothing for a while
        time.sleep(8)
        grown_mb = (rss_kb() - before) / 1024
        conn.close()  # hang up: the daemon kills the exec
        self.assertLess(grown_mb, 32, f"airlockd grew {grown_mb:.1f} MiB behind a stalled reader")
        deadline = time.time() + 60
        while time.time() < deadline and "cat /dev/zero" in self.guest_processes():
            time.sleep(0.5)
        self.assertNotIn("cat /dev/zero", self.guest_processes())
        self.assertStillWorks()

    def test_limits_are_validated(self):
        for body, field in [({"limits": {"pids": 0}}, "limits.pids"),
                            ({"limits": {"memory_mb": -1}}, "limits.memory_mb"),
                            ({"limits": {"cpu_seconds": "x"}}, "limits.cpu_seconds"),
                            ({"limits": {"threads": 3}}, "threads"),
                            ({"limits": 5}, "limits"),
                            ({"output_limit_bytes": -1}, "output_limit_bytes"),
                            ({"background": "yes"}, "background")]:
            with self.assertRaises(ApiError) as cm:
                self.api.call("POST", f"/v1/sandboxes/{self.sid}/exec", dict(cmd="true", **body))
            self.assertEqual(cm.exception.status, 400, body)
            self.assertEqual(cm.exception.body["error"]["field"], field, body)


class BackgroundTest(DaemonTestCase):
    def test_background_exec_listed_waited_killed_and_gone_with_sandbox(self):
        sid = self.api.create(image="minimal", timeout=900)["id"]
        base = f"/v1/sandboxes/{sid}/exec"
        bg = self.api.call("POST", base, {"cmd": "sleep 876543", "background": True})
        self.assertTrue(bg["running"])
        self.assertGreater(bg["pid"], 1)
        quick = self.api.call("POST", base, {"argv": ["sh", "-c", "exit 3"], "background": True})
        listed = {e["exec_id"]: e for e in self.api.call("GET", base)}
        self.assertIn(bg["exec_id"], listed)
        self.assertEqual(listed[bg["exec_id"]]["argv"], ["/bin/sh", "-c", "sleep 876543"])
        self.assertTrue(listed[bg["exec_id"]]["running"])
        done = self.api.call("GET", f"{base}/{quick['exec_id']}?wait=60")
        self.assertEqual((done["running"], done["exit_code"], done["reason"]), (False, 3, "exited"))
        # Still running after a short wait; the foreground keeps working.
        self.assertTrue(self.api.call("GET", f"{base}/{bg['exec_id']}?wait=1")["running"])
        out, _, ex = self.api.exec(sid, cmd="echo ok")
        self.assertEqual(out, b"ok\n")
        self.api.call("DELETE", f"{base}/{bg['exec_id']}")
        killed = self.api.call("GET", f"{base}/{bg['exec_id']}?wait=60")
        self.assertEqual((killed["running"], killed["reason"]), (False, "killed"))
        with self.assertRaises(ApiError) as cm:
            self.api.call("GET", f"{base}/ex-nosuch")
        self.assertEqual(cm.exception.status, 404)
        # A second one is left running: it goes with the sandbox.
        self.api.call("POST", base, {"cmd": "sleep 876544", "background": True})
        self.assertTrue(any(e["running"] for e in self.api.call("GET", base)))
        self.api.delete(sid)
        self.assertNothingLeft(sid)


if __name__ == "__main__":
    unittest.main()

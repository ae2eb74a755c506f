"""`airlock shell` and `airlock exec --tty` as a person uses them: in a real
terminal (a tmux pane of the test's own tmux server), typing keys and reading
the screen, against a real daemon and VM."""

import base64
import json
import os
import shutil
import socket
import struct
import subprocess
import time
import unittest

from harness import BIN, IMAGE_DIR, DaemonTestCase

AIRLOCK = os.path.join(BIN, "airlock")


@unittest.skipUnless(shutil.which("tmux"), "tmux is not installed (scripts/setup.sh)")
class ShellTest(DaemonTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.sid = cls.api.create()["id"]
        cls.tmux_sock = os.path.join(cls.tmp, "tmux.sock")
        cls.env = dict(os.environ, AIRLOCK_SOCKET=cls.sock, AIRLOCK_DATA_DIR=cls.data_dir,
                       AIRLOCK_IMAGE_DIR=IMAGE_DIR, TERM="xterm-256color")
        cls.n = 0
        # One session that lives as long as the class keeps the tmux server
        # up: otherwise each test's kill-session ends the server, and the
        # next new-session can reach the dying server's socket and fail
        # ("server exited unexpectedly").
        subprocess.run(["tmux", "-S", cls.tmux_sock, "-f", "/dev/null", "new-session", "-d", "-s", "hold",
                        "sleep 100000"], env=cls.env, capture_output=True, text=True, check=True)

    @classmethod
    def tearDownClass(cls):
        subprocess.run(["tmux", "-S", cls.tmux_sock, "kill-server"], capture_output=True)
        super().tearDownClass()

    def tmux(self, *args):
        r = subprocess.run(["tmux", "-S", self.tmux_sock, "-f", "/dev/null", *args], env=self.env,
                           capture_output=True, text=True)
        if r.returncode != 0:
            self.fail(f"tmux {' '.join(args)}: exit {r.returncode}: {r.stderr.strip()}")
        return r.stdout

    def start(self, command, cols=80, rows=24):
        """A detached tmux session running `command` in a cols x rows pane; the
        pane stays after it ends (the sleep) so the screen can still be read.
        Returns (session, file the CLI's exit status is written to, file of
        `stty -a` run in the same terminal after the CLI exited)."""
        ShellTest.n += 1
        name = f"t{self.n}"
        code = os.path.join(self.tmp, name + ".code")
        stty = os.path.join(self.tmp, name + ".stty")
        self.tmux("new-session", "-d", "-s", name, "-x", str(cols), "-y", str(rows),
                  f"{command}; echo CODE=$? > {code}; stty -a > {stty}; sleep 300")
        self.addCleanup(lambda: subprocess.run(["tmux", "-S", self.tmux_sock, "kill-session", "-t", name],
                                               capture_output=True))
        return name, code, stty

    def screen(self, name):
        return self.tmux("capture-pane", "-p", "-t", name)

    def wait_screen(self, name, text, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            s = self.screen(name)
            if text in s:
                return s
            time.sleep(0.1)
        self.fail(f"{text!r} never appeared on the screen:\n{self.screen(name)}")

    def wait_file(self, path, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if os.path.exists(path) and os.path.getsize(path) > 0:
                time.sleep(0.1)
                with open(path) as f:
                    return f.read()
            time.sleep(0.1)
        self.fail(f"{path} was never written")

    def cli_pids(self):
        """The airlock CLI processes of this class's sandbox (not the sh around them)."""
        pids = subprocess.run(["pgrep", "-f", f"airlock (shell|exec --tty) {self.sid}"], capture_output=True,
                              text=True).stdout.split()
        out = []
        for p in pids:
            try:
                with open(f"/proc/{p}/comm") as f:
                    if f.read().strip() == "airlock":
                        out.append(int(p))
            except OSError:
                pass
        self.assertTrue(out, pids)
        return out

    def keys(self, name, *keys):
        self.tmux("send-keys", "-t", name, *keys)

    def type_until(self, name, line, text, timeout):
        """Types `line` + Enter every 0.5 s until `text` is on the screen."""
        deadline = time.time() + timeout
        while True:
            self.keys(name, line, "Enter")
            time.sleep(0.5)
            if text in self.screen(name) or time.time() > deadline:
                break
        self.assertIn(text, self.screen(name))

    def test_shell_vi_resize_ctrl_c_and_exit_code(self):
        name, code, stty = self.start(f"{AIRLOCK} shell {self.sid}")
        # Computed in the guest, so the typed command line cannot match.
        self.keys(name, "echo READY-$((6*7)); stty size", "Enter")
        self.wait_screen(name, "READY-42")
        self.wait_screen(name, "24 80")  # stty's answer comes after the echo's
        # TERM is the local terminal's (tmux sets it in its panes).
        term = self.tmux("show-options", "-gv", "default-terminal").strip()
        self.keys(name, "echo TERM=$TERM", "Enter")
        self.wait_screen(name, "TERM=" + term)

        # The window grows: the guest's terminal follows (SIGWINCH -> resize).
        self.tmux("resize-window", "-t", name, "-x", "120", "-y", "40")
        self.type_until(name, "clear; stty size", "40 120", 10)

        # A full-screen program: vi draws its status line on the last row,
        # and redraws there when the window shrinks under it.
        self.keys(name, "clear; vi /tmp/typed.txt", "Enter")
        # The typed command line shows the name too, before clear and vi run:
        # wait for the status line on the last row itself.
        deadline = time.time() + 15
        while time.time() < deadline:
            lines = self.screen(name).splitlines()
            if len(lines) > 39 and "/tmp/typed.txt" in lines[39]:
                break
            time.sleep(0.2)
        self.assertIn("/tmp/typed.txt", self.screen(name).splitlines()[39])
        self.keys(name, "ihello from vi", "Escape")
        self.wait_screen(name, "hello from vi")
        self.tmux("resize-window", "-t", name, "-x", "100", "-y", "30")
        deadline = time.time() + 10
        while time.time() < deadline:
            lines = self.screen(name).splitlines()
            if len(lines) == 30 and "/tmp/typed.txt" in lines[29]:
                break
            time.sleep(0.2)
        lines = self.screen(name).splitlines()
        self.assertEqual(len(lines), 30)
        self.assertIn("/tmp/typed.txt", lines[29], "vi did not redraw at the new size")
        self.keys(name, ":wq", "Enter")
        # Keys typed before vi has exited go to vi (seen under load): wait
        # until it is gone from the guest.
        deadline = time.time() + 15
        while time.time() < deadline:
            out, _, _ = self.api.exec(self.sid, argv=["sh", "-c", "pidof vi || true"])
            if not out.strip():
                break
            time.sleep(0.2)
        # The shell is back once it answers: keys typed in the moment between
        # vi's exit and the shell reading again were seen lost (a line that
        # lost its first word; not traced further), so ask until it answers.
        self.type_until(name, "clear; echo BACK-$((2*3))", "BACK-6", 15)
        self.keys(name, "clear; cat /tmp/typed.txt | tr a-z A-Z", "Enter")
        self.wait_screen(name, "HELLO FROM VI")

        # Ctrl-C reaches the foreground program (the guest pty's SIGINT).
        self.keys(name, "clear; sleep 100", "Enter")
        time.sleep(1)
        t0 = time.time()
        self.keys(name, "C-c")
        self.keys(name, "echo BACK-$((1+1))", "Enter")
        self.wait_screen(name, "BACK-2", timeout=10)
        self.assertLess(time.time() - t0, 10)

        # The shell's exit code is the CLI's, and the terminal is itself again.
        self.keys(name, "exit 7", "Enter")
        self.assertEqual(self.wait_file(code).strip(), "CODE=7")
        modes = self.wait_file(stty).split()
        for mode in ("icanon", "echo", "isig", "icrnl", "opost"):
            self.assertIn(mode, modes, f"terminal not restored: {modes}")

    def test_ctrl_d_ends_the_shell(self):
        name, code, stty = self.start(f"{AIRLOCK} shell {self.sid}")
        self.keys(name, "echo UP-$((2+3))", "Enter")
        self.wait_screen(name, "UP-5")
        self.keys(name, "C-d")
        self.assertEqual(self.wait_file(code).strip(), "CODE=0")
        self.assertIn("icanon", self.wait_file(stty).split())

    def test_exec_tty_size_and_exit_code(self):
        out = os.path.join(self.tmp, "tty.out")
        name, code, _ = self.start(
            f"{AIRLOCK} exec --tty {self.sid} -- sh -c 'stty size; tty; exit 3' > {out}", cols=100, rows=30)
        self.assertEqual(self.wait_file(code).strip(), "CODE=3")
        with open(out) as f:
            text = f.read()
        self.assertIn("30 100", text)
        self.assertIn("/dev/pts/", text)

    def test_exec_tty_from_a_pipe(self):
        # No local terminal: 80x24, and the end of the piped input is the
        # terminal's end of input (Ctrl-D), so cat ends.
        r = subprocess.run([AIRLOCK, "exec", "--tty", self.sid, "--", "sh", "-c", "stty size; cat; echo END"],
                           env=self.env, input=b"line one\n", capture_output=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(b"24 80", r.stdout)
        self.assertIn(b"line one\r\n", r.stdout)
        self.assertIn(b"END", r.stdout)
        r = subprocess.run([AIRLOCK, "exec", "--tty", "--timeout", "5", self.sid, "--", "true"], env=self.env,
                           capture_output=True, timeout=60)
        self.assertEqual(r.returncode, 2)
        self.assertIn(b"--tty takes only", r.stderr)

    def test_sigterm_to_the_cli_restores_the_terminal(self):
        name, code, stty = self.start(f"{AIRLOCK} shell {self.sid}")
        self.keys(name, "echo HI-$((3*3))", "Enter")
        self.wait_screen(name, "HI-9")
        cli = self.cli_pids()
        for p in cli:
            os.kill(p, 15)
        self.assertEqual(self.wait_file(code).strip(), "CODE=143")
        self.assertIn("icanon", self.wait_file(stty).split())
        self.assertIn("echo", self.wait_file(stty).split())

    def ws_first_reply(self, first):
        """Opens the pty WebSocket, sends `first` (a text frame) and returns
        the server's first text frame, parsed."""
        return self.ws_frames(first, until_text=1)[0][0]

    def ws_frames(self, first, until_text=None):
        """Opens the pty WebSocket and sends `first`; returns the server's text
        frames (parsed) and the terminal bytes of its binary frames, read until
        an exit or error frame (or `until_text` text frames) arrives."""
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(60)
        try:
            s.connect(self.sock)
            key = base64.b64encode(os.urandom(16)).decode()
            s.sendall(f"GET /v1/sandboxes/{self.sid}/pty HTTP/1.1\r\nHost: x\r\n"
                      "Connection: Upgrade\r\nUpgrade: websocket\r\n"
                      f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
            buf = b""
            while b"\r\n\r\n" not in buf:
                buf += s.recv(4096)
            head, buf = buf.split(b"\r\n\r\n", 1)
            self.assertTrue(head.startswith(b"HTTP/1.1 101"), head)
            payload, mask = json.dumps(first).encode(), os.urandom(4)
            assert len(payload) < 65536
            size = (bytes([0x80 | len(payload)]) if len(payload) < 126
                    else bytes([0x80 | 126]) + struct.pack(">H", len(payload)))
            s.sendall(bytes([0x81]) + size + mask +
                      bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))
            texts, data = [], b""
            while True:  # server frames are unmasked
                while len(buf) < 2 or len(buf) < 2 + (buf[1] & 0x7f if buf[1] & 0x7f < 126 else 2):
                    got = s.recv(4096)
                    if not got:
                        return texts, data
                    buf += got
                n, at = buf[1] & 0x7f, 2
                if n == 126:
                    n, at = struct.unpack(">H", buf[2:4])[0], 4
                while len(buf) < at + n:
                    buf += s.recv(4096)
                op, body, buf = buf[0] & 0x0f, buf[at:at + n], buf[at + n:]
                if op == 1:
                    texts.append(json.loads(body))
                    if texts[-1].get("type") in ("exit", "error") or len(texts) == until_text:
                        return texts, data
                elif op == 2:
                    data += body
                elif op == 8:
                    return texts, data
        finally:
            s.close()

    def test_pty_limits_and_the_start_events_pid(self):
        # A terminal's process tree gets the exec limits in a cgroup of its
        # own, and the start event names its guest pid (the containerd
        # shim pauses a terminal container's process by it).
        script = ("cat /sys/fs/cgroup$(cut -d: -f3 /proc/self/cgroup)/memory.max "
                  "/sys/fs/cgroup$(cut -d: -f3 /proc/self/cgroup)/pids.max; echo pid=$$")
        texts, data = self.ws_frames({"argv": ["sh", "-c", script], "cols": 80, "rows": 24,
                                      "limits": {"memory_mb": 48, "pids": 40}})
        start, end = texts[0], texts[-1]
        self.assertEqual(start["type"], "start", texts)
        self.assertEqual((end["type"], end.get("exit_code")), ("exit", 0), (texts, data))
        out = data.decode(errors="replace")
        self.assertIn(str(48 << 20), out)
        self.assertIn("40", out.split())
        self.assertGreater(start["pid"], 1)
        self.assertIn(f"pid={start['pid']}", out)
        # Out of range: an error frame naming the field, nothing started.
        ev = self.ws_first_reply({"cols": 80, "rows": 24, "limits": {"memory_mb": 0}})
        self.assertEqual((ev["type"], ev["error"]["field"]), ("error", "limits.memory_mb"), ev)

    def test_pty_attach_answers_bad_input(self):
        # The attach form of the first message (a pty exec of a previous
        # daemon): an unknown exec, a bad offset: error frames naming them.
        ev = self.ws_first_reply({"exec_id": "ex-nosuch", "offset": 0})
        self.assertEqual((ev["type"], ev["error"]["code"], ev["error"]["field"]),
                         ("error", "not_found", "exec_id"), ev)
        ev = self.ws_first_reply({"exec_id": "ex-nosuch", "offset": -5})
        self.assertEqual((ev["type"], ev["error"]["field"]), ("error", "offset"), ev)

    def test_zy_shell_survives_a_daemon_restart(self):
        # The shell runs on in the guest while airlockd is down (kill -9);
        # the CLI reattaches once it is back, from what it had printed, and
        # the terminal takes input again.
        name, code, stty = self.start(f"{AIRLOCK} shell {self.sid}")
        self.keys(name, "echo ON-$((4*4)); x=kept", "Enter")
        self.wait_screen(name, "ON-16")
        self.daemon.kill()
        self.daemon.wait()
        self.wait_screen(name, "reattaching")
        type(self).start_daemon()
        self.keys(name, "echo BACK-$((5*5))-$x", "Enter")
        self.wait_screen(name, "BACK-25-kept", timeout=120)
        # Nothing repeated: what was printed before the kill is there once.
        screen = self.screen(name)
        self.assertEqual((screen.count("ON-16"), screen.count("BACK-25-kept")), (1, 1), screen)
        self.keys(name, "exit 3", "Enter")
        self.assertEqual(self.wait_file(code, timeout=60).strip(), "CODE=3")
        self.assertIn("icanon", self.wait_file(stty).split())
        # Its end is journaled once, by the attach that saw it.
        logs = self.api.call("GET", f"/v1/sandboxes/{self.sid}/logs")
        ends = [r for r in logs if r.get("event") == "exec" and r.get("reattached")]
        self.assertEqual([r["exit_code"] for r in ends], [3], ends)

    def test_zz_daemon_gone_restores_the_terminal(self):
        # Last (zz): the daemon is killed under the session (the CLI does not
        # wait for it: AIRLOCK_REATTACH_SECONDS=0), then restarted,
        # re-adopting the VM for the class's cleanup.
        name, code, stty = self.start(f"AIRLOCK_REATTACH_SECONDS=0 {AIRLOCK} shell {self.sid}")
        self.keys(name, "echo ON-$((4*4))", "Enter")
        self.wait_screen(name, "ON-16")
        self.daemon.kill()
        self.daemon.wait()
        self.assertEqual(self.wait_file(code).strip(), "CODE=255")
        self.assertIn("icanon", self.wait_file(stty).split())
        self.assertIn("connection to airlockd was lost", self.screen(name))
        type(self).start_daemon()

    def top_order(self, name):
        """The sandbox ids in top's rows, top to bottom."""
        return [l.split()[0] for l in self.screen(name).splitlines() if l.startswith("sb-")]

    def test_top_lists_sorts_refreshes_and_quits(self):
        """`airlock top` in a real terminal: lists the running sandbox with
        its stats, re-sorts on a key, refreshes, quits on q and restores the
        terminal."""
        time.sleep(1.1)  # a younger second sandbox: ages differ by at least a second
        second = self.api.create()["id"]
        self.addCleanup(self.api.delete, second)
        name, code, stty = self.start(f"{AIRLOCK} top --interval 0.5", cols=140, rows=20)
        self.wait_screen(name, second)
        s = self.wait_screen(name, self.sid)
        self.assertIn("sort: cpu", s)
        for col in ("CPU%", "MEM", "DISK", "NET RX", "NET TX", "AGE"):
            self.assertIn(col, s)
        row = next(l for l in s.splitlines() if l.startswith(self.sid))
        self.assertIn("running", row)
        self.assertRegex(row, r"MiB")  # QEMU's resident memory
        self.keys(name, "m")
        self.wait_screen(name, "sort: mem")
        self.keys(name, "a")
        self.wait_screen(name, "sort: age")
        self.assertEqual(self.top_order(name), [self.sid, second])  # oldest first
        self.keys(name, "i")
        self.wait_screen(name, "sort: id")
        self.assertEqual(self.top_order(name), sorted([self.sid, second]))
        self.keys(name, "a")
        self.wait_screen(name, "sort: age")
        # It refreshes: the age column moves on by itself.
        first = next(l for l in self.screen(name).splitlines() if l.startswith(self.sid)).split()[-1]
        deadline = time.time() + 30
        while time.time() < deadline:
            now = next((l for l in self.screen(name).splitlines() if l.startswith(self.sid)), "").split()
            if now and now[-1] != first:
                break
            time.sleep(0.3)
        else:
            self.fail(f"top did not refresh the age {first}:\n{self.screen(name)}")
        self.keys(name, "q")
        self.assertEqual(self.wait_file(code).strip(), "CODE=0")
        self.assertIn(" icanon", self.wait_file(stty))  # the terminal mode is restored
        self.assertIn(" echo", self.wait_file(stty))

    def test_unknown_sandbox_is_a_clear_error(self):
        r = subprocess.run([AIRLOCK, "shell", "sb-000000000000"], env=self.env, capture_output=True,
                           text=True, timeout=60)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("sb-000000000000", r.stderr)


if __name__ == "__main__":
    unittest.main()


"""A daemon restart loses no output (issue 12): airlockd is killed with SIGKILL
while execs stream, and restarted on the same data dir; the execs keep running
in their guests, which keep their output, and clients attach again by offset.

Also: after a restart, DELETE and POST .../stdin reach an exec the killed
daemon started, and `airlock exec` resumes feeding a pipe into one.

Real daemon, real VMs (minimal image, 9 boots, five daemon kills): 33 s on a
2-core TCG host shared with other work (measured 2026-12-04; 24 s for the
first three tests on a quiet host).
"""

import base64
import hashlib
import json
import os
import signal
import subprocess
import threading
import time
import unittest

from harness import BIN, IMAGE_DIR, DaemonTestCase, observe

# The counter every exec prints: one number every 100 ms, at least COUNT of
# them and until the test creates /tmp/stop (so none can end before the
# daemon is killed, however slow the host), then exit 7.
COUNT = 60
COUNTER = ("i=0; while [ $i -lt %d ] || [ ! -e /tmp/stop ]; do echo $i; i=$((i+1)); sleep 0.1; done; exit 7"
           % COUNT)


def counted(n):
    return "".join("%d\n" % i for i in range(n)).encode()
def sha(b):
    return hashlib.sha256(b).hexdigest()


BUFFER = 65536  # --exec-buffer-bytes of this suite's daemon (the smallest allowed)


class Collector(threading.Thread):
    """Reads a pipe to its end into a buffer (so the test can look at it meanwhile)."""

    def __init__(self, pipe):
        super().__init__(daemon=True)
        self.pipe, self.data, self.lock = pipe, bytearray(), threading.Lock()
        self.start()

    def run(self):
        while True:
            chunk = os.read(self.pipe.fileno(), 65536)
            if not chunk:
                return
            with self.lock:
                self.data += chunk

    def get(self):
        with self.lock:
            return bytes(self.data)


class Stream:
    """A raw NDJSON response read line by line (the connection stays open)."""

    def __init__(self, api, method, path, body=None):
        self.conn = api.connection(300)
        headers = {"Content-Type": "application/json"} if body is not None else {}
        self.conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
        self.resp = self.conn.getresponse()
        self.method, self.path, self.events = method, path, []

    def next(self):
        line = self.resp.readline()
        if not line:
            return None
        ev = json.loads(line)
        self.events.append(ev)
        return ev

    def close(self):
        self.conn.close()


class ReattachTest(DaemonTestCase):
    daemon_args = ["--exec-buffer-bytes", str(BUFFER)]

    def kill_daemon(self):
        self.daemon.send_signal(signal.SIGKILL)
        self.daemon.wait()

    def restart_after(self, seconds):
        time.sleep(seconds)
        self.start_daemon()

    def journal_execs(self, sid, exec_id):
        return [r for r in self.api.call("GET", f"/v1/sandboxes/{sid}/logs")
                if r.get("event") == "exec" and r.get("exec_id") == exec_id]

    def journal_attaches(self, sid, exec_id):
        return [r for r in self.api.call("GET", f"/v1/sandboxes/{sid}/logs")
                if r.get("event") == "exec_attach" and r.get("exec_id") == exec_id]

    def attach(self, sid, exec_id, offset, until_bytes=None):
        """GET ?offset: (attach event, output bytes, exit event or None). With
        until_bytes, stops reading (and hangs up: detaches) after that many."""
        path = f"/v1/sandboxes/{sid}/exec/{exec_id}?offset={offset}"
        deadline = time.monotonic() + 30
        while True:
            s = Stream(self.api, "GET", path)
            # The previous client of this exec hung up; the daemon notices
            # (and detaches it) within about half a second: until then, 409.
            if s.resp.status != 409 or time.monotonic() > deadline:
                break
            s.resp.read()
            s.close()
            time.sleep(0.2)
        try:
            self.assertEqual(s.resp.status, 200)
            first = s.next()
            self.assertEqual(first["type"], "attach", first)
            out, exit_ev = bytearray(), None
            while until_bytes is None or len(out) < until_bytes:
                ev = s.next()
                if ev is None:
                    break
                if ev["type"] in ("stdout", "stderr"):
                    out += base64.b64decode(ev["data"])
                elif ev["type"] == "exit":
                    exit_ev = ev
                elif ev["type"] == "error":
                    self.fail(ev)
            observe("GET", path, 200, "application/x-ndjson",
                    b"".join(json.dumps(e).encode() + b"\n" for e in s.events))
            return first, bytes(out), exit_ev
        finally:
            s.close()

    def attach_error(self, sid, exec_id, offset, retry_conflict=True):
        deadline = time.monotonic() + 30
        while True:
            status, headers, data = self.api.raw("GET", f"/v1/sandboxes/{sid}/exec/{exec_id}?offset={offset}")
            if status != 409 or not retry_conflict or time.monotonic() > deadline:
                return status, json.loads(data)
            time.sleep(0.2)

    def test_five_clients_survive_a_daemon_kill(self):
        sids = [self.api.create()["id"] for _ in range(5)]
        env = dict(os.environ, AIRLOCK_SOCKET=self.sock, AIRLOCK_DATA_DIR=self.data_dir,
                   AIRLOCK_IMAGE_DIR=IMAGE_DIR, AIRLOCK_REATTACH_SECONDS="90")
        clients = [subprocess.Popen([os.path.join(BIN, "airlock"), "--socket", self.sock, "exec", sid,
                                     "--", "sh", "-c", COUNTER],
                                    env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE) for sid in sids]
        outs = [Collector(p.stdout) for p in clients]
        errs = [Collector(p.stderr) for p in clients]
        try:
            # Every client is streaming (some numbers printed), none is done.
            deadline = time.monotonic() + 180
            while any(o.get().count(b"\n") < 5 for o in outs):
                self.assertLess(time.monotonic(), deadline, [o.get()[-50:] for o in outs])
                time.sleep(0.1)
            self.kill_daemon()
            self.restart_after(5)
            for sid in sids:
                self.api.exec(sid, argv=["touch", "/tmp/stop"])
            for p in clients:
                p.wait(timeout=300)
        finally:
            for p in clients:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        for i, p in enumerate(clients):
            outs[i].join(10)
            errs[i].join(10)
            # Contiguous and complete: each number exactly once, in order.
            n = outs[i].get().count(b"\n")
            self.assertGreaterEqual(n, COUNT)
            self.assertEqual(outs[i].get(), counted(n), errs[i].get())
            self.assertEqual(p.returncode, 7, errs[i].get())
            self.assertNotIn(b"lost", errs[i].get())
        # The daemon re-adopted every sandbox; each exec's end is in its
        # journal once, marked as reattached.
        for i, sid in enumerate(sids):
            logs = self.api.call("GET", f"/v1/sandboxes/{sid}/logs")
            self.assertEqual(sum(r["event"] == "adopted" for r in logs), 1)
            recs = [r for r in logs if r.get("event") == "exec" and r["argv"][0] == "sh"]
            self.assertEqual(len(recs), 1, recs)
            self.assertEqual(recs[0]["exit_code"], 7)
            self.assertTrue(recs[0].get("reattached"), recs[0])
            # The CLI resumed once, from what it had printed, with a backlog
            # the guest kept while nobody read (the daemon was down); that
            # attach's record hashes exactly the rest.
            out = outs[i].get()
            att = [r for r in logs if r.get("event") == "exec_attach"]
            self.assertEqual(len(att), 1, att)
            self.assertGreater(att[0]["offset"], 0)
            self.assertGreater(att[0]["backlog"], 0)
            self.assertEqual((att[0]["dropped"], att[0]["end"]), (0, len(out)))
            self.assertEqual(att[0]["stdout_sha256"], sha(out[att[0]["offset"]:]))
            self.api.delete(sid)
            self.assertNothingLeft(sid)

    def test_attach_by_offset(self):
        sid = self.api.create()["id"]
        # A: 40 numbers at once, then waits for /tmp/go and prints "end".
        # B: waits for /tmp/go2, then floods 200000 bytes (more than the
        # buffer) while nobody is attached, and marks /tmp/b-done.
        streams = {}
        for name, cmd in (("a", "i=0; while [ $i -lt 40 ]; do echo $i; i=$((i+1)); done; "
                                "while [ ! -e /tmp/go ]; do sleep 0.1; done; echo end"),
                          ("b", "while [ ! -e /tmp/go2 ]; do sleep 0.1; done; "
                                "yes x 2>/dev/null | head -c 200000; touch /tmp/b-done")):
            s = Stream(self.api, "POST", f"/v1/sandboxes/{sid}/exec", {"cmd": cmd})
            self.assertEqual(s.resp.status, 200)
            start = s.next()
            self.assertEqual(start["type"], "start")
            streams[name] = (s, start["exec_id"])
        full_a = "".join("%d\n" % i for i in range(40)).encode()
        got = bytearray()
        while len(got) < len(full_a):
            ev = streams["a"][0].next()
            got += base64.b64decode(ev["data"])
        self.assertEqual(bytes(got), full_a)
        a, b = streams["a"][1], streams["b"][1]
        # The first client of a running exec is still there: attach is refused.
        status, body = self.attach_error(sid, a, 0, retry_conflict=False)
        self.assertEqual(status, 409, body)
        self.kill_daemon()
        for s, _ in streams.values():
            s.close()
        self.restart_after(1)

        # Offset 0 replays what the buffer holds (all of it: under the cap);
        # this client hangs up (detaches) once it has it.
        first, out, exit_ev = self.attach(sid, a, 0, until_bytes=len(full_a))
        self.assertEqual((first["offset"], first["dropped"], first["running"]), (0, 0, True), first)
        self.assertEqual(first["end"], len(full_a))
        self.assertEqual(out, full_a)
        self.assertIsNone(exit_ev)
        # A mid offset: exactly the rest.
        first, out, _ = self.attach(sid, a, 17, until_bytes=len(full_a) - 17)
        self.assertEqual((first["offset"], first["dropped"]), (17, 0))
        self.assertEqual(out, full_a[17:])
        # Beyond the end, negative, not a number: 400 naming the field.
        for bad in (len(full_a) + 1, -1, "x", "1e3", ""):
            status, body = self.attach_error(sid, a, bad)
            self.assertEqual(status, 400, (bad, body))
            self.assertEqual(body["error"]["field"], "offset", (bad, body))
        # An unknown exec: 404 naming it.
        status, body = self.attach_error(sid, "ex-nosuch", 0)
        self.assertEqual(status, 404, body)
        self.assertEqual(body["error"]["field"], "exec_id", body)
        self.assertIn("ex-nosuch", body["error"]["message"])
        # From the end: what comes after, then the exit; the exec is then
        # collected (404) and its journal record written once.
        self.api.exec(sid, argv=["touch", "/tmp/go"])
        first, out, exit_ev = self.attach(sid, a, len(full_a))
        self.assertEqual(out, b"end\n")
        self.assertEqual(exit_ev["exit_code"], 0, exit_ev)
        self.assertEqual(self.attach_error(sid, a, 0)[0], 404)
        recs = self.journal_execs(sid, a)
        self.assertEqual(len(recs), 1, recs)
        self.assertTrue(recs[0]["reattached"])
        # No daemon saw all of it: the end record has no output hash; each
        # attach journaled the hash of exactly what it delivered.
        self.assertNotIn("stdout_sha256", recs[0])
        self.assertEqual([(r["offset"], r["end"], r["stdout_sha256"], r["ended_by"])
                          for r in self.journal_attaches(sid, a)],
                         [(0, len(full_a), sha(full_a), "detach"),
                          (17, len(full_a), sha(full_a[17:]), "detach"),
                          (len(full_a), len(full_a) + 4, sha(b"end\n"), "exit")])

        # B overflows its buffer while nobody reads: the oldest bytes go and
        # the client is told how many.
        self.api.exec(sid, argv=["touch", "/tmp/go2"])
        deadline = time.monotonic() + 120
        while self.api.exec(sid, cmd="test -e /tmp/b-done && echo y || true")[0] != b"y\n":
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.5)
        first, out, exit_ev = self.attach(sid, b, 0)
        # (The agent may still be draining the last pipe-full when the
        # attach arrives; then the rest follows live.)
        self.assertGreaterEqual(first["offset"], 200000 - 2 * BUFFER, first)
        self.assertEqual(first["dropped"], first["offset"])
        self.assertEqual(first["lost"], first["offset"])
        self.assertEqual(first["offset"] + len(out), 200000)
        self.assertEqual(out, (b"x\n" * 100000)[first["offset"]:])
        self.assertEqual(exit_ev["exit_code"], 0, exit_ev)
        self.assertEqual(self.journal_execs(sid, b)[0]["output_lost"], first["offset"])
        self.assertEqual([(r["offset"], r["dropped"]) for r in self.journal_attaches(sid, b)],
                         [(first["offset"], first["offset"])])
        self.api.delete(sid)
        self.assertNothingLeft(sid)

    def test_cli_attach(self):
        sid = self.api.create()["id"]
        s = Stream(self.api, "POST", f"/v1/sandboxes/{sid}/exec",
                   {"cmd": "echo one; sleep 0.5; echo two >&2; while [ ! -e /tmp/go ]; do sleep 0.1; done; echo three; exit 3"})
        exec_id = s.next()["exec_id"]
        seen = bytearray()
        while len(seen) < len(b"one\ntwo\n"):
            ev = s.next()
            seen += base64.b64decode(ev["data"])
        self.kill_daemon()
        s.close()
        self.restart_after(1)
        self.api.exec(sid, argv=["touch", "/tmp/go"])
        p = subprocess.run([os.path.join(BIN, "airlock"), "--socket", self.sock, "attach", "--offset", "4",
                            sid, exec_id], capture_output=True, timeout=120)
        self.assertEqual(p.returncode, 3, p.stderr)
        self.assertEqual(p.stdout, b"three\n")
        self.assertEqual(p.stderr, b"two\n")
        self.api.delete(sid)
        self.assertNothingLeft(sid)

    def post_stdin(self, sid, exec_id, data, eof=False):
        status, _, body = self.api.raw("POST", f"/v1/sandboxes/{sid}/exec/{exec_id}/stdin"
                                       + ("?eof=true" if eof else ""), data,
                                       {"Content-Type": "application/octet-stream"})
        return status, json.loads(body)

    def test_kill_and_stdin_after_restart(self):
        """A restarted daemon reaches execs its predecessor started: DELETE
        signals a detached exec (and journals its end), POST .../stdin feeds
        one started with stdin_stream."""
        sid = self.api.create()["id"]
        sleeper = Stream(self.api, "POST", f"/v1/sandboxes/{sid}/exec", {"cmd": "echo up; sleep 600"})
        hasher = Stream(self.api, "POST", f"/v1/sandboxes/{sid}/exec",
                        {"argv": ["sha256sum"], "stdin_stream": True})
        a, b = sleeper.next()["exec_id"], hasher.next()["exec_id"]
        self.assertEqual(base64.b64decode(sleeper.next()["data"]), b"up\n")
        data = os.urandom(300000)
        status, w = self.post_stdin(sid, b, data[:100000])
        self.assertEqual((status, w["stdin_total"]), (200, 100000), w)
        self.kill_daemon()
        sleeper.close()
        hasher.close()
        self.restart_after(1)

        # The rest of the input, then eof: the guest kept the stdin open.
        status, w = self.post_stdin(sid, b, data[100000:], eof=True)
        self.assertEqual(status, 200, w)
        self.assertEqual((w["stdin_bytes"], w["stdin_total"], w["stdin_closed"]),
                         (200000, 300000, True), w)
        status, w = self.post_stdin(sid, b, b"late")
        self.assertEqual(status, 409, w)
        first, out, exit_ev = self.attach(sid, b, 0)
        self.assertEqual(out, (sha(data) + "  -\n").encode())
        self.assertEqual((exit_ev["exit_code"], exit_ev["stdin_bytes"]), (0, 300000), exit_ev)

        # Nobody is attached to the sleeper: DELETE kills it and its end is
        # journaled (the daemon collected it: a later attach is 404).
        status, _, body = self.api.raw("DELETE", f"/v1/sandboxes/{sid}/exec/{a}")
        self.assertEqual(status, 204, body)
        recs = self.journal_execs(sid, a)
        self.assertEqual(len(recs), 1, recs)
        self.assertEqual((recs[0]["reason"], recs[0]["signal"], recs[0]["reattached"]),
                         ("killed", 9, True), recs[0])
        self.assertEqual(self.attach_error(sid, a, 0)[0], 404)
        for gone in (a, "ex-nosuch"):
            status, _, body = self.api.raw("DELETE", f"/v1/sandboxes/{sid}/exec/{gone}")
            self.assertEqual(status, 404, body)
            self.assertEqual(json.loads(body)["error"]["field"], "exec_id")
        self.api.delete(sid)
        self.assertNothingLeft(sid)

    def test_cli_stdin_pipe_across_a_restart(self):
        """`airlock exec` streaming a pipe into the exec resumes feeding it
        after the daemon comes back: every byte once, in order."""
        sid = self.api.create()["id"]
        env = dict(os.environ, AIRLOCK_SOCKET=self.sock, AIRLOCK_DATA_DIR=self.data_dir,
                   AIRLOCK_IMAGE_DIR=IMAGE_DIR, AIRLOCK_REATTACH_SECONDS="90")
        p = subprocess.Popen([os.path.join(BIN, "airlock"), "--socket", self.sock, "exec", sid,
                              "--", "sh", "-c", "tee /tmp/in | sha256sum"],
                             env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        out, err = Collector(p.stdout), Collector(p.stderr)
        try:
            data = os.urandom(200000)
            p.stdin.write(data[:120000])
            p.stdin.flush()
            # Part of it reached the process before the daemon dies.
            deadline = time.monotonic() + 120
            while self.api.exec(sid, cmd="wc -c < /tmp/in 2>/dev/null || echo 0")[0] != b"120000\n":
                self.assertLess(time.monotonic(), deadline)
                time.sleep(0.3)
            self.kill_daemon()
            p.stdin.write(data[120000:])  # written while no daemon is there
            p.stdin.close()
            self.restart_after(2)
            p.wait(timeout=300)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        out.join(10)
        err.join(10)
        self.assertEqual(p.returncode, 0, err.get())
        self.assertEqual(out.get(), (sha(data) + "  -\n").encode(), err.get())
        self.assertEqual(self.api.get_file(sid, "/tmp/in"), data)
        self.api.delete(sid)
        self.assertNothingLeft(sid)


if __name__ == "__main__":
    unittest.main()

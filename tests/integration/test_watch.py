"""File watch: GET /v1/sandboxes/{id}/files/watch and `airlock watch`, on a
real daemon and a real minimal VM (inotify in the guest agent).

Events come from files made by execs in the guest; every wait has a
deadline and looks for a specific event (no sleeps that race).
"""

import json
import os
import select
import subprocess
import time
import urllib.parse

from harness import BIN, IMAGE_DIR, ApiError, DaemonTestCase, UnixHTTPConnection


class Watch:
    """One watch stream, read line by line with deadlines."""

    def __init__(self, sock, sid, path, recursive=False):
        q = urllib.parse.urlencode({"path": path, "recursive": "true" if recursive else "false"})
        self.conn = UnixHTTPConnection(sock, timeout=60)
        self.conn.request("GET", f"/v1/sandboxes/{sid}/files/watch?{q}")
        self.resp = self.conn.getresponse()
        self.status = self.resp.status
        self.headers = dict(self.resp.getheaders())
        self.events = []
        if self.status >= 400:
            self.error = json.loads(self.resp.read())
            self.close()
            return
        self.first = self.next(60)

    def next(self, timeout=30):
        """The next event, or None at the end of the stream."""
        self.conn.sock.settimeout(timeout)
        line = self.resp.readline()
        if not line:
            return None
        ev = json.loads(line)
        self.events.append(ev)
        return ev

    def until(self, pred, timeout=60):
        """Reads until an event satisfies `pred`; returns the events read."""
        seen = []
        deadline = time.time() + timeout
        while time.time() < deadline:
            ev = self.next(max(1, deadline - time.time()))
            if ev is None:
                raise AssertionError(f"stream ended before the event; saw {seen[-20:]}")
            seen.append(ev)
            if pred(ev):
                return seen
        raise AssertionError(f"no such event within {timeout}s; saw {seen[-20:]}")

    def until_event(self, type_, path, timeout=60):
        return self.until(lambda e: e.get("type") == type_ and e.get("path") == path, timeout)

    def close(self):
        self.resp.close()
        self.conn.close()


def events_of(evs, type_, path):
    return [e for e in evs if e.get("type") == type_ and e.get("path") == path]


class WatchTest(DaemonTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.sid = cls.api.create(image="minimal")["id"]

    def sh(self, script, sid=None):
        out, err, ex = self.api.exec(sid or self.sid, argv=["sh", "-c", script])
        self.assertEqual(ex["exit_code"], 0, err)
        return out

    def guest_watches(self):
        return self.api.call("GET", f"/v1/sandboxes/{self.sid}/info")["watch"]

    def wait_watches(self, n, timeout=15):
        """The guest's watch counters once it has `n` watches open (or at the deadline)."""
        deadline = time.time() + timeout
        while True:
            now = self.guest_watches()
            if now["watches"] == n or time.time() > deadline:
                return now
            time.sleep(0.2)

    def test_created_modified_renamed_deleted_and_not_recursive(self):
        self.sh("mkdir -p /tmp/w1/sub")
        w = Watch(self.sock, self.sid, "/tmp/w1")
        try:
            self.assertEqual(w.status, 200)
            self.assertEqual(w.headers.get("Content-Type"), "application/x-ndjson")
            self.assertEqual(w.first, {"type": "watching", "path": "/tmp/w1", "recursive": False,
                                       "dirs": 1})
            self.sh("cd /tmp/w1 && echo a > f && echo b >> f && mv f g && rm g && mkdir d"
                    " && echo x > sub/inner && echo x > d/inner2 && touch last")
            evs = w.until_event("created", "/tmp/w1/last")
            self.assertTrue(events_of(evs, "created", "/tmp/w1/f"), evs)
            self.assertTrue(events_of(evs, "modified", "/tmp/w1/f"), evs)
            ren = events_of(evs, "renamed", "/tmp/w1/g")
            self.assertEqual(ren, [{"type": "renamed", "path": "/tmp/w1/g", "old_path": "/tmp/w1/f",
                                    "is_dir": False}], evs)
            self.assertFalse(events_of(evs, "deleted", "/tmp/w1/f"), "a paired rename is not a delete")
            self.assertEqual(events_of(evs, "deleted", "/tmp/w1/g")[0]["is_dir"], False)
            self.assertEqual(events_of(evs, "created", "/tmp/w1/d")[0]["is_dir"], True)
            # Not recursive: nothing from inside subdirectories, old or new.
            inner = [e for e in evs if e.get("path", "").startswith(("/tmp/w1/sub/", "/tmp/w1/d/"))]
            self.assertEqual(inner, [])
            order = [e["type"] for e in evs if e.get("path") in ("/tmp/w1/f", "/tmp/w1/g")]
            self.assertEqual(order[0], "created")
            self.assertEqual(order[-1], "deleted")
        finally:
            w.close()

    def test_recursive_follows_new_subdirectories(self):
        self.sh("mkdir -p /tmp/w2/old")
        w = Watch(self.sock, self.sid, "/tmp/w2", recursive=True)
        try:
            self.assertEqual(w.first["dirs"], 2)
            self.sh("echo x > /tmp/w2/old/a && mkdir -p /tmp/w2/new/deep && echo y > /tmp/w2/new/deep/b")
            evs = w.until_event("created", "/tmp/w2/new/deep/b")
            self.assertTrue(events_of(evs, "created", "/tmp/w2/old/a"), evs)
            self.assertEqual(events_of(evs, "created", "/tmp/w2/new")[0]["is_dir"], True)
            self.assertEqual(events_of(evs, "created", "/tmp/w2/new/deep")[0]["is_dir"], True)
            # The new directories stay watched, and a renamed one keeps its paths right.
            self.sh("echo z > /tmp/w2/new/deep/c && mv /tmp/w2/new /tmp/w2/moved"
                    " && echo q > /tmp/w2/moved/deep/d")
            evs = w.until_event("created", "/tmp/w2/moved/deep/d")
            self.assertTrue(events_of(evs, "created", "/tmp/w2/new/deep/c"), evs)
            self.assertEqual(events_of(evs, "renamed", "/tmp/w2/moved"),
                             [{"type": "renamed", "path": "/tmp/w2/moved", "old_path": "/tmp/w2/new",
                               "is_dir": True}])
        finally:
            w.close()

    def test_overflow_is_reported_and_the_bound_holds(self):
        n = 20000
        self.sh("mkdir -p /tmp/w3")
        w = Watch(self.sock, self.sid, "/tmp/w3")
        try:
            # The client reads nothing while the guest makes n files: the daemon's
            # socket, the channel's credit window and the guest's queue fill,
            # and the guest drops (and counts) the rest instead of buffering.
            self.sh(f"cd /tmp/w3 && seq 1 {n} | xargs touch")
            # Reading again: what was held arrives, then the gap's overflow.
            evs = w.until(lambda e: e["type"] == "overflow", timeout=120)
            # The stream goes on normally after the gap.
            self.sh("touch /tmp/w3/sentinel")
            evs += w.until_event("created", "/tmp/w3/sentinel", timeout=60)
            overflow = [e for e in evs if e["type"] == "overflow"]
            dropped = sum(e["dropped"] for e in overflow)
            created = {e["path"] for e in evs if e["type"] == "created" and e["path"] != "/tmp/w3/sentinel"}
            self.assertGreater(dropped, 0)
            self.assertEqual(set(overflow[0]), {"type", "dropped"})
            # Every file is either reported or counted as dropped, and what was
            # held for the stalled client (guest queue, one credit window, the
            # socket) stayed far below n.
            self.assertGreaterEqual(len(created) + dropped, n)
            self.assertLess(len(created), n // 2, f"{len(created)} events were held")
        finally:
            w.close()

    def test_client_disconnect_releases_the_guest_watch(self):
        self.sh("mkdir -p /tmp/w4/a/b")
        # Earlier tests' watches (a killed CLI's too) are released first.
        base = self.wait_watches(0)
        self.assertEqual((base["watches"], base["watched_dirs"]), (0, 0), base)
        w = Watch(self.sock, self.sid, "/tmp/w4", recursive=True)
        self.assertEqual(w.first["dirs"], 3)
        now = self.guest_watches()
        self.assertEqual(now["watches"], base["watches"] + 1)
        self.assertEqual(now["watched_dirs"], base["watched_dirs"] + 3)
        w.close()  # no event is pending: only the hangup tells the daemon
        now = self.wait_watches(0)
        self.assertEqual((now["watches"], now["watched_dirs"]), (0, 0), now)
        logs = self.api.call("GET", f"/v1/sandboxes/{self.sid}/logs")
        done = [e for e in logs if e.get("op") == "watch" and e.get("path") == "/tmp/w4"]
        self.assertEqual(done[-1].get("reason"), "cancelled", done)

    def test_bad_paths_are_refused_before_streaming(self):
        self.sh("mkdir -p /tmp/w5 && echo x > /tmp/w5/file")
        cases = [
            ("/tmp/w5/missing", 404, "not_found"),
            ("/tmp/w5/file", 400, "invalid_argument"),
            ("relative/dir", 400, "invalid_argument"),
        ]
        for path, status, code in cases:
            w = Watch(self.sock, self.sid, path)
            self.assertEqual(w.status, status, (path, w.error))
            self.assertEqual(w.error["error"]["code"], code, w.error)
            self.assertEqual(w.error["error"]["field"], "path", w.error)
            if path.startswith("/"):
                self.assertIn(path, w.error["error"]["message"])
        with self.assertRaises(ApiError) as cm:
            self.api.call("GET", f"/v1/sandboxes/{self.sid}/files/watch?path=/tmp&depth=2")
        self.assertEqual((cm.exception.status, cm.exception.field), (400, "depth"))
        with self.assertRaises(ApiError) as cm:
            self.api.call("GET", f"/v1/sandboxes/{self.sid}/files/watch?path=/tmp&recursive=maybe")
        self.assertEqual((cm.exception.status, cm.exception.field), (400, "recursive"))
        with self.assertRaises(ApiError) as cm:
            self.api.call("GET", f"/v1/sandboxes/{self.sid}/files/watch")
        self.assertEqual((cm.exception.status, cm.exception.field), (400, "path"))
        with self.assertRaises(ApiError) as cm:
            self.api.call("GET", "/v1/sandboxes/sb-nosuch/files/watch?path=/tmp")
        self.assertEqual(cm.exception.status, 404)

    def test_watches_per_sandbox_are_capped(self):
        self.sh("mkdir -p /tmp/w9")
        self.wait_watches(0)
        cap = self.guest_watches()["max_watches"]
        open_ = []
        try:
            for _ in range(cap):
                w = Watch(self.sock, self.sid, "/tmp/w9")
                open_.append(w)
                self.assertEqual(w.status, 200, getattr(w, "error", None))
            over = Watch(self.sock, self.sid, "/tmp/w9")
            self.assertEqual(over.status, 503, over.error)
            self.assertEqual(over.error["error"]["code"], "unavailable")
            self.assertIn(f"{cap} watches", over.error["error"]["message"])
        finally:
            for w in open_:
                w.close()
        self.assertEqual(self.wait_watches(0)["watches"], 0)
        # Released: a new watch works again.
        w = Watch(self.sock, self.sid, "/tmp/w9")
        self.assertEqual(w.status, 200)
        w.close()

    def test_watched_directory_removed_ends_the_stream(self):
        self.sh("mkdir -p /tmp/w6")
        w = Watch(self.sock, self.sid, "/tmp/w6")
        try:
            self.sh("rmdir /tmp/w6")
            end = w.until(lambda e: e["type"] == "end")[-1]
            self.assertEqual(end["reason"], "path_deleted", end)
            self.assertIsNone(w.next(10))
        finally:
            w.close()

    def test_cli_watch_prints_events(self):
        self.sh("mkdir -p /tmp/w7")
        env = dict(os.environ, AIRLOCK_SOCKET=self.sock, AIRLOCK_DATA_DIR=self.data_dir,
                   AIRLOCK_IMAGE_DIR=IMAGE_DIR)

        def read_line(stream, deadline):
            while time.time() < deadline:
                r, _, _ = select.select([stream], [], [], 1)
                if r:
                    return stream.readline().decode().rstrip("\n")
            self.fail("airlock watch printed nothing in time")

        for json_out in (True, False):
            name = f"/tmp/w7/cli-{json_out}"
            args = [os.path.join(BIN, "airlock"), "watch", self.sid, "/tmp/w7", "-r"]
            p = subprocess.Popen(args + (["--json"] if json_out else []), env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            try:
                deadline = time.time() + 60
                # The watch is in place once it says so (stdout in JSON, else stderr).
                first = read_line(p.stdout if json_out else p.stderr, deadline)
                if json_out:
                    self.assertEqual(json.loads(first)["type"], "watching")
                else:
                    self.assertIn("watching /tmp/w7", first)
                self.sh(f"touch {name}")
                want = (json.dumps({"is_dir": False, "path": name, "type": "created"}) if json_out
                        else f"created {name}")
                lines = []
                while want not in lines:
                    lines.append(read_line(p.stdout, deadline))
                    if json_out:
                        lines[-1] = json.dumps(json.loads(lines[-1]), sort_keys=True)
            finally:
                p.terminate()
                p.wait(timeout=10)
                p.stdout.close()
                p.stderr.close()

    def test_sandbox_destroyed_ends_the_stream(self):
        sid = self.api.create(image="minimal")["id"]
        self.sh("mkdir -p /tmp/w8", sid=sid)
        w = Watch(self.sock, sid, "/tmp/w8")
        try:
            self.assertEqual(w.first["type"], "watching")
            self.api.delete(sid)
            end = w.until(lambda e: e["type"] in ("end", "error"), timeout=60)[-1]
            self.assertEqual(end["type"], "end", end)
            self.assertEqual(end["reason"], "sandbox_stopped", end)
            self.assertIn(sid, end["message"])
            self.assertIsNone(w.next(10))
        finally:
            w.close()

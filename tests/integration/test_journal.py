"""The tamper-evident journal and the filesystem diff, on a real daemon and
real minimal VMs.

* every exec record carries env keys (never values) and the SHA-256 of
  exactly the stdout/stderr the client received; file writes their SHA-256;
* GET .../events streams records as they are appended (follow);
* `airlock logs ID --verify` names each break made in a real journal:
  edited, deleted, inserted, reordered lines and a cut tail;
* GET .../changes (and `airlock diff`) lists exactly what the test changed
  in the guest, read from the disk layers on the host.

About 1-2 minutes under TCG (two minimal sandboxes).
"""

import hashlib
import json
import os
import shutil
import subprocess
import time

from harness import BIN, ApiError, DaemonTestCase, UnixHTTPConnection


def sha(b):
    return hashlib.sha256(b).hexdigest()


class JournalTest(DaemonTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.sid = cls.api.create(image="minimal")["id"]
        cls.env = dict(os.environ, AIRLOCK_SOCKET=cls.sock, AIRLOCK_DATA_DIR=cls.data_dir)

    def cli(self, *args):
        return subprocess.run([os.path.join(BIN, "airlock"), *args], env=self.env,
                              capture_output=True, text=True, timeout=300)

    def journal_path(self, sid):
        return os.path.join(self.data_dir, "audit", sid + ".jsonl")

    def records(self, sid):
        return self.api.call("GET", f"/v1/sandboxes/{sid}/events")

    def test_exec_record_hashes_what_the_client_received(self):
        out, err, ex = self.api.exec(
            self.sid, argv=["sh", "-c", "head -c 300000 /dev/zero | tr '\\0' x; echo; echo oops >&2"],
            env={"SECRET_TOKEN": "hunter2-value", "OTHER": "v"})
        self.assertEqual(ex["exit_code"], 0)
        self.assertEqual(len(out), 300001)
        rec = [r for r in self.records(self.sid)
               if r["event"] == "exec" and r.get("exec_id") == ex["exec_id"]]
        self.assertEqual(len(rec), 1, rec)
        rec = rec[0]
        self.assertEqual(rec["stdout_sha256"], sha(out))
        self.assertEqual(rec["stderr_sha256"], sha(err))
        self.assertEqual(rec["stdout_bytes"], len(out))
        self.assertEqual(sorted(rec["env_keys"]), ["OTHER", "SECRET_TOKEN"])
        self.assertIn("duration_ms", rec)
        self.assertIsInstance(rec["seq"], int)
        with open(self.journal_path(self.sid), "rb") as f:
            self.assertNotIn(b"hunter2-value", f.read())

    def test_file_write_record_has_sha256(self):
        data = os.urandom(5000)
        self.api.put_file(self.sid, "/root/blob.bin", data)
        recs = [r for r in self.records(self.sid)
                if r["event"] == "file" and r.get("path") == "/root/blob.bin" and r.get("op") == "write"]
        self.assertEqual(recs[-1]["sha256"], sha(data))
        self.assertEqual(recs[-1]["size"], 5000)

    def test_events_follow_streams_new_records(self):
        conn = UnixHTTPConnection(self.sock, timeout=120)
        conn.request("GET", f"/v1/sandboxes/{self.sid}/events?follow=true")
        resp = conn.getresponse()
        self.assertEqual(resp.status, 200)
        self.assertEqual(resp.getheader("Content-Type"), "application/x-ndjson")
        first = json.loads(resp.readline())
        self.assertEqual(first["seq"], 1)
        _, _, ex = self.api.exec(self.sid, argv=["true"])
        deadline = time.time() + 60
        while time.time() < deadline:
            r = json.loads(resp.readline())
            if r["event"] == "exec" and r.get("exec_id") == ex["exec_id"]:
                break
        else:
            self.fail("the exec record did not arrive on the stream")
        conn.close()

    def test_verify_names_each_break(self):
        sid = self.api.create(image="minimal")["id"]
        for i in range(6):
            self.api.exec(sid, argv=["sh", "-c", f"echo {i}"])
        self.api.delete(sid)
        ok = self.api.call("GET", f"/v1/sandboxes/{sid}/journal/verify")
        self.assertTrue(ok["ok"], ok)
        self.assertTrue(ok["signature_ok"])
        self.assertIsNone(ok["first_break"])
        r = self.cli("logs", sid, "--verify")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("chain intact", r.stdout)

        path = self.journal_path(sid)
        with open(path) as f:
            original = f.read().splitlines(keepends=True)
        n = len(original)
        self.assertGreater(n, 8)

        def edit(ls):
            rec = json.loads(ls[3])
            rec["argv"] = ["rm", "-rf", "/evidence"]
            ls[3] = json.dumps(rec, separators=(",", ":")) + "\n"

        cases = [
            ("edited", edit, 4),
            ("deleted", lambda ls: ls.pop(4), 5),
            ("inserted", lambda ls: ls.insert(6, ls[2]), 7),
            ("reordered", lambda ls: ls.__setitem__(slice(5, 7), [ls[6], ls[5]]), 6),
            ("truncated", lambda ls: ls.__delitem__(slice(n - 2, n)), n - 1),
        ]
        try:
            for kind, tamper, line in cases:
                with self.subTest(kind=kind):
                    ls = list(original)
                    tamper(ls)
                    with open(path, "w") as f:
                        f.writelines(ls)
                    rep = self.api.call("GET", f"/v1/sandboxes/{sid}/journal/verify")
                    self.assertFalse(rep["ok"])
                    self.assertEqual(rep["first_break"]["kind"], kind, rep["first_break"])
                    self.assertEqual(rep["first_break"]["line"], line, rep["first_break"])
                    r = self.cli("logs", sid, "--verify")
                    self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
                    self.assertIn(f"line {line}: {kind}", r.stdout)
        finally:
            with open(path, "w") as f:
                f.writelines(original)
        self.assertTrue(self.api.call("GET", f"/v1/sandboxes/{sid}/journal/verify")["ok"])

    def test_verify_unknown_sandbox_is_404(self):
        with self.assertRaises(ApiError) as c:
            self.api.call("GET", "/v1/sandboxes/sb-000000000000/journal/verify")
        self.assertEqual(c.exception.status, 404)
        with self.assertRaises(ApiError) as c:
            self.api.call("GET", "/v1/sandboxes/sb-000000000000/events")
        self.assertEqual(c.exception.status, 404)


# Paths the minimal guest OS itself touches between boot and the diff (the
# agent and busybox, not the test): allowed to appear, never required.
# /etc/machine-id: the agent writes the sandbox's fresh identity at every
# hello (api/guest-protocol.md), so whether it shows depends only on when the
# write reached the disk.
GUEST_NOISE = {"/etc/machine-id"}


class ChangesTest(DaemonTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.sid = cls.api.create(image="minimal")["id"]
        cls.env = dict(os.environ, AIRLOCK_SOCKET=cls.sock, AIRLOCK_DATA_DIR=cls.data_dir)

    def sh(self, script):
        out, err, ex = self.api.exec(self.sid, argv=["sh", "-c", script])
        self.assertEqual(ex["exit_code"], 0, err)
        return out

    def test_diff_shows_exactly_what_changed(self):
        # What the guest OS changed on its own before the test did anything.
        before = self.api.call("GET", f"/v1/sandboxes/{self.sid}/changes")
        noise = {c["path"] for c in before["changes"]} | GUEST_NOISE
        print("guest noise:", sorted(noise))
        old_mode = self.sh("stat -c %a /etc/passwd").decode().strip()
        self.api.put_file(self.sid, "/root/new.txt", b"hello\n")
        self.sh("printf 'added line\\n' >> /etc/hosts && rm /etc/nsswitch.conf && "
                "chmod 600 /etc/passwd && ln -s /etc/shadow /root/link && mkdir /root/dir && "
                "head -c 2000 /dev/urandom > /root/bin.dat && printf '\\0' >> /root/bin.dat")
        t0 = time.time()
        r = self.api.call("GET", f"/v1/sandboxes/{self.sid}/changes?since=start&content=true")
        print(f"diff of the minimal sandbox: {time.time() - t0:.2f}s, timing {r['timing_ms']}")
        expected = {"/root/new.txt", "/etc/hosts", "/etc/nsswitch.conf", "/etc/passwd",
                    "/root/link", "/root/dir", "/root/bin.dat"}
        # Noise may include a path the test changes too (the agent writes
        # /etc/hosts at boot): those are still required.
        got = {c["path"]: c for c in r["changes"] if c["path"] not in noise or c["path"] in expected}
        self.assertEqual(set(got), expected, json.dumps(r["changes"], indent=1)[:4000])
        self.assertEqual(got["/root/new.txt"]["change"], "added")
        self.assertEqual(got["/root/new.txt"]["size"], 6)
        self.assertIn("+hello", got["/root/new.txt"]["diff"])
        hosts = got["/etc/hosts"]
        self.assertEqual(hosts["change"], "modified")
        self.assertEqual(hosts["what"], ["content"])
        self.assertIn("+added line", hosts["diff"])
        self.assertTrue(hosts["diff"].startswith("--- a/etc/hosts\n+++ b/etc/hosts\n"), hosts["diff"])
        self.assertEqual(got["/etc/nsswitch.conf"]["change"], "deleted")
        pw = got["/etc/passwd"]
        self.assertEqual(pw["what"], ["mode"])
        self.assertEqual(pw["mode"], "0600")
        self.assertEqual(pw["before"]["mode"], old_mode.zfill(4))
        self.assertEqual(got["/root/link"]["type"], "symlink")
        self.assertEqual(got["/root/link"]["target"], "/etc/shadow")
        self.assertEqual(got["/root/dir"]["type"], "dir")
        self.assertTrue(got["/root/bin.dat"]["binary"])
        self.assertNotIn("diff", got["/root/bin.dat"])

        r = subprocess.run([os.path.join(BIN, "airlock"), "diff", self.sid, "--content"], env=self.env,
                           capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("A file 0644 6 /root/new.txt", r.stdout)
        self.assertIn("D file", r.stdout)
        self.assertIn("/root/link -> /etc/shadow", r.stdout)
        self.assertIn("+added line", r.stdout)

    def test_since_other_than_start_is_400(self):
        with self.assertRaises(ApiError) as c:
            self.api.call("GET", f"/v1/sandboxes/{self.sid}/changes?since=snap-1")
        self.assertEqual(c.exception.status, 400)
        self.assertEqual(c.exception.body["error"]["field"], "since")

    def test_unknown_sandbox_is_404(self):
        with self.assertRaises(ApiError) as c:
            self.api.call("GET", "/v1/sandboxes/sb-000000000000/changes")
        self.assertEqual(c.exception.status, 404)

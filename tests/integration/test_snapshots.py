"""Pause/resume, snapshots (disk and memory), restore and fork on real VMs
(minimal image) through the real daemon (issue 12).

81 s under TCG on a quiet 2-core host (2026-12-04): 20 pause/resume
cycles, a daemon restart with a paused sandbox, a handful of restores and
forks, a full snapshot dir (a tmpfs the test mounts; skipped unless root).
"""

import base64
import os
import subprocess
import threading
import time
import unittest

import harness
from harness import ApiError, DaemonTestCase

# Appends 1, 2, 3, ... to /root/counts, one line every 0.2 s, forever; its
# pid in /root/counter.pid (the minimal image has no pkill).
COUNTER = ("echo $$ > /root/counter.pid; i=0; "
           "while true; do i=$((i+1)); echo $i >> /root/counts; sleep 0.2; done")


def counts(api, sid, missing_ok=False):
    """The counter's lines, checked to be exactly 1..N (no gap, no repeat)."""
    out, _, ex = api.exec(sid, argv=["cat", "/root/counts"])
    if ex["exit_code"] != 0:
        if missing_ok:
            return []
        raise AssertionError("no counts file in " + sid)
    nums = [int(x) for x in out.split()]
    if nums != list(range(1, len(nums) + 1)):
        raise AssertionError(f"counts of {sid} are not 1..N: ... {nums[-5:]}")
    return nums


def start_counter(api, sid):
    api.call("POST", f"/v1/sandboxes/{sid}/exec", {"cmd": COUNTER, "background": True})


def wait_counts_grow(test, api, sid, than, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        n = len(counts(api, sid, missing_ok=True))
        if n > than:
            return n
        time.sleep(0.5)
    test.fail(f"the counter in {sid} did not go past {than}")


class PauseResumeTest(DaemonTestCase):
    def test_a_twenty_cycles_lose_nothing(self):
        sb = self.api.create(timeout=3600)
        sid = sb["id"]
        start_counter(self.api, sid)
        files = {}
        last = 0
        for cycle in range(20):
            data = os.urandom(4096 + cycle * 1000)
            self.api.put_file(sid, f"/root/file{cycle}", data)
            files[f"/root/file{cycle}"] = data
            last = wait_counts_grow(self, self.api, sid, last)
            p = self.api.call("POST", f"/v1/sandboxes/{sid}/pause")
            self.assertEqual(p["state"], "paused")
            self.assertNotIn("pid", p)  # no QEMU while paused
            with self.assertRaises(ApiError) as ctx:
                self.api.exec(sid, argv=["true"])
            self.assertEqual(ctx.exception.status, 409)
            r = self.api.call("POST", f"/v1/sandboxes/{sid}/resume")
            self.assertEqual(r["state"], "running")
            nums = counts(self.api, sid)  # every count so far, in order
            self.assertGreaterEqual(len(nums), last)
            for path, want in files.items():
                self.assertEqual(self.api.get_file(sid, path), want, path)
        # The same counter process all along: it keeps counting after the last resume.
        wait_counts_grow(self, self.api, sid, len(counts(self.api, sid)))
        with self.assertRaises(ApiError) as ctx:
            self.api.call("POST", f"/v1/sandboxes/{sid}/resume")
        self.assertEqual(ctx.exception.status, 409)
        self.api.delete(sid)
        self.assertNothingLeft(sid)

    def test_b_pause_during_an_exec(self):
        """A pause ends a foreground exec: its client gets a typed 409 and its
        process is killed (it never finishes after resume); the journal says so."""
        sid = self.api.create(timeout=900)["id"]
        events = []
        errors = []

        def run():
            try:
                events.extend(self.api.exec_events(
                    sid, cmd="touch /root/exec-started; for i in $(seq 1 40); do echo $i; sleep 0.1; done; "
                             "echo done > /root/exec-done"))
            except ApiError as e:
                errors.append(e)

        t = threading.Thread(target=run)
        t.start()
        deadline = time.time() + 60
        while time.time() < deadline:  # running in the guest, printing
            if self.api.exec(sid, argv=["test", "-e", "/root/exec-started"])[2]["exit_code"] == 0:
                break
            time.sleep(0.1)
        self.api.call("POST", f"/v1/sandboxes/{sid}/pause")
        t.join(60)
        self.assertFalse(t.is_alive())
        self.assertEqual(errors, [])
        ends = [e for e in events if e["type"] in ("error", "exit")]
        self.assertEqual(len(ends), 1, events[-3:])
        self.assertEqual(ends[0]["type"], "error", ends[0])
        self.assertEqual(ends[0]["error"]["code"], "conflict")
        self.assertIn("paused during the call", ends[0]["error"]["message"])
        self.api.call("POST", f"/v1/sandboxes/{sid}/resume")
        # The loop would have finished 4 s after it started: it never does.
        time.sleep(5)
        _, _, ex = self.api.exec(sid, argv=["test", "-e", "/root/exec-done"])
        self.assertNotEqual(ex["exit_code"], 0)
        recs = self.api.call("GET", f"/v1/sandboxes/{sid}/events")
        killed = [r for r in recs if r["event"] == "exec" and r.get("ended_by") == "pause"]
        self.assertEqual(len(killed), 1, [r["event"] for r in recs])
        self.assertEqual(killed[0]["signal"], 9)
        self.assertIn("paused", [r["event"] for r in recs])
        self.assertIn("resumed", [r["event"] for r in recs])
        self.api.delete(sid)

    def test_c_paused_survives_a_daemon_restart(self):
        sid = self.api.create(timeout=900)["id"]
        start_counter(self.api, sid)
        n = wait_counts_grow(self, self.api, sid, 2)
        self.api.call("POST", f"/v1/sandboxes/{sid}/pause")
        self.daemon.kill()
        self.daemon.wait()
        type(self).start_daemon()
        self.assertEqual(self.api.call("GET", f"/v1/sandboxes/{sid}")["state"], "paused")
        self.assertEqual(self.api.call("POST", f"/v1/sandboxes/{sid}/resume")["state"], "running")
        self.assertGreaterEqual(len(counts(self.api, sid)), n)
        wait_counts_grow(self, self.api, sid, len(counts(self.api, sid)))
        self.api.delete(sid)
        self.assertNothingLeft(sid)


    def test_d_on_idle_pause(self):
        """idle_timeout with on_idle "pause": the reaper pauses instead of destroying."""
        sid = self.api.create(timeout=900, idle_timeout=2, on_idle="pause")["id"]
        self.api.put_file(sid, "/root/kept", b"kept\n")
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.api.call("GET", f"/v1/sandboxes/{sid}")["state"] == "paused":
                break
            time.sleep(0.5)
        self.assertEqual(self.api.call("GET", f"/v1/sandboxes/{sid}")["state"], "paused")
        self.api.call("POST", f"/v1/sandboxes/{sid}/resume")
        self.assertEqual(self.api.get_file(sid, "/root/kept"), b"kept\n")
        self.api.delete(sid)


class SnapshotTest(DaemonTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.src = cls.api.create(timeout=3600)["id"]
        cls.api.put_file(cls.src, "/root/installed", b"custom environment\n")
        start_counter(cls.api, cls.src)

    def remove_image_quietly(self, name):
        for _ in range(2):
            try:
                self.api.call("DELETE", f"/v1/images/{name}")
                return
            except ApiError as e:
                if e.status != 409:
                    return
                self.api.call("POST", "/v1/prune")  # a template of it holds it

    def snap(self, name, memory=False, sid=None):
        return self.api.call("POST", f"/v1/sandboxes/{sid or self.src}/snapshots",
                             {"name": name, "memory": memory})

    def test_a_disk_snapshot_and_create_from_it(self):
        s = self.snap("env1")
        self.assertEqual(s["name"], "env1")
        self.assertFalse(s["memory"])
        self.assertIn("layer.qcow2", s["files"])
        self.assertEqual(self.api.call("GET", "/v1/snapshots/env1")["source"], self.src)
        self.assertIn("env1", [x["name"] for x in self.api.call("GET", "/v1/snapshots")])
        new = self.api.create(**{"from": "env1"})
        self.assertEqual(new["from"], "env1")
        self.assertEqual(self.api.get_file(new["id"], "/root/installed"), b"custom environment\n")
        # changes?since=SNAPSHOT: read from the layers, only what changed after it.
        self.api.put_file(new["id"], "/root/after-snap", b"new\n")
        self.api.put_file(new["id"], "/root/installed", b"changed environment\n")
        diff = self.api.call("GET", f"/v1/sandboxes/{new['id']}/changes?since=env1")
        by_path = {c["path"]: c["change"] for c in diff["changes"]}
        self.assertEqual(by_path.get("/root/after-snap"), "added", by_path)
        self.assertEqual(by_path.get("/root/installed"), "modified", by_path)
        self.assertEqual(diff["since"], "env1")
        for bad, status in [("no-such", 400), ("a/b", 400)]:
            with self.assertRaises(ApiError) as ctx:
                self.api.call("GET", f"/v1/sandboxes/{new['id']}/changes?since={bad}")
            self.assertEqual((ctx.exception.status, ctx.exception.field), (status, "since"))
        # A disk snapshot has no processes: the counter does not run there.
        out, _, _ = self.api.exec(new["id"], cmd="pgrep -f '[c]ounts' || echo none")
        self.assertEqual(out.strip(), b"none")
        with self.assertRaises(ApiError) as ctx:
            self.api.call("DELETE", "/v1/snapshots/env1")
        self.assertEqual(ctx.exception.status, 409)
        self.assertIn(new["id"], ctx.exception.message)
        self.api.delete(new["id"])

        # `airlock image save`: the snapshot's disk becomes a named image that
        # no longer needs the snapshot.
        self.addCleanup(self.remove_image_quietly, "env1-img")  # the image dir is shared
        self.addCleanup(self.remove_image_quietly, "env1-cli")
        saved = self.api.call("POST", "/v1/snapshots/env1/image", {"name": "env1-img"})
        self.assertEqual(saved["name"], "env1-img")
        env = dict(os.environ, AIRLOCK_SOCKET=self.sock, AIRLOCK_DATA_DIR=self.data_dir)
        r = subprocess.run([os.path.join(harness.BIN, "airlock"), "image", "save", "env1", "env1-cli"],
                           env=env, capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("env1-cli", r.stdout)
        self.api.call("DELETE", "/v1/images/env1-cli")
        img = self.api.call("GET", "/v1/images/env1-img")
        self.assertEqual((img["kind"], img["source"]), ("installed", "snapshot:env1"))
        self.assertEqual(img["config"]["base"], "minimal")
        for body, status, field in [({"name": "env1-img"}, 409, "name"), ({}, 400, "name")]:
            with self.assertRaises(ApiError) as ctx:
                self.api.call("POST", "/v1/snapshots/env1/image", body)
            self.assertEqual((ctx.exception.status, ctx.exception.field), (status, field))
        with self.assertRaises(ApiError) as ctx:
            self.api.call("POST", "/v1/snapshots/no-such/image", {"name": "x-img"})
        self.assertEqual((ctx.exception.status, ctx.exception.field), (404, "snapshot"))
        self.api.call("DELETE", "/v1/snapshots/env1")
        sid = self.api.create(image="env1-img")["id"]
        try:
            self.assertEqual(self.api.get_file(sid, "/root/installed"), b"custom environment\n")
        finally:
            self.api.delete(sid)
        # The create may have made a template of the image (a cache that holds
        # it: image rm names it); prune removes templates no sandbox uses.
        self.api.call("POST", "/v1/prune")
        self.api.call("DELETE", "/v1/images/env1-img")
        with self.assertRaises(ApiError) as ctx:
            self.api.call("GET", "/v1/snapshots/env1")
        self.assertEqual(ctx.exception.status, 404)

    def test_b_bad_names_and_unknown_snapshots(self):
        for bad in ["a/b", "..", "a\u0000b", ""]:
            with self.assertRaises(ApiError) as ctx:
                self.snap(bad)
            self.assertEqual(ctx.exception.status, 400, bad)
            self.assertEqual(ctx.exception.field, "name")
        with self.assertRaises(ApiError) as ctx:
            self.api.create(**{"from": "no-such-snapshot"})
        self.assertEqual(ctx.exception.status, 400)
        self.assertEqual(ctx.exception.field, "from")

    def test_c_memory_snapshot_restored_twice_at_once(self):
        before = len(counts(self.api, self.src))
        s = self.snap("mem1", memory=True)
        self.assertTrue(s["memory"])
        made, errors = [], []

        def restore():
            try:
                made.append(self.api.create(**{"from": "mem1"}))
            except ApiError as e:
                errors.append(e)

        threads = [threading.Thread(target=restore) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        self.assertEqual(errors, [])
        self.assertEqual(len(made), 2)
        a, b = made[0]["id"], made[1]["id"]
        self.assertNotEqual(a, b)
        for sid in (a, b):
            self.assertEqual(self.api.call("GET", f"/v1/sandboxes/{sid}")["start"], "snapshot")
            # The counter process came along and keeps counting from where it was.
            self.assertGreaterEqual(len(counts(self.api, sid)), before)
            wait_counts_grow(self, self.api, sid, len(counts(self.api, sid)))
        # A fresh identity each: hostname and machine-id differ.
        ident = {}
        for sid in (a, b, self.src):
            out, _, _ = self.api.exec(sid, cmd="hostname; cat /etc/machine-id")
            ident[sid] = out
        self.assertEqual(len(set(ident.values())), 3)
        # RNG reseeded: two restores of one memory image draw different bytes.
        draws = {self.api.exec(sid, cmd="head -c 16 /dev/urandom | od -An -tx1")[0] for sid in (a, b)}
        self.assertEqual(len(draws), 2)
        self.assertTrue(ident[a].startswith(a.encode()))
        # Independent: a file written in one is seen in no other.
        self.api.put_file(a, "/root/only-a", b"a")
        for sid in (b, self.src):
            _, _, ex = self.api.exec(sid, argv=["test", "-e", "/root/only-a"])
            self.assertNotEqual(ex["exit_code"], 0)
        self.api.delete(a)
        self.api.delete(b)
        self.api.call("DELETE", "/v1/snapshots/mem1")

    def fork_ram_holders(self):
        """(pid, inode) of each fd on a fork's RAM memfd held by this test's
        daemon or its QEMUs (root: the QEMUs run as jail uids)."""
        held = []
        for pid in [self.daemon.pid] + harness.qemu_pids_for(self.data_dir):
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
            except OSError:
                continue
            for fd in fds:
                path = f"/proc/{pid}/fd/{fd}"
                try:
                    if os.readlink(path).startswith("/memfd:airlock-fork-ram"):
                        held.append((pid, os.stat(path).st_ino))
                except OSError:
                    pass
        return held

    def test_d_fork(self):
        # A page of guest RAM only (tmpfs) written before the fork: the forks
        # map the source's RAM copy-on-write, so a write in one must stay there.
        _, _, ex = self.api.exec(self.src, cmd="mkdir -p /run/cow && mount -t tmpfs cow /run/cow "
                                               "&& echo source > /run/cow/mark")
        self.assertEqual(ex["exit_code"], 0)
        r = self.api.call("POST", f"/v1/sandboxes/{self.src}/fork", {"count": 2})
        forks = [x["id"] for x in r["sandboxes"]]
        self.assertEqual(len(forks), 2)
        self.api.exec(forks[0], cmd="echo fork0 > /run/cow/mark")
        self.assertEqual(self.api.exec(forks[0], argv=["cat", "/run/cow/mark"])[0], b"fork0\n")
        for sid in (forks[1], self.src):
            self.assertEqual(self.api.exec(sid, argv=["cat", "/run/cow/mark"])[0], b"source\n")
        if os.geteuid() == 0:
            # One sealed RAM copy, mapped by both forks' QEMUs; the daemon
            # kept none once they started.
            held = self.fork_ram_holders()
            self.assertEqual({p for p, _ in held},
                             {harness.qemu_pids_for(sid)[0] for sid in forks}, held)
            self.assertEqual(len({ino for _, ino in held}), 1, held)
        self.assertEqual(self.api.call("GET", f"/v1/sandboxes/{self.src}")["state"], "running")
        for i, sid in enumerate(forks):
            self.api.put_file(sid, "/root/fork-mark", str(i).encode())
        for i, sid in enumerate(forks):
            self.assertEqual(self.api.get_file(sid, "/root/fork-mark"), str(i).encode())
            wait_counts_grow(self, self.api, sid, len(counts(self.api, sid)))
        _, _, ex = self.api.exec(self.src, argv=["test", "-e", "/root/fork-mark"])
        self.assertNotEqual(ex["exit_code"], 0)
        # Memory: each fork's counter runs on its own: stopping one stops only it.
        self.api.exec(forks[0], cmd="kill $(cat /root/counter.pid)")
        time.sleep(1)
        n0 = len(counts(self.api, forks[0]))
        wait_counts_grow(self, self.api, forks[1], len(counts(self.api, forks[1])))
        wait_counts_grow(self, self.api, self.src, len(counts(self.api, self.src)))
        time.sleep(1)
        self.assertEqual(len(counts(self.api, forks[0])), n0)
        # The forks' snapshot is listed (internal) but cannot be restored:
        # its RAM lives only in the forks' memfd. 409 naming `from`, and
        # nothing is created.
        internal = [x for x in self.api.call("GET", "/v1/snapshots") if x["internal"]]
        self.assertEqual(len(internal), 1, internal)
        # The source stood still for part of the fork only (the split of its
        # RAM and the restores came after it continued), and the journal
        # says how long.
        self.assertGreater(internal[0]["paused_ms"], 0)
        self.assertLess(internal[0]["paused_ms"], internal[0]["took_ms"])
        rec = [e for e in self.api.call("GET", f"/v1/sandboxes/{self.src}/events")
               if e.get("event") == "fork"][-1]
        self.assertEqual(rec["paused_ms"], internal[0]["paused_ms"], rec)
        self.assertGreaterEqual(rec["took_ms"], rec["paused_ms"], rec)
        internal = [x["name"] for x in internal]
        before = {x["id"] for x in self.api.call("GET", "/v1/sandboxes")}
        with self.assertRaises(ApiError) as ctx:
            self.api.create(image="minimal", **{"from": internal[0]})
        self.assertEqual((ctx.exception.status, ctx.exception.field), (409, "from"))
        self.assertIn("fork", str(ctx.exception))
        self.assertEqual({x["id"] for x in self.api.call("GET", "/v1/sandboxes")}, before)
        for sid in forks:
            self.api.delete(sid)
        # The fork's own snapshot went with its last fork, its RAM with them.
        self.assertEqual([x for x in self.api.call("GET", "/v1/snapshots") if x["internal"]], [])
        self.assertEqual(self.fork_ram_holders(), [])
        # Removing it left the template's disk (its base.qcow2 is a hard link
        # to it) readable: the source, a clone, still pauses and resumes.
        self.api.call("POST", f"/v1/sandboxes/{self.src}/pause")
        self.assertEqual(self.api.call("POST", f"/v1/sandboxes/{self.src}/resume")["state"], "running")
        with self.assertRaises(ApiError) as ctx:
            self.api.call("POST", f"/v1/sandboxes/{self.src}/fork", {"count": 0})
        self.assertEqual(ctx.exception.status, 400)
        self.assertEqual(ctx.exception.field, "count")

    def test_d2_source_clock_is_set_after_each_stop(self):
        # A snapshot or fork stops the source's vCPUs and with them its clock
        # (TCG and KVM alike); the engine sets it as the source continues.
        # A clock set far off first shows that it does (a stop of a few ms
        # alone would not).
        for kind in ("disk", "memory", "fork"):
            _, _, ex = self.api.exec(self.src, argv=["date", "-s", "@1000000000"])
            self.assertEqual(ex["exit_code"], 0)
            if kind == "fork":
                r = self.api.call("POST", f"/v1/sandboxes/{self.src}/fork", {"count": 1})
                forks = [x["id"] for x in r["sandboxes"]]
            else:
                s = self.snap(f"clock-{kind}", memory=kind == "memory")
                self.assertTrue(0 <= s["paused_ms"] <= s["took_ms"], s)
            t0 = time.time()
            out, _, _ = self.api.exec(self.src, argv=["date", "+%s"])
            t1 = time.time()
            self.assertLess(abs(int(out) - (t0 + t1) / 2), 2 + (t1 - t0) / 2, (kind, out, t0, t1))
            if kind == "fork":
                # The fork's own clock comes with its hello.
                out, _, _ = self.api.exec(forks[0], argv=["date", "+%s"])
                self.assertLess(abs(int(out) - time.time()), 5, out)
                self.api.delete(forks[0])
            else:
                self.api.call("DELETE", f"/v1/snapshots/clock-{kind}")

    def test_d3_first_save_maps_the_ram_while_the_guest_runs(self):
        # A fresh clone's first memory save reads its whole RAM into QEMU's
        # page tables before the guest stops (vmm/ram_prefault.h), once per
        # QEMU: the journal's `snapshot` records say how much.
        sid = self.api.create(timeout=3600)["id"]
        try:
            mib = self.api.call("GET", f"/v1/sandboxes/{sid}")["memory_mb"]
            for name in ("pf-1", "pf-2"):
                self.snap(name, memory=True, sid=sid)
            recs = [e for e in self.api.call("GET", f"/v1/sandboxes/{sid}/events")
                    if e.get("event") == "snapshot"]
            self.assertEqual([r["prefaulted_bytes"] for r in recs], [mib << 20, 0], recs)
            # And the guest went on as if nothing happened.
            self.assertEqual(self.api.exec(sid, argv=["echo", "ok"])[0], b"ok\n")
        finally:
            self.api.delete(sid)
            for name in ("pf-1", "pf-2"):
                try:
                    self.api.call("DELETE", f"/v1/snapshots/{name}")
                except ApiError as e:
                    if e.status != 404:
                        raise

    def test_e_corrupt_snapshot_is_refused(self):
        self.snap("bad1")
        layer = os.path.join(self.data_dir, "snapshots", "bad1", "layer.qcow2")
        os.chmod(layer, 0o600)
        with open(layer, "r+b") as f:
            f.truncate(os.path.getsize(layer) - 4096)
        before = len(self.api.call("GET", "/v1/sandboxes?all=true"))
        with self.assertRaises(ApiError) as ctx:
            self.api.create(**{"from": "bad1"})
        self.assertEqual(ctx.exception.status, 503)
        self.assertIn("layer.qcow2", ctx.exception.message)
        self.assertEqual(len(self.api.call("GET", "/v1/sandboxes?all=true")), before)
        self.api.call("DELETE", "/v1/snapshots/bad1")

    def test_f_host_disk_full_during_a_snapshot(self):
        snapdir = os.path.join(self.data_dir, "snapshots")
        if os.geteuid() != 0:
            self.skipTest("mounting a small tmpfs needs root")
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96m,mode=0700", "tmpfs", snapdir],
                       check=True)
        try:
            first = self.snap("keep1")
            filler = os.path.join(snapdir, ".filler")
            st = os.statvfs(snapdir)
            free = st.f_bavail * st.f_frsize
            with open(filler, "wb") as f:
                f.write(b"\0" * (free - first["bytes"] // 2))
            with self.assertRaises(ApiError) as ctx:
                self.snap("full1")
            self.assertEqual(ctx.exception.status, 503, ctx.exception.body)
            self.assertIn("space", ctx.exception.message)
            self.assertEqual(self.api.call("GET", f"/v1/sandboxes/{self.src}")["state"], "running")
            left = [n for n in os.listdir(snapdir) if n not in ("keep1", ".filler")]
            self.assertEqual(left, [])  # nothing half-written
            with self.assertRaises(ApiError):
                self.api.call("GET", "/v1/snapshots/full1")
            os.remove(filler)
            self.assertEqual(self.snap("full1")["name"], "full1")  # the retry works
            # The earlier snapshot is intact: a sandbox starts from it.
            new = self.api.create(**{"from": "keep1"})
            self.assertEqual(self.api.get_file(new["id"], "/root/installed"), b"custom environment\n")
            self.api.delete(new["id"])
            for n in ("keep1", "full1"):
                self.api.call("DELETE", f"/v1/snapshots/{n}")
        finally:
            subprocess.run(["umount", "-l", snapdir])


if __name__ == "__main__":
    unittest.main()

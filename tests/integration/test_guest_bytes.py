"""The host never trusts bytes a guest (or its QEMU) wrote, on real VMs.

A sandbox's qcow2 overlay is writable by its jailed QEMU, so its header is
the guest side's to forge: these tests rewrite the backing name of a
sandbox's disk (or of a snapshot's layer) the way an escaped QEMU could, to
a host file outside airlock's directories, and check that every host path
that reads the chain (changes, snapshot, fork, resume, create from a
snapshot, image save) refuses it with an error naming the disk, instead of
reading the host file. And the host's parsers of those bytes (qemu-img, the
ext4 diff walker, e2fsck, diff) run in airlock-confine: an unprivileged uid,
no_new_privs, seccomp and only the descriptors they were given.
"""

import glob
import gzip
import io
import os
import shutil
import struct
import subprocess
import threading
import time
import unittest

import harness
import oci_build as ob
from harness import ApiError, DaemonTestCase

EXT_BACKING_FORMAT = 0xE2792ACA


def point_backing_at(disk, target, fmt="raw"):
    """Rewrites `disk`'s qcow2 header in place (as a running QEMU could):
    backing name `target`, backing format `fmt`."""
    with open(disk, "r+b") as f:
        h = f.read(65536)
        assert h[:4] == b"QFI\xfb", disk
        version = struct.unpack(">I", h[4:8])[0]
        off = struct.unpack(">Q", h[8:16])[0]
        assert off, "the disk has no backing name to rewrite"
        p = struct.unpack(">I", h[100:104])[0] if version == 3 else 72
        while p + 8 <= len(h):
            t, n = struct.unpack(">II", h[p:p + 8])
            if t == 0:
                break
            padded = (n + 7) & ~7
            if t == EXT_BACKING_FORMAT:
                assert len(fmt) <= padded
                f.seek(p)
                f.write(struct.pack(">II", t, len(fmt)) + fmt.encode().ljust(padded, b"\0"))
            p += 8 + padded
        name = target.encode()
        f.seek(off)
        f.write(name)
        f.seek(16)
        f.write(struct.pack(">I", len(name)))


def newest_rootfs():
    found = glob.glob(os.path.join(harness.IMAGE_DIR, "minimal", "*", "rootfs.ext4"))
    assert found, "no minimal image under " + harness.IMAGE_DIR
    return max(found, key=os.path.getmtime)


class ForgedBackingFiles(DaemonTestCase):
    """Each path that reads a disk chain refuses a header pointing out."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        # A host file outside the data and image directories that QEMU and
        # libext2fs could read without complaint: a copy of the image's root
        # filesystem with a secret in it. Reading it would be the leak.
        cls.secret = os.path.join(cls.tmp, "host-secret.ext4")
        subprocess.run(["cp", "--sparse=always", newest_rootfs(), cls.secret], check=True)
        os.chmod(cls.secret, 0o644)
        src = os.path.join(cls.tmp, "secret.txt")
        with open(src, "w") as f:
            f.write("host secret\n")
        subprocess.run(["debugfs", "-w", "-R", f"write {src} /host-secret.txt", cls.secret],
                       check=True, capture_output=True)

    def disk_of(self, sid):
        return os.path.join(self.data_dir, "sandboxes", sid, "disk.qcow2")

    def assertRefused(self, ctx, what):
        msg = ctx.exception.body["error"]["message"]
        self.assertIn(what, msg)
        self.assertIn("outside airlock's own directories", msg)
        self.assertGreaterEqual(ctx.exception.status, 400)

    def test_a_changes_refuses_a_forged_running_disk(self):
        sid = self.api.create(timeout=600)["id"]
        self.api.put_file(sid, "/root/mine", b"x\n")
        point_backing_at(self.disk_of(sid), self.secret)
        with self.assertRaises(ApiError) as ctx:
            self.api.call("GET", f"/v1/sandboxes/{sid}/changes")
        self.assertRefused(ctx, f"sandbox {sid}'s disk")
        self.assertIn(self.secret, ctx.exception.body["error"]["message"])
        point_backing_at(self.disk_of(sid), "/etc/shadow")
        with self.assertRaises(ApiError) as ctx:
            self.api.call("GET", f"/v1/sandboxes/{sid}/changes")
        self.assertRefused(ctx, "/etc/shadow")
        self.api.delete(sid)

    def test_b_snapshot_and_fork_refuse_a_forged_running_disk(self):
        sid = self.api.create(timeout=600)["id"]
        point_backing_at(self.disk_of(sid), self.secret)
        with self.assertRaises(ApiError) as ctx:
            self.api.call("POST", f"/v1/sandboxes/{sid}/fork", {"count": 1})
        self.assertRefused(ctx, f"sandbox {sid}'s disk")
        with self.assertRaises(ApiError) as ctx:
            self.api.call("POST", f"/v1/sandboxes/{sid}/snapshots", {"name": "forged"})
        self.assertRefused(ctx, f"sandbox {sid}'s disk")
        with self.assertRaises(ApiError):
            self.api.call("GET", "/v1/snapshots/forged")
        # The source still runs: a refused read changes nothing.
        self.assertEqual(self.api.call("GET", f"/v1/sandboxes/{sid}")["state"], "running")
        self.api.delete(sid)

    def test_c_resume_refuses_a_paused_disk_rebased_to_a_host_file(self):
        for target in (self.secret, "/etc/shadow"):
            sid = self.api.create(timeout=600)["id"]
            self.api.call("POST", f"/v1/sandboxes/{sid}/pause")
            subprocess.run(["qemu-img", "rebase", "-u", "-f", "qcow2", "-F", "raw", "-b", target,
                            self.disk_of(sid)], check=True)
            with self.assertRaises(ApiError) as ctx:
                self.api.call("POST", f"/v1/sandboxes/{sid}/resume")
            self.assertRefused(ctx, self.disk_of(sid))
            self.assertIn(target, ctx.exception.body["error"]["message"])
            self.assertEqual(harness.qemu_pids_for(sid), [])  # no QEMU ever opened it
            self.api.delete(sid)

    def test_d_snapshot_paths_refuse_a_rebased_layer(self):
        """A snapshot's layer rebased to a host file: create from it and image
        save refuse it (its recorded SHA-256 no longer matches, and its chain
        is checked)."""
        sid = self.api.create(timeout=600)["id"]
        self.api.call("POST", f"/v1/sandboxes/{sid}/snapshots", {"name": "good"})
        self.api.delete(sid)
        layer = os.path.join(self.data_dir, "snapshots", "good", "layer.qcow2")
        os.chmod(layer, 0o600)
        subprocess.run(["qemu-img", "rebase", "-u", "-f", "qcow2", "-F", "raw", "-b",
                        "/etc/shadow", layer], check=True)
        with self.assertRaises(ApiError) as ctx:
            self.api.create(**{"from": "good"})
        self.assertIn("good", ctx.exception.body["error"]["message"])
        with self.assertRaises(ApiError) as ctx:
            self.api.call("POST", "/v1/snapshots/good/image", {"name": "good-img"})
        self.assertIn("good", ctx.exception.body["error"]["message"])
        self.api.call("DELETE", "/v1/snapshots/good")


def confined_processes(daemon_pid):
    """{pid: (status fields, fds, cmdline, {fd: target})} of the processes whose parent is
    `daemon_pid` and that run airlock-confine or a tool it executed."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        def cmdline():
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return f.read().split(b"\0")
        try:
            # The same program before and after: the status is of that
            # program, not of the fork that had not yet executed it.
            cmd = cmdline()
            with open(f"/proc/{pid}/status") as f:
                status = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
            targets = {}
            for n in os.listdir(f"/proc/{pid}/fd"):
                try:
                    targets[int(n)] = os.readlink(f"/proc/{pid}/fd/{n}")
                except OSError:
                    pass
            fds = sorted(targets)
            if status.get("PPid") != str(daemon_pid) or cmdline() != cmd:
                continue
        except (OSError, ValueError):
            continue
        name = os.path.basename(cmd[0].decode(errors="replace"))
        if name in ("airlock-confine", "qemu-img", "diff", "e2fsck"):
            out[int(pid)] = (status, fds, cmd, targets)
    return out


class ConfinedParsers(DaemonTestCase):
    """changes and image save still work end to end, and every parser of the
    guest's bytes they start runs confined (seen in /proc while it runs)."""

    def watch(self):
        """Samples the daemon's confined children until stop() is called;
        keeps the last sample of each (after its lockdown, which comes
        within a millisecond of its start)."""
        seen, stop = {}, threading.Event()

        def loop():
            while not stop.is_set():
                for pid, (st, fds, cmd, targets) in confined_processes(self.daemon.pid).items():
                    # Descriptors: every one it ever had (at exit they close one by one).
                    old = seen.get(pid, (None, [], None, {}))
                    seen[pid] = (st, sorted(set(old[1]) | set(fds)), cmd, {**old[3], **targets})
                time.sleep(0.001)

        t = threading.Thread(target=loop, daemon=True)
        t.start()

        def done():
            stop.set()
            t.join()
            return seen
        return done

    def delete_quietly(self, path):
        for _ in range(2):
            try:
                self.api.call("DELETE", path)
                return
            except ApiError as e:
                if e.status != 409:
                    return
                self.api.call("POST", "/v1/prune")  # a template of the image holds it

    def assertConfined(self, seen, tool, fds):
        procs = [(st, f, cmd, t) for st, f, cmd, t in seen.values()
                 if os.path.basename(cmd[0].decode()) == tool or
                 (tool == "walker" and b'"mode":"walk"' in b"".join(cmd)) or
                 (tool == "importer" and b'"mode":"import"' in b"".join(cmd))]
        self.assertTrue(procs, f"no confined {tool} process was seen: {list(seen.values())}")
        for st, f, cmd, targets in procs:
            uid = int(st["Uid"].split()[0])
            self.assertGreaterEqual(uid, 2100000000, (tool, st["Uid"]))
            self.assertEqual(st["Uid"].split(), [str(uid)] * 4)
            self.assertEqual(st["Gid"].split(), [str(uid)] * 4)
            self.assertEqual(st["NoNewPrivs"], "1", tool)
            self.assertEqual(st["Seccomp"], "2", tool)
            self.assertEqual(st["CapEff"], "0000000000000000", tool)
            self.assertEqual(st["CapBnd"], "0000000000000000", tool)
            if callable(fds):
                fds(targets)
            elif fds is not None:
                self.assertEqual(f, fds, (tool, f))

    def test_a_changes_runs_qemu_img_the_walker_and_diff_confined(self):
        sid = self.api.create(timeout=600)["id"]
        # Enough files that the walk lasts long enough to be seen.
        self.api.exec(sid, cmd="mkdir -p /root/many && cd /root/many && "
                               "for i in $(seq 1 3000); do echo $i > f$i; done; "
                               "echo hello > /root/greeting; sync")
        done = self.watch()
        diff = self.api.call("GET", f"/v1/sandboxes/{sid}/changes?content=true")
        seen = done()
        by_path = {c["path"]: c for c in diff["changes"]}
        self.assertEqual(by_path["/root/greeting"]["change"], "added")
        self.assertIn("+hello", by_path["/root/greeting"]["diff"])
        self.assertEqual(by_path["/root/many/f7"]["change"], "added")
        # The walker has exactly its two raw views (3, 4), stdin and its two
        # pipes.
        self.assertConfined(seen, "walker", [0, 1, 2, 3, 4])
        self.assertConfined(seen, "qemu-img", None)
        self.assertConfined(seen, "diff", None)  # it opens its two inputs itself
        # The helper's read access to the running disk (0600, QEMU's uid) and
        # to the files under it was for the job only.
        for layer in [os.path.join(self.data_dir, "sandboxes", sid, "disk.qcow2")] + glob.glob(
                os.path.join(self.data_dir, "templates", "*", "disk.qcow2")):
            self.assertNotIn("system.posix_acl_access", os.listxattr(layer), layer)
        self.api.delete(sid)

    def test_b_image_save_runs_qemu_img_and_e2fsck_confined(self):
        self.delete_quietly("/v1/images/conf-img")  # a left-over of an interrupted run
        sid = self.api.create(timeout=600)["id"]
        self.api.put_file(sid, "/root/saved", b"kept\n")
        # Enough written blocks that qemu-img's conversion of the layer lasts
        # long enough for the sampler to see it (a near-empty layer converts
        # in about a millisecond, which a loaded host's sampler can miss).
        _, err, ex = self.api.exec(sid, cmd="head -c 33554432 /dev/urandom > /root/bulk && sync")
        self.assertEqual(ex["exit_code"], 0, err)
        self.api.call("POST", f"/v1/sandboxes/{sid}/snapshots", {"name": "conf-snap"})
        self.api.delete(sid)
        self.addCleanup(self.delete_quietly, "/v1/images/conf-img")
        self.addCleanup(self.delete_quietly, "/v1/snapshots/conf-snap")
        done = self.watch()
        saved = self.api.call("POST", "/v1/snapshots/conf-snap/image", {"name": "conf-img"},
                              timeout=600)
        seen = done()
        self.assertEqual(saved["name"], "conf-img")
        self.assertConfined(seen, "qemu-img", None)
        self.assertConfined(seen, "e2fsck", None)
        # No ACL entry for a helper uid outlives the save.
        layer = os.path.join(self.data_dir, "snapshots", "conf-snap", "layer.qcow2")
        self.assertNotIn("system.posix_acl_access", os.listxattr(layer))
        new = self.api.create(image="conf-img", timeout=600)["id"]
        out, _, _ = self.api.exec(new, cmd="cat /root/saved")
        self.assertEqual(out, b"kept\n")
        self.api.delete(new)

    def test_c_an_image_import_runs_libarchive_confined(self):
        self.delete_quietly("/v1/images/conf-import")
        self.addCleanup(self.delete_quietly, "/v1/images/conf-import")
        # Enough entries that the unpack lasts long enough to be seen, and
        # what only root may set: owners, a set-id mode, a capability.
        many = [ob.directory("many")] + [ob.file(f"many/f{i}", b"%d\n" % i) for i in range(5000)]
        layer = ob.make_layer(many + [
            ob.directory("home", uid=1000, gid=1000, mode=0o750),
            ob.file("home/suid", b"x", 0o4755, uid=1000, gid=1000),
            ob.file("cap", b"c", 0o755, pax={"SCHILY.xattr.user.note": "kept"}),
        ])
        data = ob.docker_archive([layer], ob.config())
        done = self.watch()
        img = self.api.call("POST", "/v1/images/conf-import/import", data, timeout=600)
        seen = done()
        self.assertEqual(img["layers"], 1)
        # Given: stdin, two pipes, the archive (3), its scratch directory
        # (4); whatever else it had open, it opened there itself.
        def only_its_own(targets):
            self.assertTrue(targets[0] == "/dev/null" and all(
                targets[n].startswith("pipe:") for n in (1, 2)), targets)
            self.assertIn("/.tmp-import-", targets[4], targets)
            for n, t in targets.items():
                if n > 4:
                    self.assertTrue(t.startswith(targets[4] + "/") or t == targets[3], (n, t))
        self.assertConfined(seen, "importer", only_its_own)
        # What the unprivileged importer could not set, root set from its
        # manifest: read back from the installed image's filesystem.
        rootfs = max(glob.glob(os.path.join(harness.IMAGE_DIR, "conf-import", "*", "rootfs.ext4")),
                     key=os.path.getmtime)
        out = subprocess.run(["debugfs", "-R", "stat /home/suid", rootfs], capture_output=True,
                             text=True).stdout
        self.assertRegex(out, r"Mode:\s+04755", out)
        self.assertRegex(out, r"User:\s+1000\s+Group:\s+1000", out)
        out = subprocess.run(["debugfs", "-R", "stat /home", rootfs], capture_output=True,
                             text=True).stdout
        self.assertRegex(out, r"Mode:\s+0750", out)
        out = subprocess.run(["debugfs", "-R", "stat /many/f7", rootfs], capture_output=True,
                             text=True).stdout
        self.assertRegex(out, r"User:\s+0\s+Group:\s+0", out)


class HostileImportArchives(DaemonTestCase):
    """docker save layers are checked against the config's diff_ids; the
    outer archive has an entry limit and an expansion-ratio limit."""

    def import_refused(self, data, needle):
        with self.assertRaises(ApiError) as ctx:
            self.api.call("POST", "/v1/images/evil/import", data, timeout=600)
        self.assertEqual(ctx.exception.status, 400, ctx.exception.body)
        self.assertIn(needle, ctx.exception.body["error"]["message"])
        with self.assertRaises(ApiError) as ctx:
            self.api.call("GET", "/v1/images/evil")
        self.assertEqual(ctx.exception.status, 404)

    def test_a_an_altered_docker_save_layer_is_refused_naming_it(self):
        layers = [ob.make_layer([ob.file("a", b"1")]), ob.make_layer([ob.file("b", b"2")])]
        files = ob.docker_files(layers, ob.config())
        altered = ob.make_layer([ob.file("b", b"evil")])
        files[ob._sha(layers[1]) + "/layer.tar"] = altered
        self.import_refused(ob.pack(files), f"layer 2 ({ob._sha(layers[1])}/layer.tar) does not "
                                            "match its digest")

    def test_b_an_outer_archive_of_too_many_entries_is_refused(self):
        files = ob.docker_files([ob.make_layer([ob.file("a", b"1")])], ob.config())
        for i in range(10001):
            files[f"junk/{i}"] = b""
        self.import_refused(ob.pack(files), "more than 10000 entries (the archive entry limit)")

    def test_c_an_outer_archive_expanding_too_far_is_refused(self):
        files = ob.docker_files([ob.make_layer([ob.file("a", b"1")])], ob.config())
        files["zeros"] = b"\0" * (64 << 20)
        bomb = gzip.compress(ob.pack(files), 9)
        self.assertLess(len(bomb), 1 << 20)
        self.import_refused(bomb, "the expansion ratio limit")


if __name__ == "__main__":
    unittest.main()

"""OCI / docker save import, image management and sandbox stats on a real
daemon. The archives are built here (oci_build.py; no registry is reachable).
The daemon gets an image directory of its own (sharing only the unpacked
kernel), so prune and rm never touch other suites' images.
One VM boot (the imported image); about 30 s under TCG on a loaded 2-core host.
"""

import glob
import os
import shutil
import subprocess
import tempfile
import unittest

import harness
import oci_build as ob
from harness import ApiError, DaemonTestCase

BUSYBOX = "/bin/busybox"
APPLETS = ["sh", "ls", "cat", "id", "pwd", "echo", "test", "true", "stat"]


def base_layer():
    with open(BUSYBOX, "rb") as f:
        bb = f.read()
    entries = [ob.directory("bin"), ob.file("bin/busybox", bb, 0o755)]
    entries += [ob.symlink("bin/" + a, "busybox") for a in APPLETS]
    entries += [ob.directory("etc"),
                ob.file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/app:/bin/sh\n"),
                ob.file("etc/group", b"root:x:0:\napp:x:1000:\n"),
                ob.directory("app", uid=1000, gid=1000),
                ob.file("app/old.txt", b"old\n"), ob.file("app/gone.txt", b"gone\n"),
                ob.directory("data"), ob.directory("data/lower"), ob.file("data/lower/a.txt", b"a\n")]
    return ob.make_layer(entries, compress=True)


def good_layers():
    l1 = base_layer()
    l2 = ob.make_layer([
        ob.whiteout("app/gone.txt"),
        ob.opaque("data"),
        ob.file("data/new.txt", b"new\n"),
        ob.file("app/hello.txt", b"hello from layer 2\n", 0o640, uid=1000, gid=1000,
                pax={"SCHILY.xattr.user.airlock": "yes"}),
        ob.hardlink("app/hello-link", "app/hello.txt"),
        ob.chardev("app/devnode"),
    ])
    l3 = ob.make_layer([ob.file("app/old.txt", b"replaced in layer 3\n")], compress=True)
    return [l1, l2, l3]


GOOD_CONFIG = ob.config(env=["PATH=/bin", "GREETING=hi from the image"], workdir="/app",
                        user="1000", entrypoint=["/bin/echo", "entry"], cmd=["from-cmd"],
                        labels={"org.example.test": "yes"})


class ImageTest(DaemonTestCase):
    @classmethod
    def setUpClass(cls):
        cls.images_tmp = tempfile.mkdtemp(prefix="airlock-images-")
        shared = harness.IMAGE_DIR
        os.makedirs(os.path.join(cls.images_tmp, "cache"))
        os.symlink(os.path.join(shared, "cache", "kernel"), os.path.join(cls.images_tmp, "cache", "kernel"))
        harness.IMAGE_DIR = cls.images_tmp
        try:
            super().setUpClass()
        finally:
            harness.IMAGE_DIR = shared
        cls.outside = tempfile.mkdtemp(prefix="airlock-outside-")

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        shutil.rmtree(cls.images_tmp, ignore_errors=True)
        shutil.rmtree(cls.outside, ignore_errors=True)

    def import_(self, name, data, replace=False):
        q = "?replace=true" if replace else ""
        return self.api.call("POST", f"/v1/images/{name}/import{q}", data, timeout=600)

    def leftovers(self):
        return glob.glob(os.path.join(self.images_tmp, ".tmp-*")) + \
            glob.glob(os.path.join(self.images_tmp, "*", ".tmp-*"))

    def test_import_runs_in_a_sandbox_and_management(self):
        img = self.import_("app", ob.oci_archive(good_layers(), GOOD_CONFIG))
        self.assertEqual(img["name"], "app")
        self.assertEqual(img["kind"], "installed")
        self.assertEqual(img["layers"], 3)
        self.assertTrue(img["source"].startswith("oci:sha256:"), img["source"])
        self.assertEqual(img["config"]["workdir"], "/app")
        self.assertEqual(img["config"]["user"], "1000")
        self.assertEqual(img["config"]["env"]["GREETING"], "hi from the image")
        self.assertEqual(img["config"]["labels"], {"org.example.test": "yes"})
        self.assertGreater(img["size_bytes"], 0)
        listed = {i["name"]: i for i in self.api.call("GET", "/v1/images")}
        self.assertIn("app", listed)
        self.assertEqual(listed["app"]["used_by"], [])
        with self.assertRaises(ApiError) as e:
            self.import_("app", ob.oci_archive(good_layers(), GOOD_CONFIG))
        self.assertEqual(e.exception.status, 409)

        sb = self.api.create(image="app")["id"]
        try:
            # Exec defaults from the image config: cwd, user, env.
            out, _, ev = self.api.exec(sb, cmd="pwd; id -u; echo $GREETING")
            self.assertEqual(ev["exit_code"], 0, out)
            self.assertEqual(out.decode().split("\n")[:3], ["/app", "1000", "hi from the image"])
            # Layers: whiteout, opaque dir, replaced file, hard link, owner,
            # mode; the device node was dropped.
            script = ("test -e /app/gone.txt && echo gone-still-there; ls /data; cat /app/old.txt; "
                      "cat /app/hello-link; stat -c '%u %a %h' /app/hello.txt; "
                      "test -e /app/devnode || echo no-devnode")
            out, _, ev = self.api.exec(sb, cmd=script, user="root")
            self.assertEqual(ev["exit_code"], 0, out)
            self.assertEqual(out.decode().split("\n")[:6],
                             ["new.txt", "replaced in layer 3", "hello from layer 2", "1000 640 2",
                              "no-devnode", ""])
            # No command: the image's Entrypoint + Cmd.
            out, _, ev = self.api.exec(sb)
            self.assertEqual((ev["exit_code"], out), (0, b"entry from-cmd\n"))
            # An exec's own values win over the image's.
            out, _, _ = self.api.exec(sb, argv=["pwd"], cwd="/", user="root")
            self.assertEqual(out, b"/\n")

            # Stats of a running sandbox, alone and in the list.
            st = self.api.call("GET", f"/v1/sandboxes/{sb}/stats")
            self.assertEqual(st["id"], sb)
            self.assertGreater(st["cpu_seconds"], 0)
            self.assertGreater(st["memory_bytes"], 1 << 20)
            self.assertGreater(st["disk_bytes"], 0)
            self.assertGreaterEqual(st["age_s"], 0)
            with_stats = {s["id"]: s for s in self.api.call("GET", "/v1/sandboxes?stats=true")}
            self.assertIn("stats", with_stats[sb])
            with self.assertRaises(ApiError) as e:
                self.api.call("GET", "/v1/sandboxes/sb-doesnotexist0/stats")
            self.assertEqual(e.exception.status, 404)

            # In use: rm is refused, naming the user.
            with self.assertRaises(ApiError) as e:
                self.api.call("DELETE", "/v1/images/app")
            self.assertEqual(e.exception.status, 409)
            self.assertIn("sandbox:" + sb, e.exception.body["error"]["message"])
            # The create may also have made a template of the image.
            users = self.api.call("GET", "/v1/images/app")["used_by"]
            self.assertIn("sandbox:" + sb, users)
            self.assertEqual([u for u in users if not u.startswith("template:")], ["sandbox:" + sb])

            # Replace it (docker save format this time) while the old version
            # runs: prune keeps the running sandbox's version.
            v2 = self.import_("app", ob.docker_archive(good_layers(), ob.config(workdir="/")),
                              replace=True)
            self.assertTrue(v2["source"].startswith("docker-save:sha256:"), v2["source"])
            self.assertEqual(v2["layers"], 3)
            self.assertEqual(len(self.api.call("GET", "/v1/images/app")["versions"]), 2)
            # (A template the sandbox was not cloned from may go.)
            kept = self.api.call("POST", "/v1/prune")["removed"]
            self.assertEqual([r for r in kept if not r.startswith("template:")], [], kept)
        finally:
            self.api.delete(sb)

        dry = self.api.call("POST", "/v1/prune?dry_run=true")
        self.assertTrue(dry["dry_run"])
        self.assertEqual(len([r for r in dry["removed"] if r.startswith("image:app/")]), 1, dry)
        self.assertGreater(dry["freed_bytes"], 0)
        self.assertEqual(len(self.api.call("GET", "/v1/images/app")["versions"]), 2)
        done = self.api.call("POST", "/v1/prune")
        self.assertEqual(done["removed"], dry["removed"])
        self.assertEqual(len(self.api.call("GET", "/v1/images/app")["versions"]), 1)

        df = self.api.call("GET", "/v1/df")["bytes"]
        self.assertGreater(df["images"], 0)
        self.assertEqual(df["total"], sum(v for k, v in df.items() if k != "total"))

        # A snapshot's layers end on the image: it holds the image after its
        # sandbox is gone (rm names it, prune keeps the version it is backed by).
        sb = self.api.create(image="app")["id"]
        try:
            self.api.call("POST", f"/v1/sandboxes/{sb}/snapshots", {"name": "app-base"})
        finally:
            self.api.delete(sb)
        try:
            with self.assertRaises(ApiError) as e:
                self.api.call("DELETE", "/v1/images/app")
            self.assertEqual(e.exception.status, 409)
            self.assertIn("snapshot:app-base", e.exception.body["error"]["message"])
            self.assertIn("snapshot:app-base", self.api.call("GET", "/v1/images/app")["used_by"])
            removed = self.api.call("POST", "/v1/prune")["removed"]
            self.assertEqual([r for r in removed if r.startswith("image:")], [], removed)
        finally:
            self.api.call("DELETE", "/v1/snapshots/app-base")
        self.api.call("DELETE", "/v1/images/app")
        with self.assertRaises(ApiError) as e:
            self.api.call("GET", "/v1/images/app")
        self.assertEqual(e.exception.status, 404)
        with self.assertRaises(ApiError) as e:
            self.api.call("DELETE", "/v1/images/app")
        self.assertEqual(e.exception.status, 404)
        self.assertEqual(self.leftovers(), [])

    def cli(self, *args):
        env = dict(os.environ, AIRLOCK_SOCKET=self.sock, AIRLOCK_DATA_DIR=self.data_dir)
        return subprocess.run([os.path.join(harness.BIN, "airlock"), *args], env=env,
                              capture_output=True, text=True, timeout=600)

    def test_cli_imports_a_layout_directory_and_manages_images(self):
        """`airlock image import NAME DIR` (an OCI layout directory, tarred on
        the fly), ls, inspect, df, prune --dry-run, rm; a layout directory
        holding a symlink is refused. No VM."""
        layout = tempfile.mkdtemp(prefix="airlock-layout-")
        try:
            for path, data in ob.oci_files(good_layers(), GOOD_CONFIG, compressed=True).items():
                os.makedirs(os.path.dirname(os.path.join(layout, path)), exist_ok=True)
                with open(os.path.join(layout, path), "wb") as f:
                    f.write(data)
            r = self.cli("image", "import", "fromdir", layout)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("fromdir: 3 layers", r.stdout)
            r = self.cli("image", "ls")
            self.assertEqual(r.returncode, 0, r.stderr)
            row = next(l for l in r.stdout.splitlines() if l.startswith("fromdir "))
            self.assertIn("installed", row)
            r = self.cli("image", "inspect", "fromdir")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn('"workdir": "/app"', r.stdout)
            r = self.cli("df")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertRegex(r.stdout, r"images\s+\d")
            r = self.cli("prune", "--dry-run")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("would free", r.stdout)
            r = self.cli("image", "rm", "fromdir")
            self.assertEqual(r.returncode, 0, r.stderr)
            r = self.cli("image", "rm", "fromdir")
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("fromdir", r.stderr)
            # A layout holds files and directories only.
            os.symlink("/etc/passwd", os.path.join(layout, "blobs", "sha256", "link"))
            r = self.cli("image", "import", "fromdir", layout)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("link", r.stderr)
            self.assertEqual(self.leftovers(), [])
        finally:
            shutil.rmtree(layout, ignore_errors=True)

    def test_hostile_archives_are_refused_naming_the_entry(self):
        marker = os.path.join(self.outside, "pwned")
        rel_marker = "../" * 40 + marker.lstrip("/")
        base = base_layer()
        bomb = ob.make_layer([ob.file("zeros", b"\0" * (48 << 20))], compress=True)
        cases = {
            "absolute": ([ob.make_layer([ob.file(marker, b"x")])], marker.lstrip("/")),
            "dotdot": ([ob.make_layer([ob.file(rel_marker, b"x")])], "climbs out"),
            "symlink-out": ([ob.make_layer([ob.symlink("evil", "../../../../../etc/passwd")])], "evil"),
            "hardlink-out": ([ob.make_layer([ob.hardlink("evil", "../../etc/passwd")])], "evil"),
            "hardlink-abs": ([ob.make_layer([ob.hardlink("evil", "/etc/passwd")])], "evil"),
            "symlinked-parent": ([base, ob.make_layer([ob.symlink("sub", self.outside),
                                                       ob.file("sub/pwned", b"x")])], "sub/pwned"),
            "giant-header": ([ob.make_layer([ob.file("a" * (2 << 20), b"x")])], "layer 1"),
            "bomb": ([bomb], "decompression bomb"),
            "duplicate": ([ob.make_layer([ob.file("twice", b"1"), ob.file("twice", b"2")])], "twice"),
        }
        for case, (layers, needle) in cases.items():
            with self.subTest(case=case):
                with self.assertRaises(ApiError) as e:
                    self.import_("evil", ob.oci_archive(layers, ob.config()))
                self.assertEqual(e.exception.status, 400, e.exception.body)
                msg = e.exception.body["error"]["message"]
                self.assertIn(needle, msg)
                with self.assertRaises(ApiError) as e:
                    self.api.call("GET", "/v1/images/evil")
                self.assertEqual(e.exception.status, 404)
                self.assertFalse(os.path.exists(marker))
                self.assertEqual(os.listdir(self.outside), [])
                self.assertEqual(self.leftovers(), [])
        # Neither a layout nor an archive at all.
        with self.assertRaises(ApiError) as e:
            self.import_("evil", b"this is not a tar file" * 100)
        self.assertEqual(e.exception.status, 400)


if __name__ == "__main__":
    unittest.main()

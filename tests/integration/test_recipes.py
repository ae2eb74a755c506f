"""Image recipes (issue 14): `airlock image build -f airlock.toml NAME`.

The two examples in images/examples/ are built on the `debian` base against
this test's own package mirror (tests/workloads/little_repos.py: a flat apt
repository and a PEP 503 index, served in network namespaces the test
creates, with stand-ins of the packages the examples name). Every step runs
in a real build sandbox whose network policy allows only the mirror's host.
Checked: a sandbox of the built image sees the copied files, env, workdir,
user and installed packages; a second build is all cache hits; a changed
step rebuilds from it; a failing step shows its output and leaves no image,
no sandbox and no layer of its own; a bad recipe is refused naming the key
and line (CLI and API).

Needs root (network namespaces), dpkg-dev; skipped otherwise. Builds the
debian image into AIRLOCK_IMAGE_DIR if it is not there.
"""

import json
import os
import pty
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "workloads"))

import harness  # noqa: E402
from harness import BIN, IMAGE_DIR, ApiError, DaemonTestCase  # noqa: E402
import little_repos as lr  # noqa: E402
import oci_build as ob  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
EXAMPLES = os.path.join(ROOT, "images", "examples")
MIRROR = f"http://{lr.NAME}:{lr.PORT}"

# Stand-ins served under the names the examples use (the test has no
# registry): a `node` that answers --version and --check, sqlite3, and
# numpy/pandas wheels whose answer() names them.
NODE_STUB = r'''#!/usr/bin/python3
import os, sys
if sys.argv[1:] == ["--version"]:
    print("v18.19.0-airlock-stand-in")
elif "--check" in sys.argv:
    print(f"server.js ok (NODE_ENV={os.environ.get('NODE_ENV')}, port {os.environ.get('PORT', '8080')})")
else:
    sys.exit("node stand-in: only --version and --check")
'''
APT_EXTRA = [("nodejs", {"usr/bin/node": NODE_STUB}),
             ("sqlite3", {"usr/bin/sqlite3": "#!/bin/sh\necho 'sqlite3 stand-in'\n"})]
PIP_EXTRA = [("numpy", "numpy", "numpy stand-in"), ("pandas", "pandas", "pandas stand-in")]


@unittest.skipIf(lr.can_run(), f"recipe suite skipped: {lr.can_run()}")
class RecipeTest(DaemonTestCase):
    net = None
    images = None

    @classmethod
    def setUpClass(cls):
        cls.served = tempfile.mkdtemp(prefix="airlock-rc-")
        try:
            lr.build_apt_repo(cls.served, APT_EXTRA)
            lr.build_pip_index(cls.served, PIP_EXTRA)
            # The debian image, built once into the shared image dir, then
            # hard-linked into an image dir of this run's own: its layer
            # cache starts empty (first builds are really first) and the
            # images it makes go with it.
            subprocess.run([os.path.join(BIN, "airlock"), "image", "build", "debian"],
                           env=dict(os.environ, AIRLOCK_IMAGE_DIR=IMAGE_DIR), check=True,
                           capture_output=True, timeout=1800)
            cls.images = tempfile.mkdtemp(prefix="rc-images-", dir=os.path.dirname(os.path.abspath(IMAGE_DIR)))
            os.chmod(cls.images, 0o755)
            os.makedirs(os.path.join(cls.images, "cache"))
            subprocess.run(["cp", "-al", os.path.join(IMAGE_DIR, "debian"), cls.images], check=True)
            for d in ("kernel", "kernel-choice", "rootfs"):  # not cache/layers: ours start empty
                if os.path.exists(os.path.join(IMAGE_DIR, "cache", d)):
                    subprocess.run(["cp", "-al", os.path.join(IMAGE_DIR, "cache", d),
                                    os.path.join(cls.images, "cache")], check=True)
            harness.IMAGE_DIR = cls.images  # the daemon's --image-dir
            cls.net = lr.LittleInternet(cls.served, tag="rc")
            cls.net.start()
            cls.daemon_prefix = cls.net.prefix
            os.environ["AIRLOCK_NET_DNS_UPSTREAM"] = lr.DNS
            super().setUpClass()
        except BaseException:
            cls.cleanup_class()
            raise

    @classmethod
    def env(cls):
        return dict(os.environ, AIRLOCK_SOCKET=cls.sock, AIRLOCK_DATA_DIR=cls.data_dir,
                    AIRLOCK_IMAGE_DIR=cls.images)

    @classmethod
    def cleanup_class(cls):
        os.environ.pop("AIRLOCK_NET_DNS_UPSTREAM", None)
        if cls.net:
            cls.net.stop()
        shutil.rmtree(cls.served, ignore_errors=True)
        harness.IMAGE_DIR = IMAGE_DIR
        if cls.images:
            shutil.rmtree(cls.images, ignore_errors=True)

    @classmethod
    def tearDownClass(cls):
        try:
            super().tearDownClass()
        finally:
            cls.cleanup_class()

    # ------------------------------------------------------------ helpers

    def build(self, recipe, name, *extra, check=True):
        """`airlock image build -f RECIPE --arg mirror=... NAME` (stdout not a
        terminal: plain lines). Returns (returncode, stdout, stderr, seconds)."""
        t0 = time.monotonic()
        r = subprocess.run([os.path.join(BIN, "airlock"), "image", "build", "-f", recipe,
                            "--arg", f"mirror={MIRROR}", *extra, name],
                           env=self.env(), capture_output=True, text=True, timeout=3600)
        took = time.monotonic() - t0
        if check:
            self.assertEqual(r.returncode, 0, f"build failed:\n{r.stdout}\n{r.stderr}")
        return r.returncode, r.stdout, r.stderr, took

    def build_on_terminal(self, recipe, name):
        """The build with stdout on a pseudo-terminal; returns what it wrote."""
        m, sl = pty.openpty()
        p = subprocess.Popen([os.path.join(BIN, "airlock"), "image", "build", "-f", recipe, name],
                             stdout=sl, stderr=subprocess.PIPE, env=self.env())
        os.close(sl)
        chunks = []
        while True:
            try:
                b = os.read(m, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not b:
                break
            chunks.append(b)
        os.close(m)
        err = p.stderr.read().decode()
        p.stderr.close()
        self.assertEqual(p.wait(timeout=600), 0, err)
        return b"".join(chunks).decode(errors="replace")

    def summary(self, out):
        """(steps, cached, built) from the last line of a build's output."""
        m = re.search(r": (\d+) steps \((\d+) cached, (\d+) built\)", out)
        self.assertIsNotNone(m, out)
        return tuple(int(x) for x in m.groups())

    def layers(self):
        d = os.path.join(self.images, "cache", "layers")
        return set(f for f in os.listdir(d) if f.endswith(".qcow2")) if os.path.isdir(d) else set()

    def sandbox_of(self, image):
        sb = self.api.create(image=image, memory_mb=512, timeout=900)
        self.addCleanup(self.delete, sb["id"])
        return sb["id"]

    def delete(self, sid):
        try:
            self.api.delete(sid)
        except ApiError:
            pass
        self.assertNothingLeft(sid)

    def sh(self, sid, cmd):
        out, err, ex = self.api.exec(sid, cmd=cmd, timeout=300, http_timeout=400)
        return out.decode(), err.decode(), ex

    def no_build_sandboxes_left(self):
        live = self.api.call("GET", "/v1/sandboxes")
        self.assertEqual([s["id"] for s in live], [], "a build sandbox was left running")
        run_dirs = os.path.join(self.data_dir, "sandboxes")
        left = os.listdir(run_dirs) if os.path.isdir(run_dirs) else []
        self.assertEqual(left, [], "a build sandbox's run dir was left")

    # -------------------------------------------------------------- tests

    def test_1_python_example_builds_caches_and_rebuilds_from_a_change(self):
        recipe = os.path.join(EXAMPLES, "python-data", "airlock.toml")
        rc, out, err, first = self.build(recipe, "pydata")
        self.assertEqual(self.summary(out), (5, 0, 5), out)  # apt, pip, copy, run, config
        self.assertIn("rows=3 mean=3.00", out)  # the run step's output, shown as plain lines
        self.assertIn("[4/5] run python3 -m compileall", out)
        self.no_build_sandboxes_left()

        sid = self.sandbox_of("pydata")
        o, _, ex = self.sh(sid, "pwd; id -un; echo $PYTHONUNBUFFERED $DATA_DIR; "
                                "python3 -c 'import numpy, pandas; print(numpy.answer(), \"/\", pandas.answer())'; "
                                "sqlite3; cat summary.txt; stat -c %U summarize.py")
        self.assertEqual(ex["exit_code"], 0, o)
        lines = o.splitlines()
        self.assertEqual(lines[0], "/home/user/work")  # workdir
        self.assertEqual(lines[1], "user")  # default user
        self.assertEqual(lines[2], "1 /home/user/work")  # env
        self.assertEqual(lines[3], "numpy stand-in / pandas stand-in")  # pip packages
        self.assertEqual(lines[4], "sqlite3 stand-in")  # apt package
        self.assertIn("rows=3 mean=3.00", lines[5])  # made by the run step
        self.assertEqual(lines[-1], "user")  # copied with owner = "user"

        # A recipe image is an installed image like any: listed with its
        # users, and `image rm` refuses while a sandbox runs it (409 naming it).
        listed = {i["name"]: i for i in self.api.call("GET", "/v1/images")}
        self.assertIn(f"sandbox:{sid}", listed["pydata"]["used_by"])
        self.assertEqual(listed["pydata"]["source"], "recipe:airlock.toml")
        with self.assertRaises(ApiError) as cm:
            self.api.call("DELETE", "/v1/images/pydata")
        self.assertEqual(cm.exception.status, 409)
        self.assertIn(f"sandbox:{sid}", cm.exception.body["error"]["message"])
        r = subprocess.run([os.path.join(BIN, "airlock"), "image", "rm", "pydata"], env=self.env(),
                           capture_output=True, text=True, timeout=60)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(f"sandbox:{sid}", r.stderr)

        # The same recipe again: every step a cache hit, no sandbox booted.
        rc, out, err, second = self.build(recipe, "pydata")
        self.assertEqual(self.summary(out), (5, 5, 0), out)
        self.assertLess(second, first)
        print(f"\npydata: first build {first:.1f} s, cached rebuild {second:.1f} s", file=sys.stderr)

        # A changed copied file rebuilds from its copy step (3 of 5).
        work = tempfile.mkdtemp(prefix="airlock-rc-recipe-")
        self.addCleanup(shutil.rmtree, work, True)
        shutil.copytree(os.path.join(EXAMPLES, "python-data"), os.path.join(work, "p"))
        with open(os.path.join(work, "p", "analysis", "data.csv"), "a") as f:
            f.write("d,11\n")
        rc, out, err, _ = self.build(os.path.join(work, "p", "airlock.toml"), "pydata")
        self.assertEqual(self.summary(out), (5, 2, 3), out)
        self.assertIn("rows=4 mean=5.00", out)
        sid2 = self.sandbox_of("pydata")
        o, _, _ = self.sh(sid2, "cat summary.txt")
        self.assertIn("rows=4 mean=5.00", o)
        self.no_build_sandboxes_left_but(sid, sid2)

    def no_build_sandboxes_left_but(self, *ids):
        live = [s["id"] for s in self.api.call("GET", "/v1/sandboxes")]
        self.assertEqual(sorted(live), sorted(ids))

    def test_2_node_example(self):
        rc, out, err, _ = self.build(os.path.join(EXAMPLES, "node-app", "airlock.toml"), "nodeapp",
                                     "--json")
        events = [json.loads(line) for line in out.splitlines() if line.strip()]
        self.assertEqual(events[-1]["type"], "done", events[-1])
        self.assertEqual(events[-1]["steps"], 4)  # apt, copy, run, config
        self.assertIn("server.js ok (NODE_ENV=production, port 8080)",
                      "".join(e.get("data", "") for e in events if e["type"] == "output"))
        self.assertTrue(any(e["type"] == "step_done" and e["bytes"] > 0 for e in events))
        sid = self.sandbox_of("nodeapp")
        o, _, ex = self.sh(sid, "pwd; id -un; echo $NODE_ENV; cat /etc/node-version; ls")
        self.assertEqual(ex["exit_code"], 0, o)
        self.assertEqual(o.splitlines(), ["/home/user/app", "user", "production",
                                          "v18.19.0-airlock-stand-in", "package.json", "server.js"])

    def test_3_failing_step_shows_output_and_leaves_nothing(self):
        work = tempfile.mkdtemp(prefix="airlock-rc-fail-")
        self.addCleanup(shutil.rmtree, work, True)
        recipe = os.path.join(work, "airlock.toml")
        with open(recipe, "w") as f:
            # The build's network is the recipe's: only other.example.com
            # here, so the test's mirror is out of reach of the step.
            f.write('base = "debian"\n[args]\nmirror = "x"\n'
                    '[network]\nallow = ["other.example.com"]\n'
                    f'[[run]]\ncmd = "echo step one {time.time()} > /one"\n'
                    "[[run]]\ncmd = \"if timeout 20 bash -c 'echo > /dev/tcp/"
                    f"{lr.NAME}/{lr.PORT}' 2>/dev/null; then echo mirror-reached; "
                    "else echo mirror-blocked; fi; echo visible-output-of-the-failure; exit 3\"\n")
        before = self.layers()
        rc, out, err, _ = self.build(recipe, "broken", check=False)
        self.assertEqual(rc, 1, out + err)
        self.assertIn("visible-output-of-the-failure", err)  # in the error, with the tail
        self.assertIn("mirror-blocked", err)
        self.assertNotIn("mirror-reached", out + err)
        self.assertIn("step 2/2", err)
        self.assertIn("exit code 3", err)
        self.assertFalse(os.path.exists(os.path.join(self.images, "broken", "current")),
                         "a half-built image was installed")
        with self.assertRaises(ApiError):
            self.api.create(image="broken")
        # Only the step that succeeded became a layer; no sandbox remains.
        self.assertEqual(len(self.layers() - before), 1)
        self.no_build_sandboxes_left()
        self.assertFalse([f for f in os.listdir(os.path.join(self.images, "cache", "layers")) if ".tmp-" in f
                          or f.startswith(".flat-")])

    def test_5_imported_oci_image_as_base(self):
        """A recipe on an image imported from an OCI archive (busybox only, no
        Debian): the step runs on it, and the image keeps the base's Env,
        WorkingDir and User unless the recipe sets its own."""
        with open("/bin/busybox", "rb") as f:
            bb = f.read()
        applets = ["sh", "awk", "sleep", "sync", "echo", "cat", "id", "pwd", "mkdir", "test", "true"]
        layer = ob.make_layer([ob.directory("bin"), ob.file("bin/busybox", bb, 0o755)]
                              + [ob.symlink("bin/" + a, "busybox") for a in applets]
                              + [ob.directory("etc"),
                                 ob.file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n"
                                         b"app:x:1000:1000::/app:/bin/sh\n"),
                                 ob.file("etc/group", b"root:x:0:\napp:x:1000:\n"),
                                 ob.directory("app", uid=1000, gid=1000)], compress=True)
        cfg = ob.config(env=["PATH=/bin", "GREETING=from the oci image"], workdir="/app", user="1000")
        self.api.call("POST", "/v1/images/ocibase/import", ob.oci_archive([layer], cfg), timeout=600)
        work = tempfile.mkdtemp(prefix="airlock-rc-oci-")
        self.addCleanup(shutil.rmtree, work, True)
        recipe = os.path.join(work, "airlock.toml")
        with open(recipe, "w") as f:
            f.write('base = "ocibase"\n[env]\nADDED = "by the recipe"\n'
                    '[[run]]\ncmd = "echo made on $GREETING > /app/made.txt; id -u"\n')
        # On a terminal: one line per step, rewritten in place (\r) with the
        # layer's bytes and the elapsed time; the steps' output is not shown.
        out = self.build_on_terminal(recipe, "onoci")
        self.assertEqual(self.summary(out), (1, 0, 1), out)
        self.assertIn("\r[1/1] run echo made on", out)
        self.assertRegex(out, r"done: [0-9.]+ [KMG]?i?B layer in [0-9]", out)
        self.assertNotIn("\n0\r\n", out)
        sid = self.sandbox_of("onoci")
        o, _, ex = self.sh(sid, "pwd; id -u; echo $GREETING / $ADDED; cat made.txt")
        self.assertEqual(ex["exit_code"], 0, o)
        self.assertEqual(o.splitlines(), ["/app", "1000", "from the oci image / by the recipe",
                                          "made on from the oci image"])
        # The same recipe over the API (NDJSON, checked against the spec): the
        # step is a cache hit and nothing boots.
        with open(recipe) as f:
            body = json.dumps({"name": "onoci", "recipe": f.read(), "source": "airlock.toml"})
        status, _, data = self.api.raw("POST", "/v1/images/build", body,
                                       {"Content-Type": "application/json"}, timeout=600)
        self.assertEqual(status, 200, data)
        events = [json.loads(line) for line in data.splitlines() if line.strip()]
        self.assertEqual(events[-1]["type"], "done", events[-1])
        self.assertEqual((events[-1]["cached"], events[-1]["built"]), (1, 0))
        info = self.api.call("GET", "/v1/images/onoci")
        self.assertEqual(info["config"]["base"], "ocibase")

    def test_4_bad_recipes_are_refused_naming_key_and_line(self):
        work = tempfile.mkdtemp(prefix="airlock-rc-bad-")
        self.addCleanup(shutil.rmtree, work, True)
        recipe = os.path.join(work, "airlock.toml")
        with open(recipe, "w") as f:
            f.write('base = "debian"\n[args]\nmirror = "x"\n[apt]\npakages = ["jq"]\n')
        rc, out, err, _ = self.build(recipe, "bad", check=False)
        self.assertNotEqual(rc, 0)
        self.assertIn("airlock.toml:5", err)
        self.assertIn("unknown key 'pakages'", err)
        # A copy that leaves the recipe's directory (through a symlink).
        os.symlink("/etc", os.path.join(work, "etc"))
        with open(recipe, "w") as f:
            f.write('base = "debian"\n[args]\nmirror = "x"\n[[copy]]\nsrc = "etc/passwd"\ndest = "/x"\n')
        rc, out, err, _ = self.build(recipe, "bad", check=False)
        self.assertNotEqual(rc, 0)
        self.assertIn("leaves the recipe's directory", err)
        # The API checks the same, before anything runs: 400 naming the field.
        with self.assertRaises(ApiError) as cm:
            self.api.call("POST", "/v1/images/build",
                          {"name": "bad", "recipe": 'base = "debian"\nbsae = 1\n', "source": "r.toml"})
        self.assertEqual(cm.exception.status, 400)
        self.assertEqual(cm.exception.body["error"]["field"], "bsae")
        self.assertIn("r.toml:2", cm.exception.body["error"]["message"])
        with self.assertRaises(ApiError) as cm:
            self.api.call("POST", "/v1/images/build",
                          {"name": "x", "recipe": 'base = "debian"\n[[copy]]\nsrc = "a"\ndest = "/a"\n',
                           "files": [{"path": "../a", "data": ""}]})
        self.assertEqual(cm.exception.status, 400)
        self.assertEqual(cm.exception.body["error"]["field"], "files[0].path")
        # A built-in image's name is taken.
        with self.assertRaises(ApiError) as cm:
            self.api.call("POST", "/v1/images/build", {"name": "debian", "recipe": 'base = "minimal"\n'})
        self.assertEqual(cm.exception.status, 409)
        self.no_build_sandboxes_left()


if __name__ == "__main__":
    unittest.main()

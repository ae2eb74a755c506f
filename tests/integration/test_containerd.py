"""containerd runs airlock sandboxes: containerd-shim-airlock-v2 (runtime
io.containerd.airlock.v2) under a private containerd (its own config, root,
state and sockets in the test's temp dir; CRI plugin off), a real airlockd
and real VMs. The image is an OCI tar built here from busybox-static and
imported with `ctr image import`; no network is used."""

import fcntl
import json
import os
import pty
import re
import select
import shutil
import signal
import struct
import subprocess
import tempfile
import termios
import time
import unittest

import cri_harness
import harness
import oci_build

RUNTIME = "io.containerd.airlock.v2"
NS = "airlock-test"
IMG = "localhost/airlock-test/busybox:1"
BUSYBOX = "/bin/busybox"
APPLETS = ["sh", "echo", "uname", "sleep", "cat", "ls", "true", "id"]
SHIM = "containerd-shim-airlock-v2"
SHIM_SOCKETS = "/run/containerd/s"  # containerd 1.6 puts every shim's socket here
FIFOS = "/run/containerd/fifo"  # ctr's stdio fifos (left behind by `ctr run -d`, whatever the runtime)


def entries(d):
    try:
        return set(os.listdir(d))
    except OSError:
        return set()


def have_containerd():
    return shutil.which("containerd") and shutil.which("ctr")


def busybox_image():
    """An OCI image layout tar: busybox-static and applet links, PATH set."""
    with open(BUSYBOX, "rb") as f:
        bb = f.read()
    entries = [oci_build.directory("bin"), oci_build.file("bin/busybox", bb, 0o755),
               oci_build.directory("tmp", 0o1777)]
    entries += [oci_build.symlink("bin/" + a, "busybox") for a in APPLETS]
    layer = oci_build.make_layer(entries)
    cfg = oci_build.config(env=["PATH=/bin"], cmd=["sh"])
    cfg["rootfs"]["diff_ids"] = ["sha256:" + oci_build._sha(layer)]
    files = oci_build.oci_files([layer], cfg)
    index = json.loads(files["index.json"])
    index["manifests"][0]["annotations"] = {"io.containerd.image.name": IMG,
                                            "org.opencontainers.image.ref.name": "1"}
    index["manifests"][0]["platform"] = {"architecture": "amd64", "os": "linux"}
    files["index.json"] = json.dumps(index).encode()
    return oci_build.pack(files)


@unittest.skipUnless(have_containerd(), "containerd and ctr are not installed (scripts/setup.sh installs them)")
@unittest.skipUnless(os.path.exists(os.path.join(harness.BIN, SHIM)),
                     f"{SHIM} was not built (no Go toolchain at configure time)")
class ContainerdTest(harness.DaemonTestCase):

    @classmethod
    def ctr_images(cls):
        """airlock images the shim imported (named by their rootfs digest)."""
        return [i["name"] for i in cls.api.call("GET", "/v1/images") if i["name"].startswith("ctr-")]

    @classmethod
    def setUpClass(cls):
        # A private image dir (the shim's imports stay out of the shared
        # one), with the shared kernel cache the import builds the boot files from.
        cls.images_tmp = tempfile.mkdtemp(prefix="airlock-ctd-images-")
        shared = harness.IMAGE_DIR
        os.makedirs(os.path.join(cls.images_tmp, "cache"))
        os.symlink(os.path.join(os.path.abspath(shared), "cache", "kernel"),
                   os.path.join(cls.images_tmp, "cache", "kernel"))
        harness.IMAGE_DIR = cls.images_tmp
        try:
            super().setUpClass()
        except BaseException:
            shutil.rmtree(cls.images_tmp, ignore_errors=True)
            raise
        finally:
            harness.IMAGE_DIR = shared
        cls.sockets_before, cls.fifos_before = entries(SHIM_SOCKETS), entries(FIFOS)
        try:
            cls.start_containerd()
            tar = os.path.join(cls.tmp, "busybox-oci.tar")
            with open(tar, "wb") as f:
                f.write(busybox_image())
            r = cls.ctr("image", "import", tar)
            if r.returncode != 0:
                raise RuntimeError("ctr image import: " + r.stdout + r.stderr)
        except BaseException:
            cls.stop_containerd()
            super().tearDownClass()
            shutil.rmtree(cls.images_tmp, ignore_errors=True)
            raise

    @classmethod
    def start_containerd(cls):
        d = os.path.join(cls.tmp, "ctd")
        os.makedirs(d)
        cls.ctd_sock = os.path.join(d, "containerd.sock")
        cfg = os.path.join(d, "config.toml")
        with open(cfg, "w") as f:
            f.write(f"""version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "{cls.ctd_sock}"
[ttrpc]
  address = "{cls.ctd_sock}.ttrpc"
""")
        env = dict(os.environ, PATH=harness.BIN + ":" + os.environ.get("PATH", "/usr/bin:/bin"),
                   AIRLOCK_SOCKET=cls.sock)
        cls.ctd_log = open(os.path.join(d, "containerd.log"), "wb")
        cls.ctd = subprocess.Popen(["containerd", "--config", cfg], env=env, stdout=cls.ctd_log,
                                   stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while time.time() < deadline:
            if os.path.exists(cls.ctd_sock) and cls.ctr("version").returncode == 0:
                return
            if cls.ctd.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError("containerd did not start: " + cls.containerd_log())

    @classmethod
    def containerd_log(cls):
        cls.ctd_log.flush()
        with open(cls.ctd_log.name, "rb") as f:
            return f.read().decode(errors="replace")[-4000:]

    @classmethod
    def ctr(cls, *args, timeout=180, **kw):
        return subprocess.run(["ctr", "--address", cls.ctd_sock, "--namespace", NS, *args],
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, **kw)

    @classmethod
    def stop_containerd(cls):
        if getattr(cls, "ctd", None) is None:
            return
        # Whatever a failed test left: tasks killed, containers removed.
        for line in cls.ctr("task", "ls", "-q").stdout.split():
            cls.ctr("task", "kill", "-s", "SIGKILL", line)
            cls.ctr("task", "rm", "-f", line)
        for line in cls.ctr("container", "ls", "-q").stdout.split():
            cls.ctr("container", "rm", line)
        cls.ctd.send_signal(signal.SIGTERM)
        try:
            cls.ctd.wait(timeout=20)
        except subprocess.TimeoutExpired:
            cls.ctd.kill()
        cls.ctd_log.close()
        for pid in cls.shims():  # never leak a shim
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        subprocess.run(["umount", "-R", os.path.join(cls.tmp, "ctd")], capture_output=True)
        for d in entries(FIFOS) - cls.fifos_before:
            shutil.rmtree(os.path.join(FIFOS, d), ignore_errors=True)
        cls.ctd = None

    @classmethod
    def tearDownClass(cls):
        try:
            cls.stop_containerd()
        finally:
            super().tearDownClass()
            shutil.rmtree(cls.images_tmp, ignore_errors=True)

    @classmethod
    def shims(cls):
        """PIDs of shims serving this containerd (their command line names its socket)."""
        pids = []
        for pid in harness.pids_mentioning(cls.ctd_sock):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if SHIM.encode() in f.read():
                        pids.append(pid)
            except OSError:
                pass
        return pids

    def assertAllGone(self):
        """No sandbox, QEMU or shim of this containerd remains."""
        deadline = time.time() + 15
        while time.time() < deadline and (self.api.call("GET", "/v1/sandboxes") or self.shims()
                                          or harness.qemu_pids_for(self.data_dir)):
            time.sleep(0.2)
        self.assertEqual(self.api.call("GET", "/v1/sandboxes"), [])
        self.assertEqual(harness.qemu_pids_for(self.data_dir), [])
        self.assertEqual(self.shims(), [], "a shim process is left")
        self.assertEqual(self.ctr("task", "ls", "-q").stdout.split(), [])

    @classmethod
    def daemon_log_all(cls):
        cls.log.flush()
        with open(os.path.join(cls.tmp, "airlockd.log"), "rb") as f:
            return f.read().decode(errors="replace")

    def wait_for(self, what, fn, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            v = fn()
            if v:
                return v
            time.sleep(0.2)
        self.fail(f"timed out waiting for {what}")

    def test_run_prints_exits_and_caches_the_image(self):
        for name in ("run1", "run2"):
            r = self.ctr("run", "--rm", "--runtime", RUNTIME, IMG, name, "sh", "-c", "echo hi; uname -r; exit 3")
            self.assertEqual(r.returncode, 3, r.stdout + r.stderr + self.containerd_log())
            lines = r.stdout.split()
            self.assertEqual(lines[0], "hi", r.stdout)
            self.assertNotEqual(lines[1], os.uname().release, "the process ran on the host's kernel")
            info = self.api.call("GET", "/v1/info")
            self.assertIn(lines[1], json.dumps(info) + json.dumps(self.api.call("GET", "/v1/images")))
        # The same rootfs became one airlock image, imported once.
        self.assertEqual(len(self.ctr_images()), 1, self.ctr_images())
        imports = [l for l in self.daemon_log_all().splitlines() if "POST /v1/images/ctr-" in l]
        self.assertEqual(len(imports), 1, imports)
        self.assertAllGone()

    def test_exec_ps_kill_and_events_in_order(self):
        events = subprocess.Popen(["ctr", "--address", self.ctd_sock, "events"], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True)
        try:
            time.sleep(0.5)
            r = self.ctr("run", "-d", "--runtime", RUNTIME, IMG, "long", "sleep", "600")
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr + self.containerd_log())
            ps = self.ctr("task", "ps", "long")
            self.assertEqual(ps.returncode, 0, ps.stderr)
            self.assertEqual(len(ps.stdout.strip().splitlines()), 2, ps.stdout)  # header + the sleep
            e = self.ctr("task", "exec", "--exec-id", "ex1", "long", "sh", "-c", "echo from-exec; id -u; exit 5")
            self.assertEqual(e.returncode, 5, e.stdout + e.stderr)
            self.assertEqual(e.stdout.split(), ["from-exec", "0"])
            k = self.ctr("task", "kill", "-s", "SIGTERM", "long")
            self.assertEqual(k.returncode, 0, k.stderr)
            self.wait_for("the task to stop", lambda: "STOPPED" in self.ctr("task", "ls").stdout)
            self.assertEqual(self.ctr("task", "rm", "long").returncode, 0)
            self.assertEqual(self.ctr("container", "rm", "long").returncode, 0)
            self.assertAllGone()
            time.sleep(0.5)
        finally:
            events.terminate()
            out = events.communicate(timeout=10)[0]
        topics = []
        for line in out.splitlines():  # <date> <time> +0000 UTC <namespace> <topic> <event json>
            m = re.search(r" (/tasks/[a-z-]+) (\{.*\})$", line)
            if m and json.loads(m.group(2)).get("container_id") == "long":
                topics.append(m.group(1) + (":exec" if '"ex1"' in m.group(2) else ""))
        self.assertEqual(topics, ["/tasks/create", "/tasks/start", "/tasks/exec-added:exec",
                                  "/tasks/exec-started:exec", "/tasks/exit:exec", "/tasks/exit",
                                  "/tasks/delete"], out)

    def test_stdin_reaches_the_process(self):
        r = subprocess.run(["ctr", "--address", self.ctd_sock, "--namespace", NS, "run", "--rm",
                            "--runtime", RUNTIME, IMG, "cat1", "cat"],
                           input="line one\nline two\n", capture_output=True, text=True, timeout=180)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, "line one\nline two\n")
        self.assertAllGone()

    def run_on_a_terminal(self, argv, cols=100, rows=30, timeout=120):
        """(exit code, output) of `ctr argv` on a pseudo-terminal of cols x rows."""
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        p = subprocess.Popen(["ctr", "--address", self.ctd_sock, "--namespace", NS, *argv],
                             stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
        os.close(slave)
        out = b""
        deadline = time.time() + timeout
        while time.time() < deadline:
            r, _, _ = select.select([master], [], [], 1)
            if r:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every writer is gone
                    break
                if not chunk:
                    break
                out += chunk
            elif p.poll() is not None:
                break
        os.close(master)
        try:
            return p.wait(timeout=30), out.decode(errors="replace")
        except subprocess.TimeoutExpired:
            p.kill()
            raise

    def test_terminal_run_and_exec(self):
        code, out = self.run_on_a_terminal(["run", "-t", "--rm", "--runtime", RUNTIME, IMG, "tty1",
                                            "sh", "-c", "tty; stty size; exit 4"])
        self.assertEqual(code, 4, out)
        self.assertIn("/dev/pts/", out)
        self.assertIn("30 100", out)
        r = self.ctr("run", "-d", "--runtime", RUNTIME, IMG, "tty2", "sleep", "600")
        self.assertEqual(r.returncode, 0, r.stderr)
        # ctr sends an exec's terminal size (ResizePty) only after Start, as it
        # does with runc: the command waits (up to 5 s) for it to arrive.
        wait_size = ('for i in $(seq 50); do s=$(stty size); [ "$s" != "24 80" ] && break; '
                     'sleep 0.1; done; echo "$s"; exit 6')
        code, out = self.run_on_a_terminal(["task", "exec", "-t", "--exec-id", "tx", "tty2",
                                            "sh", "-c", wait_size], cols=90, rows=20)
        self.assertEqual(code, 6, out)
        self.assertIn("20 90", out)
        # A terminal exec is paused with the rest: its guest pid comes with
        # the PTY's start event.
        master, slave = pty.openpty()
        tick = "i=0; while :; do i=$((i+1)); echo $i > /tmp/tp; sleep 0.1; done"
        tp = subprocess.Popen(["ctr", "--address", self.ctd_sock, "--namespace", NS, "task", "exec", "-t",
                               "--exec-id", "tp", "tty2", "sh", "-c", tick],
                              stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
        os.close(slave)
        try:
            reads = iter(range(1000))

            def ticks():
                e = self.ctr("task", "exec", "--exec-id", f"r{next(reads)}", "tty2", "cat", "/tmp/tp")
                return int(e.stdout) if e.returncode == 0 and e.stdout.strip() else 0
            self.wait_for("the terminal exec to tick", lambda: ticks() > 2)
            r = self.ctr("task", "pause", "tty2")
            self.assertEqual(r.returncode, 0, r.stderr)
            frozen = ticks()
            time.sleep(1)
            self.assertEqual(ticks(), frozen, "a paused terminal process ran on")
            self.assertEqual(self.ctr("task", "resume", "tty2").returncode, 0)
            self.wait_for("the terminal exec to run on", lambda: ticks() > frozen + 3)
        finally:
            self.ctr("task", "kill", "-s", "SIGKILL", "tty2")
            try:
                tp.wait(timeout=30)
            finally:
                os.close(master)
        self.ctr("task", "kill", "-s", "SIGKILL", "tty2")
        self.wait_for("the task to stop", lambda: "STOPPED" in self.ctr("task", "ls").stdout)
        self.assertEqual(self.ctr("task", "rm", "tty2").returncode, 0)
        self.assertEqual(self.ctr("container", "rm", "tty2").returncode, 0)
        self.assertAllGone()

    def test_pause_and_resume(self):
        """Pause freezes the container's processes (init and execs) and
        Resume thaws them, with their streams open throughout (airlock's VM
        pause would end them); Kill of a paused container thaws it first."""
        events = subprocess.Popen(["ctr", "--address", self.ctd_sock, "events"], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True)
        execs = iter(range(1000))

        def count(path):
            e = self.ctr("task", "exec", "--exec-id", f"c{next(execs)}", "napper", "cat", path)
            self.assertEqual(e.returncode, 0, e.stdout + e.stderr)
            return int(e.stdout)
        tick = "i=0; while :; do i=$((i+1)); echo $i > /tmp/{}; sleep 0.1; done"
        try:
            time.sleep(0.5)
            r = self.ctr("run", "-d", "--runtime", RUNTIME, IMG, "napper", "sh", "-c", tick.format("init"))
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            ex = subprocess.Popen(["ctr", "--address", self.ctd_sock, "--namespace", NS, "task", "exec",
                                   "--exec-id", "ticker", "napper", "sh", "-c", tick.format("exec")],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.wait_for("both counters", lambda: self.ctr("task", "exec", "--exec-id", f"w{next(execs)}", "napper",
                                                             "cat", "/tmp/init", "/tmp/exec").returncode == 0)
            self.assertEqual(self.ctr("task", "pause", "napper").returncode, 0)
            self.assertIn("PAUSED", self.ctr("task", "ls").stdout)
            frozen = (count("/tmp/init"), count("/tmp/exec"))
            time.sleep(1)
            self.assertEqual((count("/tmp/init"), count("/tmp/exec")), frozen, "a paused process ran on")
            self.assertEqual(len(self.ctr("task", "ps", "napper").stdout.strip().splitlines()), 3)  # header, 2

            self.assertEqual(self.ctr("task", "resume", "napper").returncode, 0)
            self.assertIn("RUNNING", self.ctr("task", "ls").stdout)
            self.wait_for("both counters to run on", lambda: count("/tmp/init") > frozen[0] + 3 and
                          count("/tmp/exec") > frozen[1] + 3)
            self.assertIsNone(ex.poll(), "the exec's stream ended over the pause")
            r = self.ctr("task", "resume", "napper")
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("not paused", r.stderr)

            self.assertEqual(self.ctr("task", "pause", "napper").returncode, 0)
            self.assertEqual(self.ctr("task", "kill", "-s", "SIGKILL", "napper").returncode, 0)
            self.wait_for("the task to stop", lambda: "STOPPED" in self.ctr("task", "ls").stdout)
            self.assertEqual(ex.wait(timeout=30), 137)  # the init's end kills its execs
            self.assertEqual(self.ctr("task", "rm", "napper").returncode, 0)
            self.assertEqual(self.ctr("container", "rm", "napper").returncode, 0)
            self.assertAllGone()
            time.sleep(0.5)
        finally:
            events.terminate()
            out = events.communicate(timeout=10)[0]
        topics = [m.group(1) for m in re.finditer(r" (/tasks/(?:paused|resumed)) \{\"container_id\":\"napper\"", out)]
        self.assertEqual(topics, ["/tasks/paused", "/tasks/resumed", "/tasks/paused", "/tasks/resumed"], out)

    def test_a_killed_shim_is_cleaned_up(self):
        r = self.ctr("run", "-d", "--runtime", RUNTIME, IMG, "doomed", "sleep", "600")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(len(self.api.call("GET", "/v1/sandboxes")), 1)
        shims = self.shims()
        self.assertEqual(len(shims), 1, shims)
        self.assertIn(cri_harness.shim_socket_name(self.ctd_sock, NS, "doomed"), entries(SHIM_SOCKETS))
        os.kill(shims[0], signal.SIGKILL)
        # containerd sees the shim go and runs `containerd-shim-airlock-v2 delete`
        # in the bundle: the sandbox (and its VM) goes with it.
        self.wait_for("the sandbox to go", lambda: self.api.call("GET", "/v1/sandboxes") == [], timeout=60)
        self.ctr("task", "rm", "-f", "doomed")
        self.assertEqual(self.ctr("container", "rm", "doomed").returncode, 0)
        self.assertAllGone()
        # The killed shim's socket went with containerd's `delete` too (named
        # as containerd names it, so other suites' shims running alongside do not count).
        self.assertNotIn(cri_harness.shim_socket_name(self.ctd_sock, NS, "doomed"), entries(SHIM_SOCKETS))

    def test_bad_input_is_refused_and_leaves_nothing(self):
        bad = os.path.join(self.tmp, "bad-runtime.toml")
        with open(bad, "w") as f:
            f.write('socket = "/nonexistent/airlockd.sock"\n')
        r = self.ctr("run", "--rm", "--runtime", RUNTIME, "--runtime-config-path", bad, IMG, "bad1", "true")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("/nonexistent/airlockd.sock", r.stderr)
        r = self.ctr("run", "--rm", "--runtime", RUNTIME, "--annotation", "airlock.dev/memory_mb=8", IMG, "bad2",
                     "true")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("memory_mb", r.stderr)
        r = self.ctr("run", "--rm", "--runtime", RUNTIME, "--annotation", "airlock.dev/cpus=many", IMG, "bad3",
                     "true")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("airlock.dev/cpus", r.stderr)
        for c in ("bad1", "bad2", "bad3"):
            self.ctr("container", "rm", c)
        self.assertAllGone()


if __name__ == "__main__":
    unittest.main()

"""Ordinary agent work on the `debian` image (issue 9, section 1): each
workload in a fresh 512 MiB sandbox whose allowlist names only the test's own
package server (little_repos.py: a real apt repository, a PEP 503 index, a
git repository over dumb HTTP, in network namespaces this test creates).
Each must succeed, the sandbox must answer `echo ok` afterwards, and QEMU's
peak RSS (VmHWM) must stay within guest RAM + QEMU_OVERHEAD. A workload that
exhausts guest RAM is killed by the guest's OOM killer (reason oom_killed),
never QEMU by the host.

Needs root (network namespaces), dpkg-dev and git; skipped otherwise.
"""

import hashlib
import os
import sys
import tempfile
import shutil
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))

from harness import BIN, IMAGE_DIR, ApiError, DaemonTestCase  # noqa: E402
import little_repos as lr  # noqa: E402

MEMORY_MB = 512
MIB = 1024 * 1024
# QEMU's own memory above guest RAM, from bench/tcg_cache.py and this suite
# (docs/design.md, "The jail"): the TCG translation cache (capped at
# vmm::kDefaultTcgTbSizeMb = 128 MiB) + QEMU's code, heap, device state and
# I/O buffers. The jail's limit (vm.cc) is larger still.
QEMU_OVERHEAD = 256 * MIB  # worst measured: +158 MiB (the OOM case), +109 (disk)
# Deterministic disk content: 512 MiB of this line repeated (`yes` in the guest).
DISK_LINE = b"airlock workload suite, deterministic disk content\n"
DISK_BYTES = 512 * MIB


def expected_disk_sha256():
    h = hashlib.sha256()
    chunk = DISK_LINE * ((4 * MIB) // len(DISK_LINE))  # whole lines
    left = DISK_BYTES
    while left >= len(chunk):
        h.update(chunk)
        left -= len(chunk)
    full, rest = divmod(left, len(DISK_LINE))
    h.update(DISK_LINE * full + DISK_LINE[:rest])
    return h.hexdigest()


def ensure_debian_image(test):
    """Builds the debian image into IMAGE_DIR if it is not there (input-keyed: a no-op when built)."""
    import subprocess
    env = dict(os.environ, AIRLOCK_SOCKET=test.sock, AIRLOCK_DATA_DIR=test.data_dir,
               AIRLOCK_IMAGE_DIR=IMAGE_DIR)
    subprocess.run([os.path.join(BIN, "airlock"), "image", "build", "debian"], env=env, check=True,
                   capture_output=True, timeout=1800)


@unittest.skipIf(lr.can_run(), f"workload suite skipped: {lr.can_run()}")
class WorkloadTest(DaemonTestCase):
    net = None
    peaks = {}

    @classmethod
    def setUpClass(cls):
        cls.served = tempfile.mkdtemp(prefix="airlock-wl-")
        try:
            lr.build_all(cls.served)
            cls.net = lr.LittleInternet(cls.served)
            cls.net.start()
            cls.daemon_prefix = cls.net.prefix
            os.environ["AIRLOCK_NET_DNS_UPSTREAM"] = lr.DNS
            super().setUpClass()
        except BaseException:
            cls.cleanup_class()
            raise

    @classmethod
    def cleanup_class(cls):
        os.environ.pop("AIRLOCK_NET_DNS_UPSTREAM", None)
        if cls.net:
            cls.net.stop()
        shutil.rmtree(cls.served, ignore_errors=True)

    @classmethod
    def tearDownClass(cls):
        try:
            super().tearDownClass()
        finally:
            cls.cleanup_class()
            if cls.peaks:
                print("\nQEMU VmHWM per workload (MiB, guest RAM %d):" % MEMORY_MB, file=sys.stderr)
                for k, v in sorted(cls.peaks.items()):
                    print(f"  {k:10s} {v / MIB:7.1f}  ({v / MIB - MEMORY_MB:+.1f} vs RAM)", file=sys.stderr)

    # ------------------------------------------------------------ helpers

    def fresh(self, disk_mb=None):
        """A fresh debian sandbox at 512 MiB whose allowlist names only the test's server."""
        if not hasattr(type(self), "_image_built"):
            ensure_debian_image(self)
            type(self)._image_built = True
        spec = dict(image="debian", memory_mb=MEMORY_MB, timeout=1800,
                    network={"mode": "allowlist", "allow": [lr.NAME]})
        if disk_mb:
            spec["disk_mb"] = disk_mb
        sb = self.api.create(**spec)
        self.addCleanup(self.cleanup, sb["id"])
        self.assertGreater(sb.get("pid", 0), 0, sb)
        return sb["id"], sb["pid"]

    def cleanup(self, sid):
        try:
            self.api.delete(sid)
        except ApiError:
            pass
        self.assertNothingLeft(sid)

    def sh(self, sid, cmd, timeout=600):
        out, err, ex = self.api.exec(sid, cmd=cmd, timeout=timeout, http_timeout=timeout + 60)
        return (out + err).decode(errors="replace"), ex

    def ok(self, sid, cmd, timeout=600):
        out, ex = self.sh(sid, cmd, timeout)
        self.assertEqual((ex["exit_code"], ex["reason"]), (0, "exited"), out[-3000:])
        return out

    def assertHealthy(self, sid, pid, name):
        """The sandbox answers, its QEMU is the same live process, and its peak
        RSS is within guest RAM + QEMU_OVERHEAD."""
        out, ex = self.sh(sid, "echo ok", 60)
        self.assertEqual((out, ex["exit_code"]), ("ok\n", 0))
        sb = self.api.call("GET", f"/v1/sandboxes/{sid}")
        self.assertEqual((sb["state"], sb.get("pid")), ("running", pid), sb)
        hwm, rss = lr.qemu_memory(pid)
        type(self).peaks[name] = hwm
        self.assertLessEqual(hwm, MEMORY_MB * MIB + QEMU_OVERHEAD,
                             f"{name}: QEMU VmHWM {hwm / MIB:.0f} MiB, RSS {rss / MIB:.0f} MiB "
                             f"for a {MEMORY_MB} MiB guest")

    # ------------------------------------------------------------ workloads

    def test_apt_install_from_the_tests_repository(self):
        sid, pid = self.fresh()
        out = self.ok(sid, lr.apt_script(), 900)
        self.assertIn(lr.APT_OUTPUT, out.splitlines()[-1])
        self.assertIn(f"Setting up {lr.APT_PKG} (1.0)", out)
        self.assertEqual(self.ok(sid, f"dpkg-query -W -f '${{Status}}' {lr.APT_PKG}"),
                         "install ok installed")
        self.assertHealthy(sid, pid, "apt")

    def test_pip_install_from_the_tests_index(self):
        sid, pid = self.fresh()
        out = self.ok(sid, lr.pip_script(), 900)
        self.assertEqual(out.splitlines()[-1], lr.PIP_ANSWER, out[-2000:])
        self.assertIn(f"Successfully installed {lr.PIP_PKG}-1.0", out)
        self.assertHealthy(sid, pid, "pip")

    def test_git_clone_log_commit_diff(self):
        sid, pid = self.fresh()
        out = self.ok(sid, f"cd /root && git clone -q {lr.BASE_URL}/repo.git repo 2>&1 && cd repo && "
                           "git log --format=%s")
        self.assertEqual(out.splitlines(), ["add hello.py", lr.GIT_FIRST])
        out = self.ok(sid, "cd /root/repo && python3 hello.py && echo 'print(2)' >> hello.py && "
                           "git diff --stat && git -c user.name=agent -c user.email=agent@example.com "
                           "commit -q -am 'agent edit' && git log --format=%s -1 && "
                           "git diff HEAD~1 -- hello.py | grep '^+print(2)'")
        self.assertEqual(out.splitlines(), ["hello from git", " hello.py | 1 +",
                                            " 1 file changed, 1 insertion(+)", "agent edit",
                                            "+print(2)"])
        self.assertHealthy(sid, pid, "git")

    def test_python_stdlib_and_60s_of_cpu(self):
        sid, pid = self.fresh()
        self.api.put_file(sid, "/root/work.py", lr.PYTHON_SCRIPT.encode())
        t0 = time.time()
        out = self.ok(sid, "python3 /root/work.py 60", 900)
        took = time.time() - t0
        lines = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
        imported = int(lines["imported"].split()[0])
        self.assertGreaterEqual(imported, 150, out)
        self.assertGreaterEqual(float(lines["rounds"].split("cpu_s ")[1]), 60.0, out)
        self.assertGreater(int(lines["rounds"].split()[0]), 0, out)
        self.assertGreaterEqual(took, 60)
        self.assertHealthy(sid, pid, "python")

    def test_disk_512mib_and_50000_files(self):
        # The image's rootfs + 512 MiB + room for the 50,000 files.
        sid, pid = self.fresh(disk_mb=2048)
        # Written, flushed, dropped from the guest's page cache, read back.
        out = self.ok(sid, f"yes '{DISK_LINE.decode().rstrip()}' 2>/dev/null | head -c {DISK_BYTES} > /root/big && "
                           "sync && echo 3 > /proc/sys/vm/drop_caches && stat -c %s /root/big && "
                           "sha256sum /root/big | cut -d' ' -f1 && rm /root/big", 900)
        self.assertEqual(out.split(), [str(DISK_BYTES), expected_disk_sha256()])
        out = self.ok(sid, "mkdir /root/many && python3 -c \"\n"
                           "for i in range(50000):\n"
                           "    open('/root/many/f%05d' % i, 'w').write(str(i))\n\" && "
                           "find /root/many -type f | wc -l && cat /root/many/f49999 && echo && "
                           "rm -rf /root/many && ls /root | grep -c many || true", 900)
        self.assertEqual(out.split(), ["50000", "49999", "0"])
        self.assertHealthy(sid, pid, "disk")

    def test_guest_oom_kills_inside_the_guest_not_qemu(self):
        sid, pid = self.fresh()
        # QEMU's worst case: the translation cache filled by code-heavy work
        # first (apt, then python's standard library), then all of guest RAM.
        self.ok(sid, lr.apt_script(), 900)
        self.api.put_file(sid, "/root/work.py", lr.PYTHON_SCRIPT.encode())
        self.ok(sid, "python3 /root/work.py 0 5", 900)
        # No exec memory limit: the guest's RAM is what runs out.
        out, ex = self.sh(sid, "python3 -c \"\n"
                               "x = []\n"
                               "while True:\n"
                               "    x.append(b'\\x01' * (32 << 20))\n\"", 300)
        self.assertEqual(ex["reason"], "oom_killed", (ex, out[-2000:]))
        self.assertHealthy(sid, pid, "oom")
        log = self.ok(sid, "dmesg | grep -ci 'out of memory' || true")
        self.assertGreaterEqual(int(log.strip()), 1)


if __name__ == "__main__":
    unittest.main()

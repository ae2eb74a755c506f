"""`airlock probe` end to end: the whole battery (minimal image, --quick)
against the harness daemon, as JSON; every check must PASS or be an
explicit SKIP with a reason, and nothing of any probe sandbox may remain.
"""

import json
import os
import subprocess
import unittest

from harness import BIN, IMAGE_DIR, DaemonTestCase

SECTIONS = ["1 task", "2 reach", "3 leftovers", "4 time", "5 hostile", "6 after", "7 cleanup"]


class ProbeTest(DaemonTestCase):
    def test_probe_quick_json_passes_and_leaves_nothing(self):
        env = dict(os.environ, AIRLOCK_SOCKET=self.sock, AIRLOCK_DATA_DIR=self.data_dir,
                   AIRLOCK_IMAGE_DIR=IMAGE_DIR)
        r = subprocess.run([os.path.join(BIN, "airlock"), "probe", "--image", "minimal", "--quick",
                            "--json"], env=env, capture_output=True, timeout=1700)
        stderr = r.stderr.decode(errors="replace")
        report = json.loads(r.stdout)
        checks = report["checks"]
        failed = [c for c in checks if c["status"] not in ("PASS", "SKIP")]
        self.assertEqual(failed, [], json.dumps(failed, indent=2) + "\n" + stderr[-3000:])
        for c in checks:
            if c["status"] == "SKIP":
                self.assertTrue(c["observed"], f"SKIP without a reason: {c}")
        self.assertEqual(r.returncode, 0, stderr[-3000:])
        self.assertTrue(report["passed"])
        self.assertEqual(report["image"], "minimal")
        # Every section ran (the battery did not stop early).
        self.assertEqual(sorted({c["section"] for c in checks}), SECTIONS)
        names = " | ".join(c["check"] for c in checks)
        for expected in ["fetch a URL", "network none", "network open", "guest kernel panic",
                         "QEMU killed", "fork bomb", "memory hog", "disk fill", "inode fill",
                         "output flood", "double-forked", "sysrq", "/dev/vda", "idle"]:
            self.assertIn(expected, names)
        # On the minimal image (busybox) there is no package manager: an explicit SKIP.
        install = next(c for c in checks if c["check"].startswith("install a package"))
        self.assertEqual((install["status"], install["observed"]),
                         ("SKIP", "no package manager in image"))
        self.assertGreater(report["time_to_instance_p50_ms"], 0)

        # Nothing of any probe sandbox is left: not in the daemon, not on the host.
        probe_sbs = [sb for sb in self.api.call("GET", "/v1/sandboxes?all=true")
                     if "airlock_probe" in sb.get("metadata", {})]
        self.assertGreaterEqual(len(probe_sbs), 10)
        for sb in probe_sbs:
            self.assertNotIn(sb["state"], ("running", "starting"), sb)
            self.assertNothingLeft(sb["id"])
        self.assertEqual(self.api.call("GET", "/v1/sandboxes"), [])

    def test_bad_network_is_a_usage_error_before_any_sandbox(self):
        env = dict(os.environ, AIRLOCK_SOCKET=self.sock, AIRLOCK_DATA_DIR=self.data_dir)
        r = subprocess.run([os.path.join(BIN, "airlock"), "probe", "--network", "allowlist"],
                           env=env, capture_output=True, timeout=60)
        self.assertEqual(r.returncode, 2)
        self.assertIn(b"--network", r.stderr)
        self.assertEqual(self.api.call("GET", "/v1/sandboxes"), [])

    def test_unknown_only_section_is_an_error_before_any_sandbox(self):
        env = dict(os.environ, AIRLOCK_SOCKET=self.sock, AIRLOCK_DATA_DIR=self.data_dir)
        r = subprocess.run([os.path.join(BIN, "airlock"), "probe", "--only", "task,bogus"],
                           env=env, capture_output=True, timeout=60)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(b"--only: unknown section bogus", r.stderr)
        self.assertEqual(self.api.call("GET", "/v1/sandboxes"), [])


NS_OFFLINE = f"alprobe-{os.getpid()}"


def can_make_netns():
    if os.geteuid() != 0:
        return "needs root (ip netns add)"
    if subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        return "network namespaces unavailable"
    return None


@unittest.skipIf(can_make_netns(), f"offline probe test skipped: {can_make_netns()}")
class ProbeOpenWithoutOutsideNetworkTest(DaemonTestCase):
    """`--network open` on a host without outside network: the apt and pip
    tasks (and the fetch) are SKIPs naming the unreachable source, never
    FAILs. The daemon runs in a network namespace of this test's with only a
    loopback: whatever source the debian image is configured with cannot be
    reached, and nothing leaves the namespace."""

    daemon_prefix = ["ip", "netns", "exec", NS_OFFLINE]

    @classmethod
    def setUpClass(cls):
        subprocess.run(["ip", "netns", "add", NS_OFFLINE], check=True, capture_output=True)
        subprocess.run(["ip", "-n", NS_OFFLINE, "link", "set", "lo", "up"], check=True)
        # The helper's resolver: a documentation address with no route here.
        os.environ["AIRLOCK_NET_DNS_UPSTREAM"] = "192.0.2.53"
        try:
            super().setUpClass()
        except BaseException:
            cls.remove_netns()
            raise

    @classmethod
    def remove_netns(cls):
        os.environ.pop("AIRLOCK_NET_DNS_UPSTREAM", None)
        subprocess.run(["ip", "netns", "del", NS_OFFLINE], capture_output=True)

    @classmethod
    def tearDownClass(cls):
        try:
            super().tearDownClass()
        finally:
            cls.remove_netns()

    def test_apt_and_pip_tasks_skip_with_the_reason(self):
        env = dict(os.environ, AIRLOCK_SOCKET=self.sock, AIRLOCK_DATA_DIR=self.data_dir,
                   AIRLOCK_IMAGE_DIR=IMAGE_DIR)
        airlock = os.path.join(BIN, "airlock")
        subprocess.run([airlock, "image", "build", "debian"], env=env, check=True,
                       capture_output=True, timeout=1800)
        r = subprocess.run([airlock, "probe", "--image", "debian", "--network", "open",
                            "--only", "task", "--json"], env=env, capture_output=True, timeout=900)
        stderr = r.stderr.decode(errors="replace")
        report = json.loads(r.stdout)
        checks = {c["check"]: c for c in report["checks"]}
        failed = [c for c in report["checks"] if c["status"] not in ("PASS", "SKIP")]
        self.assertEqual(failed, [], json.dumps(failed, indent=2) + "\n" + stderr[-3000:])
        self.assertEqual(r.returncode, 0, stderr[-3000:])
        for name, source in (("install a package (apt-get)", "the image's apt source "),
                             ("install a Python package (pip)", "pip's configured index ")):
            c = checks[name]
            self.assertEqual(c["status"], "SKIP", c)
            self.assertTrue(c["observed"].startswith("no outside network: " + source), c)
            self.assertRegex(c["observed"], r"does not (resolve|accept a connection) \(5 s\)$")
        self.assertEqual(checks["fetch a URL by name"]["status"], "SKIP")
        self.assertIn("no outside network", checks["fetch a URL by name"]["observed"])
        self.assertEqual(checks["write a file, read it back"]["status"], "PASS")
        # --only task: no other section ran; cleanup always does.
        self.assertEqual(sorted({c["section"] for c in report["checks"]}),
                         ["1 task", "2 reach", "7 cleanup"])
        self.assertEqual(self.api.call("GET", "/v1/sandboxes"), [])


if __name__ == "__main__":
    unittest.main()

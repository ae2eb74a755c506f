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


if __name__ == "__main__":
    unittest.main()

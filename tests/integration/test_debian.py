"""The debian image: Python runs in the guest and sees the guest's kernel."""

import os
import subprocess
import unittest

from harness import BIN, IMAGE_DIR, DaemonTestCase


class DebianTest(DaemonTestCase):
    def test_python_reports_guest_kernel(self):
        env = dict(os.environ, AIRLOCK_SOCKET=self.sock, AIRLOCK_DATA_DIR=self.data_dir,
                   AIRLOCK_IMAGE_DIR=IMAGE_DIR)
        airlock = os.path.join(BIN, "airlock")
        subprocess.run([airlock, "image", "build", "debian"], env=env, check=True, timeout=1800)
        r = subprocess.run([airlock, "run", "--image", "debian", "--", "python3", "-c",
                            "import platform; print(platform.release())"],
                           env=env, capture_output=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stderr)
        images = {i["name"]: i for i in self.api.call("GET", "/v1/info")["images"]}
        self.assertEqual(r.stdout.decode().strip(), images["debian"]["kernel_release"])
        self.assertNotEqual(r.stdout.decode().strip(), os.uname().release)


if __name__ == "__main__":
    unittest.main()

"""The debian image: Python runs in the guest and sees the guest's kernel, and
answers line by line over a pipe (streamed stdin)."""

import os
import select
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

    def test_python_interactive_over_a_pipe_answers_each_line(self):
        env = dict(os.environ, AIRLOCK_SOCKET=self.sock, AIRLOCK_DATA_DIR=self.data_dir,
                   AIRLOCK_IMAGE_DIR=IMAGE_DIR)
        airlock = os.path.join(BIN, "airlock")
        subprocess.run([airlock, "image", "build", "debian"], env=env, check=True, timeout=1800)
        sid = self.api.create(image="debian", memory_mb=512)["id"]
        try:
            proc = subprocess.Popen([airlock, "exec", sid, "--", "python3", "-i"],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, env=env)
            try:
                # Each answer is read before the next line is written: the CLI
                # forwards a line as it is written, not at EOF.
                for line, answer in [(b"x = 6\n", None), (b"print(x * 7)\n", b"42\n"),
                                     (b"x += 1; print('x is', x)\n", b"x is 7\n")]:
                    proc.stdin.write(line)
                    proc.stdin.flush()
                    if answer is None:
                        continue
                    ready, _, _ = select.select([proc.stdout], [], [], 60)
                    self.assertTrue(ready, f"no answer to {line!r}")
                    self.assertEqual(proc.stdout.readline(), answer)
                proc.stdin.write(b"raise SystemExit(3)\n")
                proc.stdin.close()
                self.assertEqual(proc.wait(timeout=60), 3)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                proc.stdout.close()
        finally:
            self.api.delete(sid)


if __name__ == "__main__":
    unittest.main()

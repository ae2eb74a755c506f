"""`airlock mcp` under the official MCP TypeScript SDK (client_test.mjs), against
a real airlockd and real VMs. The npm packages come from package-lock.json
(`npm ci`, run once when node_modules is missing; offline after that)."""

import os
import shutil
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "integration"))

from harness import BIN, IMAGE_DIR, DaemonTestCase, leftovers_of  # noqa: E402


def ensure_node_modules():
    if os.path.isdir(os.path.join(HERE, "node_modules", "@modelcontextprotocol", "sdk")):
        return
    npm = shutil.which("npm")
    if not npm or not shutil.which("node"):
        # A failure, not a skip: a missing client must not pass as a passing test.
        raise RuntimeError("node and npm are needed: run scripts/setup.sh")
    subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=HERE, check=True, timeout=600)


class McpClientTest(DaemonTestCase):
    @classmethod
    def setUpClass(cls):
        ensure_node_modules()
        super().setUpClass()

    def test_official_sdk_client_drives_every_tool(self):
        env = dict(os.environ, AIRLOCK_BIN=BIN, AIRLOCK_SOCKET=self.sock,
                   AIRLOCK_DATA_DIR=self.data_dir, AIRLOCK_IMAGE_DIR=IMAGE_DIR)
        r = subprocess.run(["node", os.path.join(HERE, "client_test.mjs")], cwd=HERE, env=env,
                           capture_output=True, timeout=600)
        out, err = r.stdout.decode(), r.stderr.decode()
        self.assertEqual(r.returncode, 0, f"stdout:\n{out}\nstderr:\n{err}\n{self.daemon_log()}")
        kept = [line.split()[1] for line in out.splitlines() if line.startswith("KEPT ")]
        self.assertEqual(len(kept), 1, out)
        # After every session ended, only the keep: true sandbox runs, and every
        # other sandbox the sessions created left nothing behind.
        running = [sb["id"] for sb in self.api.call("GET", "/v1/sandboxes")]
        self.assertEqual(running, kept)
        for sb in self.api.call("GET", "/v1/sandboxes?all=true"):
            if sb["id"] not in kept:
                self.assertEqual(sb["state"], "deleted", sb)
                self.assertEqual(leftovers_of(self.data_dir, sb["id"]), [])
        self.api.delete(kept[0])
        self.assertNothingLeft(kept[0])


if __name__ == "__main__":
    unittest.main()

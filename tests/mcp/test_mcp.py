"""`airlock mcp` under the official MCP TypeScript SDKs, against a real airlockd
and real VMs: v1 (client_test.mjs, the initialize handshake revisions) and v2
(client_2026_test.mjs, the stateless revision 2026-07-28). The npm packages come from package-lock.json
(`npm ci`, run once when node_modules is missing; offline after that)."""

import json
import os
import shutil
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "integration"))

from harness import BIN, IMAGE_DIR, DaemonTestCase, free_port, leftovers_of  # noqa: E402


def ensure_node_modules():
    mods = os.path.join(HERE, "node_modules", "@modelcontextprotocol")
    if all(os.path.isdir(os.path.join(mods, p)) for p in ("sdk", "client")):
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

    def run_client(self, script):
        env = dict(os.environ, AIRLOCK_BIN=BIN, AIRLOCK_SOCKET=self.sock,
                   AIRLOCK_DATA_DIR=self.data_dir, AIRLOCK_IMAGE_DIR=IMAGE_DIR)
        r = subprocess.run(["node", os.path.join(HERE, script)], cwd=HERE, env=env,
                           capture_output=True, timeout=600)
        out, err = r.stdout.decode(), r.stderr.decode()
        self.assertEqual(r.returncode, 0, f"stdout:\n{out}\nstderr:\n{err}\n{self.daemon_log()}")
        return out

    def test_official_sdk_client_drives_every_tool(self):
        out = self.run_client("client_test.mjs")
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

    def test_sdk_v2_client_speaks_2026_07_28_without_initialize(self):
        out = self.run_client("client_2026_test.mjs")
        self.assertIn("ok: sandbox_create + sandbox_exec in a real VM", out)
        self.assertIn("ok: auto negotiation picks 2026-07-28", out)
        # The client's session ended: the sandbox it created is gone, files too.
        made = [line.split()[1] for line in out.splitlines() if line.startswith("CREATED ")]
        self.assertEqual(len(made), 1, out)
        mine = [sb for sb in self.api.call("GET", "/v1/sandboxes?all=true") if sb["id"] == made[0]]
        self.assertEqual([sb["state"] for sb in mine], ["deleted"], mine)
        self.assertNothingLeft(made[0])


class McpScopeTest(DaemonTestCase):
    """What a session reaches: its own sandboxes on the unix socket (all with
    --all), one tenant's over AIRLOCK_URL/AIRLOCK_TOKEN (client_scope_test.mjs)."""

    @classmethod
    def setUpClass(cls):
        ensure_node_modules()
        cls.port = free_port()
        cls.daemon_args = ["--listen", f"127.0.0.1:{cls.port}"]
        super().setUpClass()

    def test_sessions_act_only_where_they_may(self):
        r = subprocess.run([os.path.join(BIN, "airlock"), "--socket", self.sock, "token", "create",
                            "--tenant", "acme", "--json"], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        env = dict(os.environ, AIRLOCK_BIN=BIN, AIRLOCK_SOCKET=self.sock, AIRLOCK_DATA_DIR=self.data_dir,
                   AIRLOCK_IMAGE_DIR=IMAGE_DIR, AIRLOCK_URL_FOR_TEST=f"http://127.0.0.1:{self.port}",
                   AIRLOCK_TOKEN_FOR_TEST=json.loads(r.stdout)["secret"])
        r = subprocess.run(["node", os.path.join(HERE, "client_scope_test.mjs")], cwd=HERE, env=env,
                           capture_output=True, timeout=600)
        out, err = r.stdout.decode(), r.stderr.decode()
        self.assertEqual(r.returncode, 0, f"stdout:\n{out}\nstderr:\n{err}\n{self.daemon_log()}")
        self.assertIn("ok: all scope checks passed", out)
        self.assertEqual(self.api.call("GET", "/v1/sandboxes"), [])


if __name__ == "__main__":
    unittest.main()

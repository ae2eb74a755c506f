"""airlockd's TCP listener: tokens, tenants, quotas, auth failures, TLS.

A real daemon with --listen on a free loopback port; tokens made with the
real CLI (`airlock token create`) over the unix socket; requests over TCP
with and without them.
"""

import json
import os
import subprocess
import unittest

import harness
from harness import BIN, ApiError, DaemonTestCase, TcpClient, free_port


def cli(test, *args, check=True):
    """Runs the real `airlock` CLI against the class's daemon (its unix socket)."""
    r = subprocess.run([os.path.join(BIN, "airlock"), "--socket", test.sock, *args],
                       capture_output=True, text=True, timeout=60)
    if check and r.returncode != 0:
        raise AssertionError(f"airlock {' '.join(args)}: {r.returncode}: {r.stderr}")
    return r


class TokenTest(DaemonTestCase):
    """Tokens over the unix socket, used on the TCP listener."""

    @classmethod
    def setUpClass(cls):
        cls.port = free_port()
        cls.daemon_args = ["--listen", f"127.0.0.1:{cls.port}"]
        super().setUpClass()

    def tcp(self, token=None):
        return TcpClient("127.0.0.1", self.port, token)

    def new_token(self, tenant, *extra):
        r = cli(self, "token", "create", "--tenant", tenant, "--json", *extra)
        return json.loads(r.stdout)

    def test_no_token_is_401_without_detail(self):
        for path in ["/v1/sandboxes", "/v1/info", "/v1/sandboxes/sb-x", "/v1/tokens"]:
            with self.assertRaises(ApiError) as e:
                self.tcp().call("GET", path)
            self.assertEqual((e.exception.status, e.exception.code), (401, "unauthenticated"), path)
            self.assertEqual(e.exception.message, "authentication required")
        with self.assertRaises(ApiError) as e:
            self.tcp("airlock_" + "0" * 40).call("GET", "/v1/sandboxes")
        self.assertEqual(e.exception.status, 401)
        self.assertEqual(e.exception.message, "authentication required")  # same words: no hint

    def test_token_create_prints_secret_once_and_works(self):
        r = cli(self, "token", "create", "--tenant", "acme")
        secret = r.stdout.strip()
        self.assertRegex(secret, r"^airlock_[0-9a-f]{40}$")
        self.assertIn("shown only now", r.stderr)
        self.assertEqual(self.tcp(secret).call("GET", "/v1/sandboxes"), [])
        # X-API-KEY works too (E2B's SDK sends its key that way).
        c = TcpClient("127.0.0.1", self.port)
        c.headers = {"X-API-KEY": secret}
        self.assertEqual(c.call("GET", "/v1/sandboxes"), [])
        # Stored hashed only: the secret is nowhere in the data dir.
        for root, _, files in os.walk(self.data_dir):
            for f in files:
                p = os.path.join(root, f)
                if os.path.isfile(p) and not f.endswith(".sock"):
                    with open(p, "rb") as fh:
                        self.assertNotIn(secret.encode(), fh.read(), p)
        self.assertEqual(os.stat(os.path.join(self.data_dir, "tokens.json")).st_mode & 0o777, 0o600)
        ls = cli(self, "token", "ls").stdout
        self.assertIn("acme", ls)
        self.assertNotIn(secret, ls)

    def test_e2b_form(self):
        tok = self.new_token("acme", "--e2b")
        self.assertRegex(tok["secret"], r"^e2b_[0-9a-f]{40}$")
        self.assertEqual(tok["format"], "e2b")
        self.assertEqual(self.tcp(tok["secret"]).call("GET", "/v1/sandboxes"), [])

    def test_token_routes_are_operator_only(self):
        tok = self.new_token("acme")
        for method, path in [("GET", "/v1/tokens"), ("POST", "/v1/tokens"),
                             ("DELETE", f"/v1/tokens/{tok['id']}")]:
            body = {"tenant": "acme"} if method == "POST" else None
            with self.assertRaises(ApiError) as e:
                self.tcp(tok["secret"]).call(method, path, body)
            self.assertEqual((e.exception.status, e.exception.code), (404, "not_found"))
        # Still valid: the DELETE over TCP did nothing.
        self.tcp(tok["secret"]).call("GET", "/v1/sandboxes")

    def test_revoked_token_stops_at_once(self):
        tok = self.new_token("acme")
        c = self.tcp(tok["secret"])
        c.call("GET", "/v1/sandboxes")
        self.assertEqual(cli(self, "token", "rm", tok["id"]).stdout.strip(), tok["id"])
        with self.assertRaises(ApiError) as e:
            c.call("GET", "/v1/sandboxes")
        self.assertEqual(e.exception.status, 401)
        self.assertNotIn(tok["id"], [t["id"] for t in self.api.call("GET", "/v1/tokens")])
        with self.assertRaises(ApiError) as e:
            self.api.call("DELETE", f"/v1/tokens/{tok['id']}")
        self.assertEqual((e.exception.status, e.exception.code), (404, "not_found"))
        r = cli(self, "token", "rm", tok["id"], check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("no token", r.stderr)

    def test_bad_token_requests_are_400(self):
        for body, field in [({}, "tenant"), ({"tenant": "Bad Name"}, "tenant"),
                            ({"tenant": "a", "expires_in_s": -1}, "expires_in_s"),
                            ({"tenant": "a", "format": "x"}, "format"),
                            ({"tenant": "a", "extra": 1}, "extra")]:
            with self.assertRaises(ApiError) as e:
                self.api.call("POST", "/v1/tokens", body)
            self.assertEqual((e.exception.status, e.exception.field), (400, field), body)
        with self.assertRaises(ApiError) as e:
            self.api.call("DELETE", "/v1/tokens/bad!id")
        self.assertEqual(e.exception.status, 400)
        r = cli(self, "token", "create", "--tenant", "a", "--expires", "soon", check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--expires", r.stderr)

    def test_audit_log_records_failures_never_secrets(self):
        tok = self.new_token("acme")
        wrong = tok["secret"][:-1] + ("0" if tok["secret"][-1] != "0" else "1")
        with self.assertRaises(ApiError):
            self.tcp(wrong).call("GET", "/v1/info")
        with open(os.path.join(self.data_dir, "audit.jsonl")) as f:
            text = f.read()
        records = [json.loads(line) for line in text.splitlines()]
        self.assertIn({"source": "127.0.0.1", "method": "GET", "route": "/v1/info",
                       "outcome": "unauthenticated", "status": 401},
                      [{k: v for k, v in r.items() if k != "time"} for r in records])
        self.assertTrue(any(r["outcome"] == "token_created" and r["token_id"] == tok["id"]
                            for r in records))
        self.assertNotIn(tok["secret"], text)
        self.assertNotIn(wrong, text)


class ListenRefusedTest(unittest.TestCase):
    def test_plain_http_on_a_non_loopback_address_is_refused(self):
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            r = subprocess.run([os.path.join(BIN, "airlockd"), "--data-dir", tmp,
                                "--listen", f"0.0.0.0:{free_port()}"],
                               capture_output=True, text=True, timeout=30)
            self.assertEqual(r.returncode, 1)
            self.assertIn("not a loopback address", r.stdout + r.stderr)
            self.assertIn("--tls-cert", r.stdout + r.stderr)


if __name__ == "__main__":
    unittest.main()

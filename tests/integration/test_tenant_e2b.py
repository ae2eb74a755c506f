"""The E2B surface between tenants, through a real airlockd over TCP with two
tenants made by the real CLI and real VMs (image `minimal`):

* every E2B create is secure (envd wants the sandbox's access token), on the
  v1 route too; `secure: false` is refused unless the operator started the
  daemon with --e2b-allow-insecure;
* an anonymous envd call to any sandbox without its access token is refused,
  and wrong access tokens and unknown ids count as failed authentications
  of their source address (429 once its budget is spent);
* every mutating E2B call (kill, timeout, connect, pause...) is on the
  daemon's audit log (<data dir>/audit.jsonl) with tenant and token id.

Raw HTTP (http.client), as E2B's SDK speaks it; the SDK itself runs in
tests/e2b."""

import http.client
import json
import os
import subprocess
import unittest

from harness import TcpDaemonTestCase

TEMPLATE = "minimal"


class E2bTenantCase(TcpDaemonTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.key_a, cls.id_a = cls.new_token("acme", "--e2b")
        cls.key_b, cls.id_b = cls.new_token("rival", "--e2b")

    @classmethod
    def http(cls, method, path, body=None, headers=None, source=None):
        conn = http.client.HTTPConnection("127.0.0.1", cls.port, timeout=300,
                                          source_address=(source, 0) if source else None)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            data = resp.read()
            try:
                return resp.status, json.loads(data) if data else None
            except ValueError:
                return resp.status, data
        finally:
            conn.close()

    @classmethod
    def e2b(cls, method, path, body=None, key=None):
        return cls.http(method, "/e2b/api" + path, None if body is None else json.dumps(body),
                        {"X-API-KEY": key or cls.key_a, "Content-Type": "application/json"})

    @classmethod
    def envd_health(cls, sid, token=None, source=None):
        headers = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49983"}
        if token:
            headers["X-Access-Token"] = token
        return cls.http("GET", "/e2b/envd/health", headers=headers, source=source)[0]

    def create(self, route="/sandboxes", key=None, **body):
        status, sb = self.e2b("POST", route, dict({"templateID": TEMPLATE, "timeout": 300}, **body), key)
        self.assertEqual(status, 201, sb)
        self.addCleanup(lambda: self.e2b("DELETE", f"/sandboxes/{sb['sandboxID']}", key=key))
        return sb

    def audit(self):
        with open(os.path.join(self.data_dir, "audit.jsonl")) as f:
            return [json.loads(line) for line in f if line.strip()]


class SecureByDefaultTest(E2bTenantCase):
    def test_every_create_route_is_secure_and_anonymous_envd_is_refused(self):
        for route in ("/sandboxes", "/v2/sandboxes"):
            sb = self.create(route)
            sid = sb["sandboxID"]
            # Secure although the body never asked: a token comes back.
            self.assertRegex(sb.get("envdAccessToken", ""), r"^[0-9a-f]{64}$", route)
            # Anonymous, no token: the answer for a sandbox that does not exist.
            self.assertEqual(self.envd_health(sid), 502, route)
            self.assertEqual(self.envd_health(sid, "0" * 64), 502, route)
            self.assertEqual(self.envd_health(sid, sb["envdAccessToken"]), 204, route)
            # connect hands out the same token again.
            status, again = self.e2b("POST", f"/sandboxes/{sid}/connect", {})
            self.assertEqual((status, again.get("envdAccessToken")), (200, sb["envdAccessToken"]))

    def test_secure_false_is_refused_without_the_operators_flag(self):
        status, body = self.e2b("POST", "/sandboxes", {"templateID": TEMPLATE, "secure": False})
        self.assertEqual(status, 400, body)
        self.assertEqual(body["code"], 400)
        self.assertIn("--e2b-allow-insecure", body["message"])
        self.assertEqual(self.api.call("GET", "/v1/sandboxes"), [])  # nothing half-made

    def test_wrong_tokens_and_unknown_ids_count_as_auth_failures(self):
        sb = self.create()
        sid = sb["sandboxID"]
        # 127.0.0.2 guesses access tokens, 127.0.0.3 sandbox ids: the
        # daemon's budget of 10 failures back to back each, then 429.
        guesses = [self.envd_health(sid, f"{i:064x}", source="127.0.0.2") for i in range(12)]
        self.assertEqual(guesses[:10], [502] * 10)
        self.assertEqual(guesses[10:], [429] * 2)
        ids = [self.envd_health(f"sb-{i:012x}", source="127.0.0.3") for i in range(12)]
        self.assertEqual(ids[:10], [502] * 10)
        self.assertEqual(ids[10:], [429] * 2)
        # A valid credential is never refused, even from a limited address
        # (one bad client behind a shared proxy must not lock out the rest)...
        self.assertEqual(self.envd_health(sid, sb["envdAccessToken"], source="127.0.0.2"), 204)
        # ... and other addresses are untouched.
        self.assertEqual(self.envd_health(sid, sb["envdAccessToken"]), 204)
        failures = [r for r in self.audit() if r.get("route", "").startswith("/e2b/envd")
                    and r["source"] in ("127.0.0.2", "127.0.0.3")]
        self.assertEqual({r["source"] for r in failures}, {"127.0.0.2", "127.0.0.3"})
        self.assertIn(sid, {r.get("sandbox") for r in failures})
        outcomes = [r["outcome"] for r in failures if r["source"] == "127.0.0.2"]
        self.assertEqual(outcomes[:11], ["unauthenticated"] * 10 + ["rate_limited"])

    def test_mutating_calls_are_audited_with_tenant_and_token(self):
        sb = self.create("/v2/sandboxes")
        sid = sb["sandboxID"]
        self.assertEqual(self.e2b("POST", f"/sandboxes/{sid}/timeout", {"timeout": 200})[0], 204)
        self.assertEqual(self.e2b("POST", f"/v2/sandboxes/{sid}/connect", {"timeout": 250})[0], 200)
        self.assertEqual(self.e2b("POST", f"/sandboxes/{sid}/pause", {})[0], 501)
        # Another tenant's kill: 404, and on the record as that tenant's.
        self.assertEqual(self.e2b("DELETE", f"/sandboxes/{sid}", key=self.key_b)[0], 404)
        self.assertEqual(self.e2b("DELETE", f"/sandboxes/{sid}")[0], 204)
        mine = [r for r in self.audit() if r.get("sandbox") == sid]
        seen = [(r["method"], r["route"], r.get("tenant"), r.get("token_id"), r["outcome"], r.get("status"))
                for r in mine]
        self.assertEqual(seen, [
            ("POST", "create_sandbox", "acme", self.id_a, "sandbox_created", 201),
            ("POST", "/e2b/api/sandboxes/{id}/timeout", "acme", self.id_a, "timeout_set", 204),
            ("POST", "/e2b/api/v2/sandboxes/{id}/connect", "acme", self.id_a, "sandbox_connected", 200),
            ("POST", "/e2b/api/sandboxes/{id}/pause", "acme", self.id_a, "refused", 501),
            ("DELETE", "/e2b/api/sandboxes/{id}", "rival", self.id_b, "not_found", 404),
            ("DELETE", "/e2b/api/sandboxes/{id}", "acme", self.id_a, "sandbox_deleted", 204),
        ])
        self.assertEqual({r["source"] for r in mine}, {"127.0.0.1"})


class InsecureAllowedTest(E2bTenantCase):
    """airlockd --e2b-allow-insecure: `secure: false` is honoured on the v1
    route; everything else stays secure."""

    extra_args = ["--e2b-allow-insecure"]

    def test_secure_false_is_honoured_and_the_default_stays_secure(self):
        open_sb = self.create(secure=False)
        self.assertNotIn("envdAccessToken", open_sb)
        self.assertEqual(self.envd_health(open_sb["sandboxID"]), 204)
        # Unknown ids still count against their source, even here.
        self.assertEqual(self.envd_health("sb-000000000000", source="127.0.0.4"), 502)
        for route, body in (("/sandboxes", {}), ("/v2/sandboxes", {"secure": False})):
            sb = self.create(route, **body)
            self.assertIn("envdAccessToken", sb, route)
            self.assertEqual(self.envd_health(sb["sandboxID"]), 502, route)


if __name__ == "__main__":
    unittest.main()

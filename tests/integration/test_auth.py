"""airlockd's TCP listener: tokens, tenants, quotas, auth failures, TLS.

A real daemon with --listen on a free loopback port; tokens made with the
real CLI (`airlock token create`) over the unix socket; requests over TCP
with and without them.
"""

import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
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
        self.assertIsNone(self.api.call("DELETE", f"/v1/tokens/{tok['id']}"))  # 204 over the API
        with self.assertRaises(ApiError) as e:
            self.tcp(tok["secret"]).call("GET", "/v1/sandboxes")
        self.assertEqual(e.exception.status, 401)

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


# A row of the route table: {"METHOD", "/template", Access::who, serve::handler}.
ROUTE_LINE = re.compile(r'\{"(GET|PUT|POST|DELETE|PATCH)",\s*"(/[^"]*)",\s*Access::(\w+),\s*serve::(\w+)\}')


def sandbox_routes():
    """(method, template, name) of every route on one sandbox, from the
    daemon's own route table: a route added later is covered automatically."""
    with open(os.path.join(harness.ROOT, "src", "daemon", "routes.cc")) as f:
        return [(m, t, name) for m, t, access, name in ROUTE_LINE.findall(f.read())
                if access == "own_sandbox"]


class TenantTest(DaemonTestCase):
    """Two tenants' tokens on the TCP listener, real VMs: B cannot tell A's
    sandbox from one that does not exist, whatever it tries."""

    @classmethod
    def setUpClass(cls):
        cls.port = free_port()
        cls.daemon_args = ["--listen", f"127.0.0.1:{cls.port}"]
        super().setUpClass()
        made = {}
        for tenant in ("alpha", "beta"):
            made[tenant] = cls.api.call("POST", "/v1/tokens", {"tenant": tenant})["secret"]
        cls.a = TcpClient("127.0.0.1", cls.port, made["alpha"])
        cls.b = TcpClient("127.0.0.1", cls.port, made["beta"])
        cls.sb = cls.a.create(image="minimal", metadata={"owner": "alpha"})["id"]
        cls.a.put_file(cls.sb, "/tmp/secret.txt", b"alpha data")

    def test_owner_works_and_is_recorded(self):
        out, _, exit_ev = self.a.exec(self.sb, argv=["echo", "mine"])
        self.assertEqual((out, exit_ev["exit_code"]), (b"mine\n", 0))
        self.assertEqual(self.a.get_file(self.sb, "/tmp/secret.txt"), b"alpha data")
        self.assertEqual(self.a.call("GET", f"/v1/sandboxes/{self.sb}")["tenant"], "alpha")
        # The body cannot choose the tenant: tenant is not a create field.
        with self.assertRaises(ApiError) as e:
            self.b.create(image="minimal", tenant="alpha")
        self.assertEqual(e.exception.status, 400)
        # The operator (unix socket) sees every tenant's sandboxes.
        self.assertIn(self.sb, [s["id"] for s in self.api.call("GET", "/v1/sandboxes")])
        tenants = {t["tenant"]: t for t in self.api.call("GET", "/v1/tenants")}
        self.assertEqual(tenants["alpha"]["usage"]["sandboxes"], 1)
        self.assertEqual(tenants["beta"]["usage"]["sandboxes"], 0)

    def test_other_tenant_lists_nothing(self):
        self.assertEqual(self.b.call("GET", "/v1/sandboxes"), [])
        self.assertEqual(self.b.call("GET", "/v1/sandboxes?all=true"), [])
        self.assertEqual(self.b.call("GET", "/v1/sandboxes?metadata.owner=alpha"), [])
        self.assertEqual([s["id"] for s in self.a.call("GET", "/v1/sandboxes?metadata.owner=alpha")],
                         [self.sb])

    def request(self, client, method, template, sid):
        path = template.replace("{id}", sid).replace("{exec_id}", "ex-1").replace("{host_port}", "40000")
        if "/files" in path:
            path += "?path=/tmp/secret.txt"
        body = {"argv": ["touch", "/tmp/pwned"]} if path.endswith("/exec") and method == "POST" else {}
        if method in ("GET", "DELETE"):
            body = None
        headers = {"Content-Type": "application/json"}
        if template.endswith("/pty"):
            headers.update({"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
                            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="})
        data = None if body is None else json.dumps(body)
        if method == "PUT":
            data, headers["Content-Type"] = b"overwritten", "application/octet-stream"
        status, _, raw = client.raw(method, path, data, headers)
        return status, json.loads(raw) if raw else None

    def test_other_tenant_gets_404_for_every_route(self):
        routes = sandbox_routes()
        self.assertGreater(len(routes), 20)
        for method, template, name in routes:
            got = self.request(self.b, method, template, self.sb)
            unknown = self.request(self.b, method, template, "sb-doesnotexist0")
            self.assertEqual(got[0], 404, (method, template, got))
            self.assertEqual(got[1]["error"]["code"], "not_found", name)
            # Indistinguishable from an id that does not exist.
            self.assertEqual(json.dumps(got[1]).replace(self.sb, "X"),
                             json.dumps(unknown[1]).replace("sb-doesnotexist0", "X"), name)
        # And nothing B sent happened: the sandbox runs, its file is intact.
        info = self.a.call("GET", f"/v1/sandboxes/{self.sb}")
        self.assertEqual(info["state"], "running")
        self.assertEqual(self.a.get_file(self.sb, "/tmp/secret.txt"), b"alpha data")
        _, _, ev = self.a.exec(self.sb, argv=["test", "-e", "/tmp/pwned"])
        self.assertEqual(ev["exit_code"], 1)

    def test_operator_only_routes_are_absent_for_tenants(self):
        # Every operation the spec (and so the route table) marks operator-only:
        # a tenant's call is the 404 of a path that does not exist.
        import openapi_check
        ops = [(m, t) for m, t, op in openapi_check.operations() if op.get("x-airlock-access") == "operator"]
        self.assertGreaterEqual(len(ops), 14)
        for method, template in ops:
            path = template.replace("{id}", "beta")
            body = None if method in ("GET", "DELETE") else {}
            with self.assertRaises(ApiError, msg=path) as e:
                self.b.call(method, path, body)
            self.assertEqual((e.exception.status, e.exception.code), (404, "not_found"), (method, path))
            self.assertEqual(e.exception.message, f"no route for {method} {path}")
        # Images have no owner yet: their management is the operator's. An
        # upload is read before the 404 (no broken pipe for the client).
        for method, path, body in [("GET", "/v1/images", None), ("GET", "/v1/images/minimal", None),
                                   ("DELETE", "/v1/images/minimal", None), ("GET", "/v1/df", None),
                                   ("POST", "/v1/prune", None),
                                   ("POST", "/v1/images/x/import", b"\0" * (4 << 20))]:
            with self.assertRaises(ApiError) as e:
                self.b.call(method, path, body)
            self.assertEqual(e.exception.status, 404, path)
        # Stats are tenant-scoped like every sandbox route: B cannot read A's.
        with self.assertRaises(ApiError) as e:
            self.b.call("GET", f"/v1/sandboxes/{self.sb}/stats")
        self.assertEqual(e.exception.status, 404)
        st = self.a.call("GET", f"/v1/sandboxes/{self.sb}/stats")
        self.assertEqual(st["id"], self.sb)
        self.assertNotIn(self.sb, [s["id"] for s in self.b.call("GET", "/v1/sandboxes?stats=true")])
        mine = self.a.call("GET", "/v1/sandboxes?stats=true")
        self.assertIn(self.sb, [s["id"] for s in mine])
        self.assertTrue(all("stats" in s for s in mine))


class QuotaTest(DaemonTestCase):
    """Quotas per tenant, checked at create with real VMs: 429 naming the
    limit and its value, nothing half-created."""

    @classmethod
    def setUpClass(cls):
        cls.port = free_port()
        cls.daemon_args = ["--listen", f"127.0.0.1:{cls.port}"]
        super().setUpClass()

    def tenant(self, name, **quota):
        self.assertEqual(self.api.call("PUT", f"/v1/tenants/{name}", quota)["quota"],
                         {"max_sandboxes": None, "max_memory_mb": None, "max_disk_mb": None,
                          "creates_per_minute": None, **quota})
        return TcpClient("127.0.0.1", self.port, self.api.call("POST", "/v1/tokens", {"tenant": name})["secret"])

    def sandbox_dirs(self):
        return sorted(os.listdir(os.path.join(self.data_dir, "sandboxes")))

    def refused(self, client, **spec):
        before = (self.sandbox_dirs(), len(self.api.call("GET", "/v1/sandboxes?all=true")))
        with self.assertRaises(ApiError) as e:
            client.create(image="minimal", **spec)
        self.assertEqual(e.exception.status, 429)
        # Nothing half-created: no record, no directory.
        self.assertEqual((self.sandbox_dirs(), len(self.api.call("GET", "/v1/sandboxes?all=true"))), before)
        return e.exception

    def test_max_sandboxes(self):
        c = self.tenant("one", max_sandboxes=1)
        sb = c.create(image="minimal")["id"]
        e = self.refused(c)
        self.assertEqual((e.code, e.field), ("quota_exceeded", "max_sandboxes"))
        self.assertIn("max_sandboxes 1", e.message)
        c.delete(sb)
        # A deleted sandbox holds its VM until the background teardown ends.
        deadline = time.time() + 60
        while c.call("GET", f"/v1/sandboxes/{sb}")["state"] != "deleted" and time.time() < deadline:
            time.sleep(0.05)
        c.delete(c.create(image="minimal")["id"])  # room again once it is gone

    def test_memory_and_disk(self):
        c = self.tenant("mem", max_memory_mb=300, max_disk_mb=2048)
        e = self.refused(c, memory_mb=512)
        self.assertEqual((e.code, e.field), ("quota_exceeded", "max_memory_mb"))
        self.assertIn("max_memory_mb 300", e.message)
        e = self.refused(c, memory_mb=256, disk_mb=4096)
        self.assertEqual((e.code, e.field), ("quota_exceeded", "max_disk_mb"))
        self.assertIn("max_disk_mb 2048", e.message)

    def test_creates_per_minute(self):
        c = self.tenant("rate", creates_per_minute=1)
        c.delete(c.create(image="minimal")["id"])
        e = self.refused(c)
        self.assertEqual((e.code, e.field), ("rate_limited", "creates_per_minute"))
        with open(os.path.join(self.data_dir, "audit.jsonl")) as f:
            records = [json.loads(line) for line in f]
        self.assertTrue(any(r.get("tenant") == "rate" and r["outcome"] == "rate_limited" and r["status"] == 429
                            for r in records))
        self.assertTrue(any(r.get("tenant") == "rate" and r["outcome"] == "sandbox_created" for r in records))

    def test_cli_sets_and_shows_quotas(self):
        r = cli(self, "tenant", "set", "viacli", "--max-sandboxes", "0", "--max-memory-mb", "512")
        self.assertIn("viacli", r.stdout)
        c = TcpClient("127.0.0.1", self.port, self.api.call("POST", "/v1/tokens", {"tenant": "viacli"})["secret"])
        e = self.refused(c)
        self.assertEqual((e.code, e.field), ("quota_exceeded", "max_sandboxes"))
        rows = [line.split() for line in cli(self, "tenant", "ls").stdout.splitlines()]
        self.assertIn(["viacli", "0/0", "0/512", "0/-", "-"], rows)
        got = json.loads(cli(self, "tenant", "ls", "--json").stdout)
        self.assertIn({"tenant": "viacli", "usage": {"sandboxes": 0, "memory_mb": 0, "disk_mb": 0},
                       "quota": {"max_sandboxes": 0, "max_memory_mb": 512, "max_disk_mb": None,
                                 "creates_per_minute": None}}, got)

    def test_bad_quota_is_400(self):
        for body, field in [({"max_sandboxes": -1}, "max_sandboxes"), ({"max_sandboxes": "2"}, "max_sandboxes"),
                            ({"bogus": 1}, "bogus")]:
            with self.assertRaises(ApiError) as e:
                self.api.call("PUT", "/v1/tenants/x", body)
            self.assertEqual((e.exception.status, e.exception.field), (400, field))
        with self.assertRaises(ApiError) as e:
            self.api.call("PUT", "/v1/tenants/Not_Valid", {})
        self.assertEqual((e.exception.status, e.exception.field), (400, "tenant"))


class AuthFailureTest(DaemonTestCase):
    """Failures are rate-limited per source address (127.0.0.2 and 127.0.0.1
    are two sources on loopback), audited, and expiry is immediate."""

    @classmethod
    def setUpClass(cls):
        cls.port = free_port()
        cls.daemon_args = ["--listen", f"127.0.0.1:{cls.port}"]
        super().setUpClass()

    def test_failures_are_limited_per_source(self):
        good = self.api.call("POST", "/v1/tokens", {"tenant": "acme"})["secret"]
        statuses = []
        for i in range(12):
            bad = TcpClient("127.0.0.1", self.port, f"airlock_{i:040x}", source="127.0.0.2")
            try:
                bad.call("GET", "/v1/sandboxes")
                statuses.append(200)
            except ApiError as e:
                statuses.append((e.status, e.code))
        # The default budget: 10 failures back to back, then 429.
        self.assertEqual(statuses[:10], [(401, "unauthenticated")] * 10)
        self.assertEqual(statuses[10:], [(429, "rate_limited")] * 2)
        # While limited, the right token from that source is still served
        # (another client behind the same address, test_tenant_door.py)...
        self.assertEqual(
            TcpClient("127.0.0.1", self.port, good, source="127.0.0.2").call("GET", "/v1/sandboxes"), [])
        # ... but no credential at all is refused.
        with self.assertRaises(ApiError) as e:
            TcpClient("127.0.0.1", self.port, source="127.0.0.2").call("GET", "/v1/info")
        self.assertEqual(e.exception.status, 429)
        # Another source is not affected.
        self.assertEqual(TcpClient("127.0.0.1", self.port, good).call("GET", "/v1/sandboxes"), [])
        with open(os.path.join(self.data_dir, "audit.jsonl")) as f:
            records = [json.loads(line) for line in f]
        mine = [r for r in records if r["source"] == "127.0.0.2"]
        self.assertEqual([r["outcome"] for r in mine].count("unauthenticated"), 10)
        self.assertGreaterEqual([r["outcome"] for r in mine].count("rate_limited"), 3)
        for r in mine:
            self.assertRegex(r["time"], r"^\d{4}-\d\d-\d\dT")
            self.assertEqual((r["method"], r["route"]) in {("GET", "/v1/sandboxes"), ("GET", "/v1/info")}, True)
        # The budget refills (one failure per 5 s).
        time.sleep(5.5)
        self.assertEqual(TcpClient("127.0.0.1", self.port, good, source="127.0.0.2").call("GET", "/v1/sandboxes"), [])

    def test_expired_token_stops_at_once(self):
        r = cli(self, "token", "create", "--tenant", "brief", "--expires", "2s", "--json")
        tok = json.loads(r.stdout)
        self.assertEqual(tok["expires"] - tok["created"], 2)
        c = TcpClient("127.0.0.1", self.port, tok["secret"])
        self.assertEqual(c.call("GET", "/v1/sandboxes"), [])
        time.sleep(3.1)
        with self.assertRaises(ApiError) as e:
            c.call("GET", "/v1/sandboxes")
        self.assertEqual((e.exception.status, e.exception.code), (401, "unauthenticated"))


def make_cert(directory, name="localhost"):
    """A self-signed certificate for 127.0.0.1 made with the openssl CLI: (cert, key)."""
    cert, key = os.path.join(directory, f"{name}.pem"), os.path.join(directory, f"{name}.key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "1", "-subj", f"/CN={name}", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True, timeout=60)
    return cert, key


class TlsTest(DaemonTestCase):
    """--listen with --tls-cert/--tls-key: the API over TLS with a certificate
    the test makes, verified by the client against it."""

    @classmethod
    def setUpClass(cls):
        cls.certdir = tempfile.mkdtemp(prefix="airlock-tls-")
        cls.cert, cls.key = make_cert(cls.certdir)
        cls.port = free_port()
        cls.daemon_args = ["--listen", f"127.0.0.1:{cls.port}", "--tls-cert", cls.cert, "--tls-key", cls.key]
        super().setUpClass()
        cls.token = cls.api.call("POST", "/v1/tokens", {"tenant": "secure"})["secret"]

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        shutil.rmtree(cls.certdir, ignore_errors=True)

    def tls(self, token=None):
        return TcpClient("127.0.0.1", self.port, token or self.token,
                         ssl_context=ssl.create_default_context(cafile=self.cert))

    def test_api_over_tls_with_a_real_vm(self):
        c = self.tls()
        sb = c.create(image="minimal")["id"]
        try:
            out, _, ev = c.exec(sb, argv=["sh", "-c", "echo over tls; head -c 300000 /dev/zero | tr '\\0' x"])
            self.assertEqual(ev["exit_code"], 0)
            self.assertTrue(out.startswith(b"over tls\n"))
            self.assertEqual(len(out), len(b"over tls\n") + 300000)
            data = os.urandom(1 << 20)
            c.put_file(sb, "/tmp/blob", data)
            self.assertEqual(c.get_file(sb, "/tmp/blob"), data)  # chunked download over TLS
            self.assertEqual(c.call("GET", f"/v1/sandboxes/{sb}")["tenant"], "secure")
        finally:
            c.delete(sb)
        with self.assertRaises(ApiError) as e:
            self.tls("airlock_" + "1" * 40).call("GET", "/v1/sandboxes")
        self.assertEqual(e.exception.status, 401)

    def test_cli_over_tls(self):
        env = {**os.environ, "AIRLOCK_URL": f"https://127.0.0.1:{self.port}", "AIRLOCK_TOKEN": self.token,
               "AIRLOCK_CA": self.cert, "AIRLOCK_SOCKET": "/nonexistent/airlockd.sock"}
        run = lambda *a, **kw: subprocess.run([os.path.join(BIN, "airlock"), *a], env={**env, **kw},
                                              capture_output=True, text=True, timeout=120)
        r = run("create", "--image", "minimal")
        self.assertEqual(r.returncode, 0, r.stderr)
        sid = r.stdout.strip()
        try:
            r = run("exec", sid, "--", "sh", "-c", "echo via cli; exit 3")
            self.assertEqual((r.returncode, r.stdout), (3, "via cli\n"), r.stderr)
            self.assertIn(sid, run("ls").stdout)
            # The operator's own view agrees: the sandbox is this tenant's.
            self.assertEqual(self.api.call("GET", f"/v1/sandboxes/{sid}")["tenant"], "secure")
            r = run("ls", AIRLOCK_TOKEN="airlock_" + "2" * 40)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("authentication required", r.stderr)
            other_cert, _ = make_cert(self.certdir, "cli-other")
            r = run("ls", AIRLOCK_CA=other_cert)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("TLS", r.stderr)
        finally:
            self.assertEqual(run("rm", sid).returncode, 0)

    def test_python_sdk_over_tls(self):
        import sys
        sys.path.insert(0, os.path.join(harness.ROOT, "sdk", "python"))
        import airlock
        client = airlock.Client(url=f"https://127.0.0.1:{self.port}", token=self.token, ca=self.cert)
        with airlock.Sandbox.create("minimal", client=client) as sb:
            self.assertEqual(sb.exec("echo", "sdk").stdout, b"sdk\n")
            sb.files.write("/tmp/f", b"over tls")
            self.assertEqual(sb.files.read("/tmp/f"), b"over tls")
        with self.assertRaises(airlock.Unauthenticated):
            airlock.Client(url=f"https://127.0.0.1:{self.port}", token="nope", ca=self.cert).info()
        client.close()

    def test_certificate_is_verified_and_plain_http_gets_nothing(self):
        other_cert, _ = make_cert(self.certdir, "other")
        bad = TcpClient("127.0.0.1", self.port, self.token,
                        ssl_context=ssl.create_default_context(cafile=other_cert))
        with self.assertRaises(ssl.SSLCertVerificationError):
            bad.call("GET", "/v1/sandboxes")
        # Plain HTTP on the TLS port: no answer in clear, ever.
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
            s.sendall(b"GET /v1/info HTTP/1.1\r\nHost: x\r\n\r\n")
            try:
                got = s.recv(4096)
            except ConnectionResetError:
                got = b""
            self.assertNotIn(b"HTTP/1.1", got)
        # The daemon still serves TLS clients after that.
        self.assertEqual(self.tls().call("GET", "/v1/sandboxes"), [])


class SocketDirTest(unittest.TestCase):
    def test_socket_directory_is_made_private(self):
        import grp
        try:
            group = grp.getgrnam("airlock").gr_gid
        except KeyError:
            group = None
        with tempfile.TemporaryDirectory() as tmp:
            sockdir = os.path.join(tmp, "run")
            os.mkdir(sockdir, 0o755)
            os.chmod(sockdir, 0o755)
            sock = os.path.join(sockdir, "airlockd.sock")
            d = subprocess.Popen([os.path.join(BIN, "airlockd"), "--data-dir", os.path.join(tmp, "d"),
                                  "--socket", sock], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                deadline = time.time() + 20
                while not os.path.exists(sock) and time.time() < deadline:
                    time.sleep(0.05)
                st_dir, st_sock = os.stat(sockdir), os.stat(sock)
                if group is None:
                    self.assertEqual(st_dir.st_mode & 0o777, 0o700)
                    self.assertEqual(st_sock.st_mode & 0o777, 0o600)
                else:
                    self.assertEqual((st_dir.st_mode & 0o777, st_dir.st_gid), (0o750, group))
                    self.assertEqual((st_sock.st_mode & 0o777, st_sock.st_gid), (0o660, group))
            finally:
                d.terminate()
                d.wait(timeout=20)


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

    def test_bad_tls_files_are_named(self):
        with tempfile.TemporaryDirectory() as tmp:
            cert, key = make_cert(tmp)
            other_cert, other_key = make_cert(tmp, "other")
            base = [os.path.join(BIN, "airlockd"), "--data-dir", os.path.join(tmp, "d"),
                    "--listen", f"127.0.0.1:{free_port()}"]
            for extra, words in [(["--tls-cert", os.path.join(tmp, "missing.pem"), "--tls-key", key],
                                  "missing.pem"),
                                 (["--tls-cert", cert, "--tls-key", other_key], "other.key"),
                                 (["--tls-cert", cert], "go together")]:
                r = subprocess.run(base + extra, capture_output=True, text=True, timeout=30)
                self.assertEqual(r.returncode, 1, extra)
                self.assertIn(words, r.stdout + r.stderr)


if __name__ == "__main__":
    unittest.main()

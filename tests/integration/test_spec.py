"""api/openapi.yaml against the real daemon (see api/README.md).

- the routes airlockd serves (its route table in src/daemon/routes.cc, and
  what the running daemon answers: 405 with an Allow header on a served path,
  404 elsewhere) are exactly the spec's operations;
- every request example in the spec is accepted by a real daemon and a real
  VM (minimal image), and every example validates against its own schema;
- the statuses and error codes the spec documents are produced here where no
  other suite produces them (the `spec.coverage` test, test_spec_coverage.py,
  then checks that every one was seen somewhere).
Responses are checked against the spec live by the harness (openapi_check).
"""

import base64
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
import unittest
import urllib.parse

import harness
import openapi_check
from harness import ROOT, ApiError, DaemonTestCase, NetnsDaemonTestCase, UnixHTTPConnection, netns_available

# Routes (and request examples) the spec may document ahead of the daemon:
# none now. A route listed here that the daemon serves fails the test, so
# the list cannot go stale; src/daemon/openapi_test.cc has the same list.
PENDING = set()
PENDING_EXAMPLES = set()

# A row of the route table: {"METHOD", "/template", Access::who, serve::handler}.
ROUTE_LINE = re.compile(r'\{"(GET|PUT|POST|DELETE|PATCH)",\s*"(/[^"]*)",\s*Access::(\w+),\s*serve::\w+\}')


def router_access():
    """{(METHOD, template): access} of src/daemon/routes.cc's route table, named as
    the spec's x-airlock-access names them."""
    with open(os.path.join(ROOT, "src", "daemon", "routes.cc")) as f:
        return {(m, t): {"operator_only": "operator"}.get(a, a) for m, t, a in ROUTE_LINE.findall(f.read())}


def router_routes():
    """(METHOD, template) of every entry in src/daemon/routes.cc's route table."""
    return set(router_access())


def spec_routes():
    return {(m, t) for m, t, _ in openapi_check.operations()}


def concrete(template, **values):
    """A path for `template` with its {params} filled (probe values by default)."""
    values = {"id": "sb-probe", "exec_id": "ex-probe", "host_port": "40000", **values}
    return re.sub(r"\{(\w+)\}", lambda m: str(values[m.group(1)]), template)


def takes_path(template):
    """Whether the operations on `template` take the required `path` query."""
    item = openapi_check.spec()["paths"][template]
    return any(openapi_check.resolve(p).get("name") == "path" for p in item.get("parameters", []))


def probe_path(template, **values):
    """concrete(), plus ?path=/tmp where the route requires a path."""
    return concrete(template, **values) + ("?path=/tmp" if takes_path(template) else "")



class SpecStaticTest(unittest.TestCase):
    """The spec on its own: parseable, every example valid against its schema."""

    def test_examples_validate_against_their_schemas(self):
        checked = 0
        for method, template, op in openapi_check.operations():
            body = op.get("requestBody", {}).get("content", {})
            for media, mt in body.items():
                for name, ex in mt.get("examples", {}).items():
                    if media == "application/json":
                        self.assertEqual(openapi_check.schema_errors(mt["schema"], ex["value"]), [],
                                         f"{method} {template} example {name}")
                    checked += 1
            for status, resp in op["responses"].items():
                for media, mt in openapi_check.resolve(resp).get("content", {}).items():
                    if "example" in mt:
                        self.assertEqual(openapi_check.schema_errors(mt["schema"], mt["example"]), [],
                                         f"{method} {template} {status} example")
                        checked += 1
        for name, schema in openapi_check.spec()["components"]["schemas"].items():
            if "example" in schema:
                self.assertEqual(openapi_check.schema_errors(schema, schema["example"]), [], name)
                checked += 1
        self.assertGreater(checked, 20)

    def test_every_operation_documents_errors_with_the_error_schema(self):
        error_ref = "#/components/schemas/Error"
        for method, template, op in openapi_check.operations():
            responses = op["responses"]
            self.assertIn("default", responses, f"{method} {template}")
            self.assertTrue(any(s.startswith("2") or s == "101" for s in responses), f"{method} {template}")
            for status, resp in responses.items():
                if status.startswith(("4", "5")) or status == "default":
                    schema = openapi_check.resolve(resp)["content"]["application/json"]["schema"]
                    self.assertEqual(schema, {"$ref": error_ref}, f"{method} {template} {status}")

    def test_error_codes_are_the_ones_the_daemon_has(self):
        # Every code string the daemon sends (Errc names plus the router's
        # method_not_allowed) is in the enum and nothing else is.
        with open(os.path.join(ROOT, "src", "common", "error.cc")) as f:
            errc = set(re.findall(r'return "([a-z_]+)";', f.read()))
        codes = set(openapi_check.component("Error")["properties"]["error"]["properties"]["code"]["enum"])
        self.assertEqual(codes, errc | {"method_not_allowed"})


class SpecRoutesTest(DaemonTestCase):
    """Every route the daemon serves is in the spec and vice versa."""

    def test_route_table_is_the_spec(self):
        served, documented = router_routes(), spec_routes()
        self.assertGreater(len(served), 20)
        self.assertEqual(sorted(served - documented), [], "served but not in api/openapi.yaml")
        for route in sorted(PENDING & served):
            self.fail(f"{route} is served now: delete it from PENDING in test_spec.py and openapi_test.cc")
        self.assertEqual(sorted(documented - served - PENDING), [], "documented but not served")

    def test_who_may_call_is_the_spec(self):
        table = router_access()
        for method, template, op in openapi_check.operations():
            self.assertEqual(op.get("x-airlock-access"), table.get((method, template)),
                             f"{method} {template}: x-airlock-access vs the route table")

    def allowed(self, template):
        """The methods the running daemon serves on `template`: OPTIONS is
        served nowhere, so it answers 405 naming them, or 404 if none."""
        status, headers, body = self.api.raw("OPTIONS", concrete(template))
        if status == 404:
            self.assertEqual(json.loads(body)["error"]["code"], "not_found")
            return set()
        self.assertEqual(status, 405, body)
        self.assertEqual(json.loads(body)["error"]["code"], "method_not_allowed")
        return {m.strip() for m in dict(headers)["Allow"].split(",")}

    def test_running_daemon_serves_exactly_the_spec(self):
        templates = {t for _, t in spec_routes() | router_routes()}
        for template in sorted(templates):
            documented = {m for m, t in spec_routes() if t == template}
            pending = {m for m, t in PENDING if t == template}
            served = self.allowed(template)
            self.assertEqual(served & pending, set(), f"{template}: served now, delete from PENDING")
            self.assertEqual(served, documented - pending, template)
        # And the negative: a path no template matches is a 404, not a 405.
        self.assertEqual(self.allowed("/v1/sandboxes/{id}/nope"), set())
        self.assertEqual(self.allowed("/v2/info"), set())


@unittest.skipUnless(netns_available(), "needs root and ip netns (a network namespace of its own)")
class SpecExamplesTest(NetnsDaemonTestCase):
    """Every request example in the spec is accepted by a real daemon with a
    real VM. The daemon runs in an empty network namespace of the test's own
    (loopback only) so the examples' network policies reach nothing."""

    NS_PREFIX = "alspec"

    def examples(self):
        for method, template, op in openapi_check.operations():
            for media, mt in op.get("requestBody", {}).get("content", {}).items():
                for name, ex in mt.get("examples", {}).items():
                    yield method, template, op, media, name, ex["value"]

    def send(self, method, path, media, value):
        if media == "application/json":
            data, headers = json.dumps(value).encode(), {"Content-Type": "application/json"}
        else:
            data, headers = value.encode(), {"Content-Type": media}
        status, hdrs, body = self.api.raw(method, path, data, headers)
        return status, dict(hdrs).get("Content-Type", ""), body

    def test_every_request_example_is_accepted(self):
        sb = None
        tried = set()
        try:
            for method, template, op, media, name, value in self.examples():
                key = (op["operationId"], name)
                if (method, template) in PENDING or key in PENDING_EXAMPLES:
                    continue
                values = {}
                if "{id}" in template:
                    if sb is None:
                        sb = self.api.create(image="minimal", network={"mode": "allowlist"})
                    values["id"] = sb["id"]
                if "{exec_id}" in template:  # a process whose stdin is streamed
                    ex = self.api.call("POST", f"/v1/sandboxes/{sb['id']}/exec",
                                       {"argv": ["cat"], "background": True, "stdin_stream": True})
                    values["exec_id"] = ex["exec_id"]
                if op["operationId"] == "moveFile":  # the example moves a file that must exist
                    self.api.put_file(sb["id"], value["from"], b"abc")
                path = concrete(template, **values)
                query = {p["name"]: p["schema"]["example"] for p in self.parameters(template, op)
                         if p["in"] == "query" and p.get("required")}
                if query:
                    path += "?" + urllib.parse.urlencode(query)
                status, ctype, body = self.send(method, path, media, value)
                self.assertLess(status, 300, f"{key}: {status} {body[:500]!r}")
                if template == "/v1/sandboxes" and method == "POST":
                    self.api.delete(json.loads(body)["id"])
                if op["operationId"] == "addPort":  # and the forward it made goes again
                    forward = json.loads(body)
                    ports = f"/v1/sandboxes/{sb['id']}/ports"
                    self.assertIn(forward, self.api.call("GET", ports))
                    self.api.call("DELETE", f"{ports}/{forward['host_port']}")
                    self.assertNotIn(forward, self.api.call("GET", ports))
                tried.add(key)
            # The pending features' examples: once served, they must leave the list.
            for op_id, name in PENDING_EXAMPLES:
                self.assertNotIn((op_id, name), tried)
                method, template, media, value = next((m, t, md, v) for m, t, o, md, n, v in self.examples()
                                                      if o["operationId"] == op_id and n == name)
                if sb is None:
                    sb = self.api.create(image="minimal")
                status, _, body = self.send(method, concrete(template, id=sb["id"]), media, value)
                self.assertGreaterEqual(status, 400, f"{op_id}/{name} is accepted now: "
                                        "delete it from PENDING_EXAMPLES")
        finally:
            if sb is not None:
                self.api.delete(sb["id"])
        self.assertGreaterEqual(len(tried), 10, tried)

    @staticmethod
    def parameters(template, op):
        item = openapi_check.spec()["paths"][template]
        return [openapi_check.resolve(p) for p in item.get("parameters", []) + op.get("parameters", [])]


class SpecStatusesTest(DaemonTestCase):
    """Produces the statuses and error codes the spec documents that the
    other suites do not: each operation's 400 (bad id, unknown query key),
    404 (unknown sandbox), 409 (a deleted sandbox), 413, and the daemon-wide
    405, 503 and guest_error."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.gone = cls.api.create(image="minimal")["id"]
        cls.api.delete(cls.gone)

    def send_raw(self, method, path, data, ctype):
        """(status, error code or None) of a request sent with head and body
        in one write: the daemon may answer an error from the head and close
        without reading the body, so a second write could fail with EPIPE."""
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(60)
        try:
            s.connect(self.sock)
            s.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {ctype}\r\n"
                      f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
            resp = http.client.HTTPResponse(s)
            resp.begin()
            raw = resp.read()
        finally:
            s.close()
        harness.observe(method, path, resp.status, resp.getheader("Content-Type"), raw)
        body = json.loads(raw) if raw else {}
        return resp.status, body["error"]["code"] if "error" in body else None

    def put(self, path, data=b"x"):
        return self.send_raw("PUT", path, data, "application/octet-stream")

    def code_of(self, method, path, body=None):
        data = b"" if body is None else json.dumps(body).encode()
        return self.send_raw(method, path, data, "application/json")

    def minimal_body(self, op):
        """A body the operation accepts in shape (so its other checks run)."""
        return {"createSandbox": {}, "setPool": {"image": "minimal", "size": 0},
                "exec": {"argv": ["true"]}, "makeDir": {"path": "/tmp/x"},
                "setNetwork": {"mode": "allowlist"}, "addPort": {"guest_port": 8080},
                "setTimeout": {"timeout": 5},
                "moveFile": {"from": "/tmp/a", "to": "/tmp/b"},
                "createSnapshot": {"name": "probe"},
                "saveSnapshotImage": {"name": "probe-img"}}.get(op["operationId"])

    def test_bad_query_key_and_bad_id_are_400(self):
        for method, template, op in openapi_check.operations():
            if (method, template) in PENDING or op["operationId"] == "writeFile":
                continue
            body = self.minimal_body(op)
            path = concrete(template, id="sb-probe") + "?path=/tmp&bogus=1"  # path may be unknown too
            self.assertEqual(self.code_of(method, path, body), (400, "invalid_argument"), (method, template))
            if "{id}" in template:
                path = probe_path(template, id="bad.id")
                self.assertEqual(self.code_of(method, path, body), (400, "invalid_argument"), (method, template))
        # PUT files reads no JSON: its 400 is a relative path.
        self.assertEqual(self.put(f"/v1/sandboxes/{self.gone}/files?path=rel"), (400, "invalid_argument"))

    def test_unknown_sandbox_is_404(self):
        for method, template, op in openapi_check.operations():
            if "{id}" not in template or (method, template) in PENDING:
                continue
            # A tenant's {id} is a name PUT creates (its 404 is test_auth's: over TCP).
            if template.startswith("/v1/tenants/"):
                continue
            if "404" not in op["responses"]:
                continue
            # An import's {id} is the new image's name (its 404 is a tenant's: test_auth).
            if op["operationId"] == "importImage":
                continue
            path = probe_path(template, id="sb-nosuchsandbox")
            if op["operationId"] == "writeFile":
                self.assertEqual(self.put(path), (404, "not_found"))
                continue
            self.assertEqual(self.code_of(method, path, self.minimal_body(op)), (404, "not_found"),
                             (method, template))

    def test_deleted_sandbox_is_409_where_documented(self):
        for method, template, op in openapi_check.operations():
            if "409" not in op["responses"] or (method, template) in PENDING:
                continue
            if template.startswith("/v1/snapshots/"):
                continue  # {id} is a snapshot's name there (its 409: test_snapshots)
            # An image's 409 is "in use" or "exists" (test_images), not a deleted sandbox.
            if template.startswith("/v1/images/"):
                continue
            # No sandbox in the path: a create's 409 is a fork's snapshot in
            # `from` (test_snapshots), not a deleted sandbox.
            if "{id}" not in template:
                continue
            path = probe_path(template, id=self.gone)
            if op["operationId"] == "writeFile":
                self.assertEqual(self.put(path), (409, "conflict"))
                continue
            self.assertEqual(self.code_of(method, path, self.minimal_body(op)), (409, "conflict"),
                             (method, template))

    def declared_length_answer(self, method, path, length):
        """The answer to a request head declaring a `length`-byte body, none of
        which is sent (the daemon must refuse it from the head alone)."""
        conn = UnixHTTPConnection(self.sock)
        try:
            conn.putrequest(method, path)
            conn.putheader("Content-Type", "application/octet-stream" if method == "PUT" else "application/json")
            conn.putheader("Content-Length", str(length))
            conn.endheaders()
            resp = conn.getresponse()
            body = json.loads(resp.read())
        finally:
            conn.close()
        openapi_check.observe(method, path, resp.status, resp.getheader("Content-Type"), body)
        return resp.status, body["error"]["code"]

    def test_oversized_bodies_are_413(self):
        for method, template, op in openapi_check.operations():
            if "413" not in op["responses"] or (method, template) in PENDING:
                continue
            length = (4 << 30) + 1 if op["operationId"] == "writeFile" else (16 << 20) + 1
            path = concrete(template, id=self.gone) + ("?path=/tmp/big" if "files" in template else "")
            self.assertEqual(self.declared_length_answer(method, path, length), (413, "payload_too_large"),
                             (method, template))

    def test_unknown_image_is_400_naming_it(self):
        with self.assertRaises(ApiError) as cm:
            self.api.create(image="no-such-image")
        self.assertEqual((cm.exception.status, cm.exception.code, cm.exception.field),
                         (400, "invalid_argument", "image"))

    def test_one_image_name_rule_at_every_door(self):
        # "Foo.x" used to pass the spec's check and then never be found; now the
        # spec, the pool, the builder, an import and the store refuse it alike.
        def refused(method, path, body, field):
            with self.assertRaises(ApiError) as cm:
                self.api.call(method, path, body)
            e = cm.exception
            self.assertEqual((e.status, e.code, e.field), (400, "invalid_argument", field), path)
            self.assertIn("a-z 0-9 _ -", e.body["error"]["message"])
        refused("POST", "/v1/sandboxes", {"image": "Foo.x"}, "image")
        refused("PUT", "/v1/pool", {"image": "Foo.x", "size": 1}, "image")
        refused("POST", "/v1/images/build", {"name": "Foo.x", "recipe": 'from = "minimal"\n'}, "name")
        # (A '.' in a path is refused by the router as a bad {id}; an upper-case
        # name reaches the image rule, before the upload is stored.)
        refused("POST", "/v1/images/Foo_x/import", b"not a tar", "name")

    def test_every_door_states_the_limits_table(self):
        # One table (src/engine/api/limits.h), shown by GET /v1/info; the
        # spec and the MCP tools' schemas must state exactly its bounds.
        limits = self.api.call("GET", "/v1/info")["limits"]

        def bounds(schema):
            schema = openapi_check.resolve(schema)
            return {"min": schema.get("minimum"), "max": schema.get("maximum")}

        def body_props(operation_id):
            op = next(o for _, _, o in openapi_check.operations() if o["operationId"] == operation_id)
            schema = openapi_check.resolve(op["requestBody"]["content"]["application/json"]["schema"])
            return schema["properties"]

        spec_props = openapi_check.component("SandboxSpec")["properties"]
        pool_props = body_props("setPool")
        exec_props = openapi_check.component("ExecRequest")["properties"]
        stated = {
            "SandboxSpec.cpus": (spec_props["cpus"], "cpus"),
            "SandboxSpec.memory_mb": (spec_props["memory_mb"], "memory_mb"),
            "SandboxSpec.disk_mb": (spec_props["disk_mb"], "disk_mb"),
            "SandboxSpec.timeout": (spec_props["timeout"], "timeout"),
            "SandboxSpec.idle_timeout": (spec_props["idle_timeout"], "idle_timeout"),
            "setPool.size": (pool_props["size"], "pool_size"),
            "setPool.cpus": (pool_props["cpus"], "cpus"),
            "setPool.memory_mb": (pool_props["memory_mb"], "memory_mb"),
            "setPool.disk_mb": (pool_props["disk_mb"], "disk_mb"),
            "setTimeout.timeout": (body_props("setTimeout")["timeout"], "timeout"),
            "ExecRequest.timeout": (exec_props["timeout"], "exec_timeout"),
            "ExecRequest.limits.pids": (exec_props["limits"]["properties"]["pids"], "exec_pids"),
            "ExecRequest.limits.memory_mb": (exec_props["limits"]["properties"]["memory_mb"],
                                             "exec_memory_mb"),
        }
        for where, (schema, name) in stated.items():
            self.assertEqual(bounds(schema), limits[name], f"api/openapi.yaml {where}")
        # A terminal's size, wherever the spec states one.
        def sizes(node, path):
            if isinstance(node, dict):
                for k, v in node.items():
                    if k in ("cols", "rows") and isinstance(v, dict) and "maximum" in v:
                        yield f"{path}.{k}", v
                    else:
                        yield from sizes(v, f"{path}.{k}")
            elif isinstance(node, list):
                for i, v in enumerate(node):
                    yield from sizes(v, f"{path}[{i}]")
        found = list(sizes(openapi_check.spec(), ""))
        self.assertGreaterEqual(len(found), 3)
        for where, schema in found:
            self.assertEqual(bounds(schema), limits["pty_cells"], f"api/openapi.yaml {where}")

        # The MCP server's tools, as `airlock mcp` lists them.
        env = dict(os.environ, AIRLOCK_SOCKET=self.sock)
        msgs = [{"jsonrpc": "2.0", "id": 1, "method": "initialize",
                 "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                            "clientInfo": {"name": "limits-check", "version": "1"}}},
                {"jsonrpc": "2.0", "method": "notifications/initialized"},
                {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}]
        r = subprocess.run([os.path.join(harness.BIN, "airlock"), "--socket", self.sock, "mcp"],
                           input="".join(json.dumps(m) + "\n" for m in msgs), env=env,
                           capture_output=True, text=True, timeout=60)
        replies = [json.loads(l) for l in r.stdout.splitlines() if l.strip()]
        tools = {t["name"]: t for t in next(m for m in replies if m.get("id") == 2)["result"]["tools"]}
        create = tools["sandbox_create"]["inputSchema"]["properties"]
        for name in ("cpus", "memory_mb", "disk_mb", "timeout", "idle_timeout"):
            self.assertEqual(bounds(create[name]), limits[name], f"MCP sandbox_create.{name}")
        self.assertEqual(bounds(tools["sandbox_exec"]["inputSchema"]["properties"]["timeout"]),
                         limits["exec_timeout"], "MCP sandbox_exec.timeout")

        # And validation refuses just past each bound, naming the table's numbers.
        for field, value in (("cpus", limits["cpus"]["max"] + 1),
                             ("memory_mb", limits["memory_mb"]["min"] - 1),
                             ("timeout", limits["timeout"]["max"] + 1)):
            with self.assertRaises(ApiError) as cm:
                self.api.create(**{field: value})
            self.assertEqual((cm.exception.status, cm.exception.field), (400, field))
            self.assertIn(f"between {limits[field]['min']} and {limits[field]['max']}",
                          cm.exception.message)

    def test_pool_reads_back_what_was_set(self):
        def shapes(slots):
            return [(s["image"], s["shape"]["network"], s["target"], s["learned"]) for s in slots]
        slots = self.api.call("PUT", "/v1/pool", {"image": "minimal", "size": 1, "disk_mb": 1024})
        self.assertEqual(shapes(self.api.call("GET", "/v1/pool")), shapes(slots))
        self.assertEqual(shapes(slots), [("minimal", False, 1, False)])
        # Size 0 removes that shape's slot.
        slots = self.api.call("PUT", "/v1/pool", {"image": "minimal", "size": 0})
        self.assertEqual((slots, self.api.call("GET", "/v1/pool")), ([], []))

    def test_watch_streams_the_documented_events(self):
        if ("GET", "/v1/sandboxes/{id}/files/watch") in PENDING:
            self.skipTest("files/watch is PENDING")
        sb = self.api.create(image="minimal")["id"]
        path = f"/v1/sandboxes/{sb}/files/watch?path=/tmp&recursive=true"
        conn = UnixHTTPConnection(self.sock, timeout=60)
        lines = []
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            self.assertEqual(resp.status, 200)
            lines.append(json.loads(resp.readline()))
            self.assertEqual(lines[0]["type"], "watching")
            self.api.put_file(sb, "/tmp/spec-watch.txt", b"x")
            while not any(e.get("path") == "/tmp/spec-watch.txt" for e in lines[1:]):
                lines.append(json.loads(resp.readline()))
        finally:
            conn.close()
        openapi_check.observe("GET", path, 200, resp.getheader("Content-Type"), lines)
        self.assertIn("created", [e["type"] for e in lines[1:]])
        self.api.delete(sb)

    def test_pty_upgrades_to_a_websocket(self):
        if ("GET", "/v1/sandboxes/{id}/pty") in PENDING:
            self.skipTest("pty is PENDING")
        sb = self.api.create(image="minimal")["id"]
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(60)
        try:
            s.connect(self.sock)
            key = base64.b64encode(os.urandom(16)).decode()
            s.sendall(f"GET /v1/sandboxes/{sb}/pty HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
                      f"Upgrade: websocket\r\nSec-WebSocket-Key: {key}\r\n"
                      "Sec-WebSocket-Version: 13\r\n\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = s.recv(4096)
                if not chunk:
                    break
                head += chunk
        finally:
            s.close()
        self.assertTrue(head.startswith(b"HTTP/1.1 101"), head)
        openapi_check.observe("GET", f"/v1/sandboxes/{sb}/pty", 101, None, None)
        self.api.delete(sb)

    def test_method_not_allowed_names_the_allowed_ones(self):
        status, headers, body = self.api.raw("POST", "/v1/info")
        self.assertEqual((status, dict(headers)["Allow"]), (405, "GET"))
        self.assertEqual(json.loads(body)["error"]["code"], "method_not_allowed")

    def test_disk_over_free_space_is_503(self):
        st = os.statvfs(self.data_dir)
        if st.f_bavail * st.f_frsize >= (1 << 40):
            self.skipTest("the data dir has 1 TiB free: disk_mb=1048576 fits")
        with self.assertRaises(ApiError) as cm:
            self.api.create(image="minimal", disk_mb=1048576)
        self.assertEqual((cm.exception.status, cm.exception.code), (503, "unavailable"))
        self.assertIn("not enough disk", cm.exception.message)

    def test_sandbox_failing_during_a_call_is_guest_error(self):
        sb = self.api.create(image="minimal")
        killer = threading.Timer(2.0, os.kill, (sb["pid"], signal.SIGKILL))
        killer.start()
        try:
            events = self.api.exec_events(sb["id"], cmd="sleep 60")
        finally:
            killer.cancel()
        last = events[-1]
        self.assertEqual((last["type"], last["error"]["code"]), ("error", "guest_error"), events)
        self.assertIn("vmm_died", last["error"]["message"])
        self.assertEqual(self.api.call("GET", f"/v1/sandboxes/{sb['id']}")["failure"], "vmm_died")
        with self.assertRaises(ApiError) as cm:  # nothing left to delete
            self.api.delete(sb["id"])
        self.assertEqual((cm.exception.status, cm.exception.code), (409, "conflict"))


class SpecStalledRequestTest(DaemonTestCase):
    """408 timeout: a request head that stalls past --idle-timeout."""

    daemon_args = ["--idle-timeout", "1"]

    def test_stalled_request_is_408_timeout(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(30)
        try:
            s.connect(self.sock)
            s.sendall(b"GET /v1/info HTTP/1.1\r\nHost: x\r\n")  # never finished
            answer = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                answer += chunk
        finally:
            s.close()
        head, _, body = answer.partition(b"\r\n\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.1 408"), answer)
        parsed = json.loads(body)
        openapi_check.observe("GET", "/v1/info", 408, "application/json", parsed)
        self.assertEqual(parsed["error"]["code"], "timeout")


if __name__ == "__main__":
    unittest.main()

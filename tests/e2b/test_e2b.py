"""E2B's own published JavaScript SDK, unmodified, against a real airlockd's
E2B-compatible API (docs/e2b.md) over its TCP listener, with real VMs:

* sdk_test.mjs drives both pinned releases (e2b 2.51.0 and e2b 2.10.1, from
  package-lock.json; `npm ci` runs once when node_modules is missing) through
  E2B_API_URL / E2B_SANDBOX_URL / E2B_API_KEY, one section per area;
* the envd side's Connect protocol is also spoken by hand here, for what a
  well-behaved SDK never sends (malformed envelopes, oversized messages,
  wrong access tokens).

Needs the `debian` image (template `base`); it is built first if missing."""

import base64
import http.client
import json
import os
import shutil
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "integration"))

from harness import BIN, IMAGE_DIR, DaemonTestCase, free_port  # noqa: E402


def ensure_node_modules():
    mods = os.path.join(HERE, "node_modules")
    if all(os.path.isdir(os.path.join(mods, p)) for p in ("e2b", "e2b-2.10")):
        return
    npm = shutil.which("npm")
    if not npm or not shutil.which("node"):
        # A failure, not a skip: a missing client must not pass as a passing test.
        raise RuntimeError("node and npm are needed: run scripts/setup.sh")
    subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=HERE, check=True, timeout=600)


def envelope(payload, flags=0):
    return bytes([flags]) + len(payload).to_bytes(4, "big") + payload


def envelopes(data):
    out = []
    while data:
        n = int.from_bytes(data[1:5], "big")
        out.append((data[0], json.loads(data[5:5 + n])))
        data = data[5 + n:]
    return out


class E2bTestCase(DaemonTestCase):
    @classmethod
    def setUpClass(cls):
        ensure_node_modules()
        cls.port = free_port()
        cls.daemon_args = ["--listen", f"127.0.0.1:{cls.port}"]
        super().setUpClass()
        cls.key_a = cls.token("acme")
        cls.key_b = cls.token("rival")

    @classmethod
    def airlock(cls, *args, timeout=60):
        env = dict(os.environ, AIRLOCK_SOCKET=cls.sock, AIRLOCK_DATA_DIR=cls.data_dir,
                   AIRLOCK_IMAGE_DIR=IMAGE_DIR)
        r = subprocess.run([os.path.join(BIN, "airlock"), "--socket", cls.sock, *args], env=env,
                           capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise AssertionError(f"airlock {' '.join(args)}: {r.returncode}: {r.stderr}")
        return r.stdout

    @classmethod
    def token(cls, tenant):
        return json.loads(cls.airlock("token", "create", "--tenant", tenant, "--e2b", "--json"))["secret"]

    @classmethod
    def http(cls, method, path, body=None, headers=None):
        conn = http.client.HTTPConnection("127.0.0.1", cls.port, timeout=300)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, dict(resp.getheaders()), resp.read()
        finally:
            conn.close()

    @classmethod
    def e2b_api(cls, method, path, body=None, key=None):
        status, _, data = cls.http(method, "/e2b/api" + path,
                                   None if body is None else json.dumps(body),
                                   {"X-API-KEY": key or cls.key_a, "Content-Type": "application/json"})
        return status, (json.loads(data) if data else None)


class EnvdProtocolTest(E2bTestCase):
    """The Connect protocol by hand, on one `base` sandbox (the image the SDK test needs anyway)."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.airlock("image", "build", "debian", timeout=1800)
        status, sb = cls.e2b_api("POST", "/sandboxes", {"templateID": "base", "timeout": 600, "secure": True})
        assert status == 201, sb
        cls.sb = sb

    def envd(self, path, body, content_type="application/json", token=None, sid=None, extra=None):
        headers = {"E2b-Sandbox-Id": sid or self.sb["sandboxID"], "E2b-Sandbox-Port": "49983",
                   "Content-Type": content_type, "Connect-Protocol-Version": "1"}
        token = self.sb["envdAccessToken"] if token is None else token
        if token:
            headers["X-Access-Token"] = token
        headers.update(extra or {})
        return self.http("POST", "/e2b/envd" + path, body, headers)

    def start(self, cmd, *args, **kw):
        msg = json.dumps({"process": {"cmd": cmd, "args": list(args)}, "stdin": False}).encode()
        return self.envd("/process.Process/Start", envelope(msg), "application/connect+json", **kw)

    def test_start_streams_start_data_end_and_end_of_stream(self):
        status, headers, data = self.start("/bin/sh", "-c", "echo hi; echo err >&2; exit 4",
                                           extra={"Authorization": "Basic " + base64.b64encode(b"root:").decode()})
        self.assertEqual(status, 200)
        self.assertEqual(headers["Content-Type"], "application/connect+json")
        msgs = envelopes(data)
        self.assertIn("start", msgs[0][1]["event"])
        self.assertGreater(msgs[0][1]["event"]["start"]["pid"], 0)
        out = b"".join(base64.b64decode(m["event"]["data"].get("stdout", ""))
                       for _, m in msgs if "data" in m.get("event", {}))
        err = b"".join(base64.b64decode(m["event"]["data"].get("stderr", ""))
                       for _, m in msgs if "data" in m.get("event", {}))
        self.assertEqual((out, err), (b"hi\n", b"err\n"))
        self.assertEqual(msgs[-2][1]["event"]["end"], {"exitCode": 4, "exited": True, "status": "exit status 4"})
        self.assertEqual(msgs[-1], (2, {}))
        # Journaled like the native API: the exec and its argv.
        logs = self.api.call("GET", f"/v1/sandboxes/{self.sb['sandboxID']}/logs")
        execs = [e for e in logs if e["event"] == "exec" and "echo hi; echo err >&2; exit 4" in e.get("argv", [])]
        self.assertEqual(len(execs), 1, logs)
        self.assertEqual(execs[0]["exit_code"], 4)
        self.assertEqual(execs[0]["user"], "root")

    def test_stream_errors_are_end_of_stream_errors(self):
        bad = {
            "short header": b"\x00\x00",
            "length beyond body": b"\x00\x00\x00\x00\x10{}",
            "compressed": envelope(b"{}", 1),
            "not json": envelope(b"{nope"),
            "two messages": envelope(b"{}") + envelope(b"{}"),
            "no cmd": envelope(b'{"process":{}}'),
        }
        for what, body in bad.items():
            status, _, data = self.envd("/process.Process/Start", body, "application/connect+json")
            self.assertEqual(status, 200, what)
            msgs = envelopes(data)
            self.assertEqual(len(msgs), 1, what)
            self.assertEqual(msgs[0][0], 2, what)
            self.assertEqual(msgs[0][1]["error"]["code"], "invalid_argument", (what, msgs))
        # Announcing a 5 MiB message: refused from the header, bounded.
        status, _, data = self.envd("/process.Process/Start", b"\x00\x00\x50\x00\x00" + b" " * 16,
                                    "application/connect+json")
        self.assertEqual(envelopes(data)[0][1]["error"]["code"], "resource_exhausted")

    def test_unary_errors_use_connect_status_mapping(self):
        status, _, data = self.envd("/process.Process/SendSignal",
                                    json.dumps({"process": {"pid": 999999}, "signal": "SIGNAL_SIGKILL"}))
        self.assertEqual((status, json.loads(data)["code"]), (404, "not_found"))
        status, _, data = self.envd("/process.Process/List", b"[1]")
        self.assertEqual((status, json.loads(data)["code"]), (400, "invalid_argument"))
        status, _, data = self.envd("/process.Process/List", b"{}", "text/plain")
        self.assertEqual(status, 415)
        status, _, data = self.envd("/process.Process/StreamInput", b"{}")
        self.assertEqual((status, json.loads(data)["code"]), (404, "unimplemented"))
        status, _, data = self.envd("/process.Process/List", b"{}")
        self.assertEqual((status, json.loads(data)), (200, {"processes": []}))

    def test_unknown_or_unauthorised_sandbox_is_e2b_not_found(self):
        # No token, a wrong token, an unknown id, another port: all the same 502.
        for kw in ({"token": ""}, {"token": "0" * 64}, {"sid": "sb-000000000000"},
                   {"extra": {"E2b-Sandbox-Port": "8080"}}):
            status, _, data = self.envd("/process.Process/List", b"{}", **kw)
            self.assertEqual(status, 502, kw)
            self.assertEqual(json.loads(data)["message"], "The sandbox was not found", kw)
        # A native sandbox (not made through E2B) is not reachable without a key.
        native = self.api.create(image="debian")
        try:
            status, _, _ = self.envd("/process.Process/List", b"{}", sid=native["id"], token="")
            self.assertEqual(status, 502)
        finally:
            self.api.delete(native["id"])
        status, _, _ = self.http("GET", "/e2b/envd/health",
                                 headers={"E2b-Sandbox-Id": self.sb["sandboxID"],
                                          "X-Access-Token": self.sb["envdAccessToken"]})
        self.assertEqual(status, 204)

    def test_files_hostile_uploads_and_filesystem_errors(self):
        sid, tok = self.sb["sandboxID"], self.sb["envdAccessToken"]
        hdr = {"E2b-Sandbox-Id": sid, "X-Access-Token": tok}

        def post(query, body, ctype):
            return self.http("POST", "/e2b/envd/files" + query, body, dict(hdr, **{"Content-Type": ctype}))

        part = (b'--B\r\nContent-Disposition: form-data; name="file"; filename="/tmp/up/%s"\r\n\r\n%s\r\n')
        status, _, data = post("?username=root", part % (b"a", b"1") + part % (b"b", b"22") + b"--B--\r\n",
                               "multipart/form-data; boundary=B")
        self.assertEqual(status, 200, data)
        self.assertEqual([e["path"] for e in json.loads(data)], ["/tmp/up/a", "/tmp/up/b"])
        status, _, data = self.http("GET", "/e2b/envd/files?path=%2Ftmp%2Fup%2Fb&username=root", headers=hdr)
        self.assertEqual((status, data), (200, b"22"))
        for body, ctype, words in ((b"garbage", "multipart/form-data; boundary=B", "no boundary"),
                                   (b"--B\r\n" + b"h" * 20000 + b"\r\n\r\nx\r\n--B--", "multipart/form-data; boundary=B", "16 KiB"),
                                   (part % (b"c", b"cut"), "multipart/form-data; boundary=B", "ends inside a part"),
                                   (b"x", "text/plain", "unsupported content type")):
            status, _, data = post("", body, ctype)
            self.assertEqual(status, 400, data)
            self.assertEqual(json.loads(data)["code"], 400)
            self.assertIn(words, json.loads(data)["message"])
        status, _, data = self.http("GET", "/e2b/envd/files?path=%2Fno%2Fsuch", headers=hdr)
        self.assertEqual((status, json.loads(data)["code"]), (404, 404))
        # The Connect service: not found, already exists, a file is not a directory.
        status, _, data = self.envd("/filesystem.Filesystem/Stat", b'{"path": "/no/such"}')
        self.assertEqual((status, json.loads(data)["code"]), (404, "not_found"))
        status, _, data = self.envd("/filesystem.Filesystem/MakeDir", b'{"path": "/tmp"}')
        self.assertEqual((status, json.loads(data)["code"]), (409, "already_exists"))
        status, _, data = self.envd("/filesystem.Filesystem/ListDir", b'{"path": "/tmp/up/a"}')
        self.assertEqual((status, json.loads(data)["code"]), (400, "invalid_argument"))
        status, _, data = self.envd("/filesystem.Filesystem/ListDir", b'{"path": "/tmp/up", "depth": 1}')
        self.assertEqual(status, 200, data)
        self.assertEqual([e["name"] for e in json.loads(data)["entries"]], ["a", "b"])
        self.assertEqual(json.loads(data)["entries"][1]["size"], "2")
        # The watcher trio: events buffered between polls, then removed.
        status, _, data = self.envd("/filesystem.Filesystem/CreateWatcher", b'{"path": "/tmp/up"}')
        self.assertEqual(status, 200, data)
        wid = json.loads(data)["watcherId"]
        self.envd("/filesystem.Filesystem/Remove", b'{"path": "/tmp/up/a"}')
        events = []
        for _ in range(100):
            status, _, data = self.envd("/filesystem.Filesystem/GetWatcherEvents",
                                        json.dumps({"watcherId": wid}).encode())
            self.assertEqual(status, 200, data)
            events += json.loads(data)["events"]
            if {"name": "a", "type": "EVENT_TYPE_REMOVE"} in events:
                break
        self.assertIn({"name": "a", "type": "EVENT_TYPE_REMOVE"}, events)
        self.assertEqual(self.envd("/filesystem.Filesystem/RemoveWatcher",
                                   json.dumps({"watcherId": wid}).encode())[0], 200)
        status, _, data = self.envd("/filesystem.Filesystem/GetWatcherEvents",
                                    json.dumps({"watcherId": wid}).encode())
        self.assertEqual((status, json.loads(data)["code"]), (404, "not_found"))

    def test_home_is_the_users_passwd_home(self):
        # envd resolves "~" and relative paths against the home a process of
        # that user gets as $HOME: the guest's passwd entry, not a guess of
        # /home/NAME (which put alice's files where her programs never look).
        sid, tok = self.sb["sandboxID"], self.sb["envdAccessToken"]
        _, err, end = self.api.exec(sid, argv=["useradd", "-m", "-d", "/srv/alice", "alice"])
        self.assertEqual(end["exit_code"], 0, err)
        status, _, data = self.http("POST", "/e2b/envd/files?path=notes.txt&username=alice", b"hers",
                                    {"E2b-Sandbox-Id": sid, "X-Access-Token": tok,
                                     "Content-Type": "application/octet-stream"})
        self.assertEqual(status, 200, data)
        self.assertEqual([e["path"] for e in json.loads(data)], ["/srv/alice/notes.txt"])
        out, err, _ = self.api.exec(sid, argv=["sh", "-c", "echo $HOME; cat ~/notes.txt"],
                                    user="alice")
        self.assertEqual(bytes(out), b"/srv/alice\nhers", err)
        alice = "Basic " + base64.b64encode(b"alice:").decode()
        status, _, data = self.envd("/filesystem.Filesystem/Stat", b'{"path": "~"}',
                                    extra={"Authorization": alice})
        self.assertEqual((status, json.loads(data)["entry"]["path"]), (200, "/srv/alice"), data)
        # A user the guest does not know is refused, not guessed.
        status, _, data = self.http("GET", "/e2b/envd/files?path=x&username=nosuchuser",
                                    headers={"E2b-Sandbox-Id": sid, "X-Access-Token": tok})
        self.assertIn(status, (401, 404), data)


class SdkTest(E2bTestCase):
    """Both pinned SDK releases, end to end on template `base` (debian)."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.airlock("image", "build", "debian", timeout=1800)

    def run_sdk(self, pkg):
        env = dict(os.environ,
                   E2B_API_URL=f"http://127.0.0.1:{self.port}/e2b/api",
                   E2B_SANDBOX_URL=f"http://127.0.0.1:{self.port}/e2b/envd",
                   E2B_API_KEY=self.key_a, E2B_API_KEY_B=self.key_b)
        r = subprocess.run(["node", os.path.join(HERE, "sdk_test.mjs"), pkg], cwd=HERE, env=env,
                           capture_output=True, timeout=1200)
        out, err = r.stdout.decode(), r.stderr.decode()
        self.assertEqual(r.returncode, 0, f"stdout:\n{out}\nstderr:\n{err}\n{self.daemon_log()}")
        self.assertIn(f"ok: [{pkg}] all sections passed", out)
        made = [line.split()[1] for line in out.splitlines() if line.startswith("SANDBOX ")]
        self.assertEqual(len(made), 2, out)
        first = made[0]
        # Everything done through envd is on the sandbox's journal like a
        # native exec: commands, the background one killed after its stdin.
        logs = self.api.call("GET", f"/v1/sandboxes/{first}/logs")
        argvs = [e.get("argv", []) for e in logs if e["event"] == "exec"]
        self.assertTrue(any("echo hello; echo oops >&2" in a for a in argvs), argvs)
        killed = [e for e in logs if e["event"] == "exec" and e.get("argv", [])[-1:] == ["cat"]]
        self.assertEqual([(e["reason"], e["signal"], e["stdin_bytes"]) for e in killed],
                         [("killed", 9, len("ping\npong\n"))], logs)
        self.assertEqual(self.api.call("GET", f"/v1/sandboxes/{first}")["state"], "timed_out")
        for sid in made:
            self.assertNothingLeft(sid)
        return out

    def test_sdk_2_51(self):
        self.run_sdk("e2b")

    def test_sdk_2_10(self):
        self.run_sdk("e2b-2.10")


if __name__ == "__main__":
    unittest.main()

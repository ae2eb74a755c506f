"""The operator always gets in; slow or failing clients cannot hold the door.

A real airlockd with --listen on a free loopback port, two tenants with
tokens made by the real CLI (`airlock token create`), attacks over TCP from
loopback source addresses of the test's choosing (127.0.0.0/8 is all
loopback), the operator on the unix socket.
"""

import glob
import json
import os
import shutil
import socket
import subprocess
import time
import unittest

import harness
from harness import BIN, ApiError, TcpClient, TcpDaemonTestCase, UnixHTTPConnection, free_port


def cli(test, *args, check=True, timeout=60):
    """Runs the real `airlock` CLI against the class's daemon (its unix socket)."""
    r = subprocess.run([os.path.join(BIN, "airlock"), "--socket", test.sock, *args],
                       capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"airlock {' '.join(args)}: {r.returncode}: {r.stderr}")
    return r


def read_to_eof(s):
    data = b""
    while True:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def body_of(answer):
    return json.loads(answer.split(b"\r\n\r\n", 1)[1])


class TenantDoor(TcpDaemonTestCase):
    """A daemon on TCP with tenants acme and other (tokens from the real CLI)."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.acme = cls.new_token("acme")[0]
        cls.other = cls.new_token("other")[0]

    def tcp(self, token=None, source=None):
        return TcpClient("127.0.0.1", self.port, token, source=source)

    def raw(self, source="127.0.0.1", timeout=30):
        s = socket.socket()
        s.settimeout(timeout)
        s.bind((source, 0))
        s.connect(("127.0.0.1", self.port))
        return s

    def info(self):
        return self.api.call("GET", "/v1/info")["daemon"]["connections"]


class SlowClientsTest(TenantDoor):
    """256 slow TCP clients (the default --max-connections 256) leave the
    unix socket its reserve; one source address cannot take them all."""

    def test_operator_gets_in_past_256_slow_tcp_clients(self):
        held, refused = [], 0
        try:
            # From four loopback addresses (the per-source cap is 128): each
            # connection starts a request and never finishes it.
            for i in range(256):
                s = self.raw(source=f"127.0.0.{2 + i % 4}")
                s.sendall(b"GET /v1/sandboxes HTTP/1.1\r\nHost: x\r\n")
                held.append(s)
            time.sleep(0.5)
            start = time.monotonic()
            r = cli(self, "ls", timeout=20)
            self.assertLess(time.monotonic() - start, 5)
            self.assertEqual(r.returncode, 0, r.stderr)
            c = self.info()
            self.assertEqual(c["max"], 256)
            self.assertEqual(c["unix_reserve"], 16)
            self.assertEqual(c["tcp_open"], 240)  # 256 less the reserve
            self.assertGreaterEqual(c["unix_open"], 1)
            self.assertEqual(sum(c["sources"].values()), 240)
            # The sixteen past the network's share were told why.
            for s in held:
                s.setblocking(False)
                try:
                    data = s.recv(65536)
                except BlockingIOError:
                    continue
                if data.startswith(b"HTTP/1.1 503"):
                    refused += 1
                    err = body_of(data)["error"]
                    self.assertEqual(err["code"], "unavailable")
                    self.assertIn("--unix-socket-reserve", err["message"])
            self.assertEqual(refused, 16)
        finally:
            for s in held:
                s.close()

    def test_one_source_is_capped(self):
        held = []
        try:
            for _ in range(128):
                s = self.raw(source="127.0.0.7")
                held.append(s)
            deadline = time.monotonic() + 5
            while self.info()["sources"].get("127.0.0.7", 0) < 128 and time.monotonic() < deadline:
                time.sleep(0.05)
            s = self.raw(source="127.0.0.7")
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = read_to_eof(s)
            s.close()
            self.assertTrue(answer.startswith(b"HTTP/1.1 503"), answer)
            self.assertIn("--max-connections-per-source", body_of(answer)["error"]["message"])
            # Another address is served meanwhile.
            self.assertEqual(self.tcp(self.other, source="127.0.0.8").call("GET", "/v1/sandboxes"), [])
            self.assertGreaterEqual(self.info()["refused_source_cap"], 1)
        finally:
            for s in held:
                s.close()


class TenantCapTest(TenantDoor):
    """A tenant holds at most --max-connections-per-tenant, streams included."""

    extra_args = ["--max-connections-per-tenant", "3"]

    def held_connection(self, token):
        """A kept-alive TCP connection that has made one request as `token`'s tenant."""
        c = self.tcp(token)
        conn = c.connection(30)
        conn.request("GET", "/v1/sandboxes", headers=c.headers)
        resp = conn.getresponse()
        resp.read()
        self.assertEqual(resp.status, 200)
        return conn

    def close_all(self, conns):
        """Closes acme's connections and waits until the daemon no longer counts them."""
        for conn in conns:
            conn.close()
        deadline = time.monotonic() + 10
        while self.info()["tenants"].get("acme", 0) and time.monotonic() < deadline:
            time.sleep(0.05)

    def over_cap(self, token):
        with self.assertRaises(ApiError) as e:
            self.tcp(token).call("GET", "/v1/sandboxes")
        self.assertEqual((e.exception.status, e.exception.code), (503, "unavailable"))
        self.assertIn("--max-connections-per-tenant", e.exception.message)

    def test_requests_over_the_tenant_cap_are_refused_and_others_served(self):
        held = [self.held_connection(self.acme) for _ in range(3)]
        try:
            self.over_cap(self.acme)
            self.assertEqual(self.tcp(self.other).call("GET", "/v1/sandboxes"), [])
            c = self.info()
            self.assertEqual(c["tenants"].get("acme"), 3)
            self.assertGreaterEqual(c["refused_tenant_cap"], 1)
            self.assertEqual(c["max_per_tenant"], 3)
            # A tenant's view names no other tenant: it has no connection
            # counts at all (daemon/tenancy.h, tenant_info).
            mine = self.tcp(self.other).call("GET", "/v1/info")["daemon"]
            self.assertNotIn("connections", mine)
        finally:
            self.close_all(held)
        self.assertEqual(self.tcp(self.acme).call("GET", "/v1/sandboxes"), [])

    def test_streams_count_against_their_tenant(self):
        sid = self.tcp(self.acme).call("POST", "/v1/sandboxes", {"image": "minimal"})["id"]
        streams = []
        try:
            for _ in range(3):
                c = self.tcp(self.acme)
                conn = c.connection(60)
                conn.request("GET", f"/v1/sandboxes/{sid}/events?follow=true", headers=c.headers)
                resp = conn.getresponse()
                self.assertEqual(resp.status, 200)
                resp.readline()  # the stream is live
                streams.append(conn)
            self.over_cap(self.acme)
            self.assertEqual(self.tcp(self.other).call("GET", "/v1/sandboxes"), [])
        finally:
            self.close_all(streams)
            # The server notices a closed follower within its next wake-up
            # (500 ms); the operator's socket does not wait for that.
            self.api.delete(sid)
        self.assertNothingLeft(sid)


class HeaderDeadlineTest(TenantDoor):
    """The whole header block within --header-timeout, however it trickles."""

    extra_args = ["--header-timeout", "2", "--idle-timeout", "30"]

    def test_trickled_headers_are_cut_at_the_deadline(self):
        s = self.raw()
        s.sendall(b"GET /v1/sandboxes HTTP/1.1\r\n")
        start, answer = time.monotonic(), b""
        # One byte every half second: no read ever waits near --idle-timeout.
        while time.monotonic() - start < 8:
            try:
                s.sendall(b"X")
            except OSError:
                break
            s.settimeout(0.5)
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                continue
            except ConnectionResetError:
                break
            if not chunk:
                break
            answer += chunk
        s.close()
        self.assertTrue(answer.startswith(b"HTTP/1.1 408"), answer)
        self.assertIn("--header-timeout", body_of(answer)["error"]["message"])
        self.assertLess(time.monotonic() - start, 5)
        self.assertGreaterEqual(self.info()["header_timeouts"], 1)

    def test_silent_connection_is_cut_at_the_deadline(self):
        s = self.raw()
        start = time.monotonic()
        self.assertEqual(read_to_eof(s), b"")
        self.assertLess(time.monotonic() - start, 5)  # not the 30 s idle timeout
        s.close()

    def test_kept_alive_connection_waits_for_its_next_request(self):
        # Between requests only --idle-timeout applies.
        c = self.tcp(self.acme)
        conn = c.connection(30)
        conn.request("GET", "/v1/sandboxes", headers=c.headers)
        conn.getresponse().read()
        time.sleep(3)
        conn.request("GET", "/v1/sandboxes", headers=c.headers)
        resp = conn.getresponse()
        self.assertEqual((resp.status, json.loads(resp.read())), (200, []))
        conn.close()


class LimiterTest(TenantDoor):
    """Failures are limited per source; a valid token is always served."""

    def test_bad_client_does_not_lock_out_a_valid_token_from_the_same_source(self):
        bad = self.tcp("airlock_" + "0" * 40, source="127.0.0.9")
        for _ in range(40):
            try:
                bad.call("GET", "/v1/sandboxes")
            except ApiError as e:
                if e.status == 429:
                    break
                self.assertEqual(e.status, 401)
        else:
            self.fail("40 bad tokens were never limited")
        # The same source, a valid token (e.g. another client behind one proxy).
        self.assertEqual(self.tcp(self.acme, source="127.0.0.9").call("GET", "/v1/sandboxes"), [])
        # The bad one is still limited.
        with self.assertRaises(ApiError) as e:
            bad.call("GET", "/v1/sandboxes")
        self.assertEqual(e.exception.status, 429)
        # No token at all from the limited source: still 429 on an API route.
        with self.assertRaises(ApiError) as e:
            self.tcp(source="127.0.0.9").call("GET", "/v1/sandboxes")
        self.assertEqual(e.exception.status, 429)
        # Probes answer without a token, even from the limited source.
        self.assertEqual(self.tcp(source="127.0.0.9").call("GET", "/healthz"), {"status": "ok"})

    def test_probes_answer_without_a_token_and_disclose_nothing(self):
        self.assertEqual(self.tcp().call("GET", "/healthz"), {"status": "ok"})
        try:
            r = self.tcp().call("GET", "/readyz")
            self.assertEqual(r, {"status": "ready"})
        except ApiError as e:
            self.assertEqual((e.status, e.code, e.message), (503, "unavailable", "not ready"))
        # Nothing else without a token.
        with self.assertRaises(ApiError) as e:
            self.tcp().call("GET", "/v1/info")
        self.assertEqual(e.exception.status, 401)


class NotReadyTest(TenantDoor):
    """A daemon with no image built: readyz says so, in detail only to the operator."""

    @classmethod
    def setUpClass(cls):
        empty = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"airlock-noimages-{os.getpid()}")
        os.makedirs(empty, exist_ok=True)
        saved, harness.IMAGE_DIR = harness.IMAGE_DIR, empty
        try:
            super().setUpClass()
        finally:
            harness.IMAGE_DIR = saved
        cls.empty = empty

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        shutil.rmtree(cls.empty, ignore_errors=True)

    def test_readyz_detail_is_the_operators(self):
        for client in (self.tcp(), self.tcp(self.acme)):
            with self.assertRaises(ApiError) as e:
                client.call("GET", "/readyz")
            self.assertEqual((e.exception.status, e.exception.code), (503, "unavailable"))
            self.assertEqual(e.exception.message, "not ready")
        with self.assertRaises(ApiError) as e:
            self.api.call("GET", "/readyz")
        self.assertEqual(e.exception.status, 503)
        self.assertIn("not ready to create sandboxes: ", e.exception.message)
        self.assertNotEqual(e.exception.message, "not ready")


class AuditBoundTest(TenantDoor):
    """audit.jsonl stays bounded whatever failing clients send."""

    def audit_bytes(self):
        return sum(os.path.getsize(p) for p in glob.glob(os.path.join(self.data_dir, "audit.jsonl*")))

    def test_1000_long_paths_with_a_bad_token_stay_small(self):
        path = "/e2b/api/" + "a" * 60000
        conn = TcpClient("127.0.0.1", self.port, source="127.0.0.11").connection(30)
        statuses = set()
        for _ in range(1000):
            # Reopened by http.client whenever an answer closed the connection.
            conn.request("GET", path, headers={"Authorization": "Bearer airlock_" + "0" * 40})
            resp = conn.getresponse()
            resp.read()
            statuses.add(resp.status)
        conn.close()
        self.assertIn(429, statuses)  # limited along the way, still recorded
        self.assertLess(self.audit_bytes(), 2 << 20)
        with open(os.path.join(self.data_dir, "audit.jsonl")) as f:
            last = json.loads(f.read().splitlines()[-1])
        self.assertLess(len(last["route"]), 400)
        self.assertIn("truncated", last["route"])

    def test_non_utf8_path_is_recorded_not_fatal(self):
        s = self.raw(source="127.0.0.12")
        s.sendall(b"GET /e2b/api/\xff\xfe HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer bad\r\n"
                  b"Connection: close\r\n\r\n")
        read_to_eof(s)
        s.close()
        self.assertEqual(self.api.call("GET", "/healthz"), {"status": "ok"})


class PortForwardRangeTest(TenantDoor):
    """Port forwards bind only in the operator's range (--port-forward-range),
    for a tenant and for the operator; one networked VM whose empty
    allowlist reaches nothing."""

    base = 41000 + (os.getpid() % 800) * 10
    extra_args = ["--port-forward-range", f"{base}-{base + 9}"]

    def test_host_port_outside_the_range_is_refused(self):
        acme = self.tcp(self.acme)
        sid = acme.call("POST", "/v1/sandboxes", {"image": "minimal", "network": {"mode": "allowlist"}})["id"]
        try:
            ports = f"/v1/sandboxes/{sid}/ports"
            outside = free_port()  # a free loopback port the kernel picked, not in the range
            for client in (acme, self.api):  # the operator is bound by the same range
                with self.assertRaises(ApiError) as e:
                    client.call("POST", ports, {"guest_port": 8080, "host_port": outside})
                self.assertEqual((e.exception.status, e.exception.field), (400, "host_port"))
                self.assertIn(f"{self.base}-{self.base + 9}", e.exception.message)
            with socket.socket() as probe:  # nothing was bound there
                probe.bind(("127.0.0.1", outside))
            self.assertEqual(acme.call("GET", ports), [])
            # A free port is picked inside the range; an explicit one there is taken.
            fwd = acme.call("POST", ports, {"guest_port": 8080})
            self.assertTrue(self.base <= fwd["host_port"] <= self.base + 9, fwd)
            explicit = next(p for p in range(self.base, self.base + 10) if p != fwd["host_port"])
            fwd2 = acme.call("POST", ports, {"guest_port": 8081, "host_port": explicit})
            self.assertEqual(fwd2["host_port"], explicit)
            self.assertEqual(sorted(p["host_port"] for p in acme.call("GET", ports)),
                             sorted([fwd["host_port"], explicit]))
        finally:
            acme.delete(sid)
        self.assertNothingLeft(sid)


if __name__ == "__main__":
    unittest.main()

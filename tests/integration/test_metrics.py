"""GET /metrics, /healthz and /readyz on a real daemon with real VMs (minimal).

Every scrape is checked by `promtool check metrics` (Debian's prometheus
package, scripts/setup.sh) and parsed; the tests do real work between
scrapes and check that the counters and histograms moved by exactly what was
done, and that the sandboxes-by-state gauge follows.
"""

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

import harness
from harness import ApiError, DaemonTestCase, NetnsDaemonTestCase, netns_available

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?')


def parse(text):
    """{(name, frozenset of label pairs): value} of an exposition; fails on
    any line that is neither a comment nor a well-formed sample."""
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        if not m:
            raise AssertionError(f"malformed sample line: {line!r}")
        labels = frozenset((k, v) for k, v in LABEL.findall(m.group(2) or ""))
        samples[(m.group(1), labels)] = float(m.group(3))
    return samples


class Scrapes:
    """Scrapes and promtool-checks a daemon's /metrics."""

    def scrape(self):
        status, headers, data = self.api.raw("GET", "/metrics")
        self.assertEqual(status, 200, data[:500])
        self.assertEqual(dict(headers).get("Content-Type"), CONTENT_TYPE)
        promtool = shutil.which("promtool")
        self.assertIsNotNone(promtool, "promtool is missing: apt-get install prometheus (scripts/setup.sh)")
        r = subprocess.run([promtool, "check", "metrics"], input=data, capture_output=True, timeout=30)
        self.assertEqual(r.returncode, 0, f"promtool rejects the scrape: {r.stdout.decode()} {r.stderr.decode()}")
        return parse(data.decode())

    @staticmethod
    def value(samples, name, **labels):
        return samples.get((name, frozenset(labels.items())), 0.0)

    def moved(self, before, after, name, **labels):
        return self.value(after, name, **labels) - self.value(before, name, **labels)


class MetricsTest(Scrapes, DaemonTestCase):
    def test_healthz_and_readyz(self):
        self.assertEqual(self.api.call("GET", "/healthz"), {"status": "ok"})
        self.assertEqual(self.api.call("GET", "/readyz"), {"status": "ready"})
        with self.assertRaises(ApiError) as cm:
            self.api.call("GET", "/metrics?bogus=1")
        self.assertEqual((cm.exception.status, cm.exception.code), (400, "invalid_argument"))

    def test_counters_and_histograms_follow_real_work(self):
        s0 = self.scrape()
        sb = self.api.create(image="minimal")
        sid = sb["id"]
        start = sb["start"]
        self.assertIn(start, ("pool", "clone", "boot"))
        for _ in range(3):
            _, _, ex = self.api.exec(sid, argv=["true"])
            self.assertEqual(ex["exit_code"], 0)
        _, _, ex = self.api.exec(sid, cmd="exit 3")
        self.assertEqual(ex["exit_code"], 3)
        # A failed exec: a binary that does not exist (the guest's error code).
        with self.assertRaises(ApiError) as cm:
            self.api.exec(sid, argv=["/no/such/binary"])
        exec_error = cm.exception.code
        self.assertTrue(exec_error, cm.exception.body)
        # Refused before the stream (an HTTP error status) or in it (an
        # "error" line in a 200 stream, which the harness raises as 500).
        exec_error_status = None if cm.exception.status == 500 else str(cm.exception.status)
        # A background one.
        self.api.call("POST", f"/v1/sandboxes/{sid}/exec", {"argv": ["sleep", "0"], "background": True})
        # A failed create with bad input (refused inside the engine).
        with self.assertRaises(ApiError) as cm:
            self.api.create(image="no-such-image")
        self.assertEqual(cm.exception.code, "invalid_argument")
        s1 = self.scrape()

        self.assertEqual(self.moved(s0, s1, "airlock_creates_total", start=start, outcome="ok"), 1)
        self.assertEqual(self.moved(s0, s1, "airlock_creates_total", start="none", outcome="invalid_argument"), 1)
        self.assertEqual(self.moved(s0, s1, "airlock_create_duration_seconds_count", start=start), 1)
        self.assertEqual(self.moved(s0, s1, "airlock_create_duration_seconds_bucket", start=start, le="+Inf"), 1)
        create_s = self.moved(s0, s1, "airlock_create_duration_seconds_sum", start=start)
        self.assertGreaterEqual(create_s, sb["boot_ms"] / 1000 - 0.01)
        self.assertLess(create_s, 120)

        self.assertEqual(self.moved(s0, s1, "airlock_execs_total", kind="foreground", outcome="exited"), 4)
        self.assertEqual(self.moved(s0, s1, "airlock_execs_total", kind="foreground", outcome=exec_error), 1)
        self.assertEqual(self.moved(s0, s1, "airlock_execs_total", kind="background", outcome="started"), 1)
        self.assertEqual(self.moved(s0, s1, "airlock_exec_duration_seconds_count", kind="foreground"), 5)
        self.assertEqual(self.moved(s0, s1, "airlock_exec_duration_seconds_count", kind="background"), 1)
        # Cumulative buckets: every exec is under +Inf, a bucket never holds more than the next.
        buckets = sorted((float(dict(k[1])["le"]), v) for k, v in s1.items()
                         if k[0] == "airlock_exec_duration_seconds_bucket" and ("kind", "foreground") in k[1])
        self.assertEqual(buckets[-1][1], self.value(s1, "airlock_exec_duration_seconds_count", kind="foreground"))
        self.assertEqual([v for _, v in buckets], sorted(v for _, v in buckets))

        self.assertEqual(self.moved(s0, s1, "airlock_sandboxes", state="running"), 1)
        self.assertGreaterEqual(self.value(s1, "airlock_qemu_processes"), 1)
        self.assertGreater(self.value(s1, "airlock_qemu_resident_memory_bytes"), 16 << 20)
        self.assertGreater(self.value(s1, "airlock_journal_bytes"), self.value(s0, "airlock_journal_bytes"))
        # Per-tenant live sandboxes (the unix socket's are the operator's)
        # and the host disk airlock uses, by kind.
        self.assertEqual(self.moved(s0, s1, "airlock_tenant_sandboxes", tenant="operator"), 1)
        self.assertGreater(self.value(s1, "airlock_disk_bytes", kind="overlays"),
                           self.value(s0, "airlock_disk_bytes", kind="overlays"))
        self.assertGreater(self.value(s1, "airlock_disk_bytes", kind="journals"), 0)
        for kind in ("images", "layers", "snapshots", "templates", "overlays", "journals"):
            self.assertIn(("airlock_disk_bytes", frozenset({("kind", kind)})), s1, kind)

        exec_route = "/v1/sandboxes/{id}/exec"
        self.assertEqual(self.moved(s0, s1, "airlock_http_requests_total", route=exec_route, status="200"),
                         4 if exec_error_status else 5)
        if exec_error_status:
            self.assertEqual(self.moved(s0, s1, "airlock_http_requests_total", route=exec_route,
                                        status=exec_error_status), 1)
        self.assertEqual(self.moved(s0, s1, "airlock_http_requests_total", route=exec_route, status="201"), 1)
        self.assertEqual(self.moved(s0, s1, "airlock_http_requests_total", route="/v1/sandboxes", status="201"), 1)
        self.assertEqual(self.moved(s0, s1, "airlock_http_requests_total", route="/v1/sandboxes", status="400"), 1)
        # A scrape is counted once answered: s0 shows up in s1.
        self.assertEqual(self.moved(s0, s1, "airlock_http_requests_total", route="/metrics", status="200"), 1)

        self.api.delete(sid)
        s2 = self.scrape()
        self.assertEqual(self.moved(s1, s2, "airlock_sandboxes", state="running"), -1)
        self.assertEqual(self.moved(s1, s2, "airlock_sandboxes", state="deleted"), 1)
        self.assertEqual(self.moved(s1, s2, "airlock_http_requests_total",
                                    route="/v1/sandboxes/{id}", status="204"), 1)
        self.assertEqual(self.moved(s1, s2, "airlock_creates_total", start=start, outcome="ok"), 0)
        self.assertNothingLeft(sid)

    def test_failure_is_counted_by_typed_reason(self):
        s0 = self.scrape()
        sb = self.api.create(image="minimal")
        sid = sb["id"]
        os.kill(sb["pid"], signal.SIGKILL)  # the VMM dies under the sandbox
        deadline = time.time() + 30
        while self.api.call("GET", f"/v1/sandboxes/{sid}")["state"] != "failed":
            self.assertLess(time.time(), deadline, "the sandbox never became failed")
            time.sleep(0.2)
        s1 = self.scrape()
        self.assertEqual(self.moved(s0, s1, "airlock_sandbox_failures_total", reason="vmm_died"), 1)
        self.assertEqual(self.moved(s0, s1, "airlock_sandboxes", state="failed"), 1)
        self.assertEqual(self.moved(s0, s1, "airlock_sandboxes", state="running"), 0)



@unittest.skipUnless(netns_available(), "needs root and ip netns (a network namespace of its own)")
class NetworkMetricsTest(Scrapes, NetnsDaemonTestCase):
    """Flows allowed and denied by a sandbox's filter are counted. The daemon
    runs in an empty network namespace of the test's own (loopback only), so
    the allowed flow reaches nothing."""

    NS_PREFIX = "almetrics"

    def test_flows_allowed_and_denied_are_counted(self):
        sb = self.api.create(image="minimal", network={"mode": "allowlist", "allow": ["203.0.113.7/32"]})
        sid = sb["id"]
        self.addCleanup(lambda: self.api.delete(sid))
        s0 = self.scrape()
        self.api.exec(sid, cmd="nc -w 2 203.0.113.7 80 </dev/null; nc -w 2 198.51.100.9 80 </dev/null; true")
        deadline = time.time() + 15
        while True:
            flows = [e for e in self.api.call("GET", f"/v1/sandboxes/{sid}/network/events")
                     if e["event"] == "net_flow" and e.get("port") == 80]
            if {e["dst"] for e in flows} >= {"203.0.113.7", "198.51.100.9"} or time.time() > deadline:
                break
            time.sleep(0.2)
        allowed = sum(1 for e in flows if e["allowed"])
        denied = sum(1 for e in flows if not e["allowed"])
        self.assertGreaterEqual(allowed, 1, flows)
        self.assertGreaterEqual(denied, 1, flows)
        s1 = self.scrape()
        # A record is counted just before it is journalled: the counter is at
        # least what the journal showed before the scrape and at most what it
        # shows after it (a late retry may land in between).
        after = [e for e in self.api.call("GET", f"/v1/sandboxes/{sid}/network/events") if e["event"] == "net_flow"]
        for verdict, before_n, is_allowed in (("allowed", allowed, True), ("denied", denied, False)):
            got = self.moved(s0, s1, "airlock_network_flows_total", direction="out", verdict=verdict)
            self.assertGreaterEqual(got, before_n, verdict)
            self.assertLessEqual(got, sum(1 for e in after if e["allowed"] == is_allowed), verdict)


class NotReadyTest(Scrapes, DaemonTestCase):
    """A daemon whose image directory is empty cannot create: /readyz is 503
    naming what is missing, while /healthz and /metrics still answer."""

    @classmethod
    def setUpClass(cls):
        cls.empty_images = tempfile.mkdtemp(prefix="airlock-noimages-")
        saved = harness.IMAGE_DIR
        harness.IMAGE_DIR = cls.empty_images
        try:
            super().setUpClass()
        finally:
            harness.IMAGE_DIR = saved

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        shutil.rmtree(cls.empty_images, ignore_errors=True)

    def test_readyz_is_503_naming_the_missing_image(self):
        with self.assertRaises(ApiError) as cm:
            self.api.call("GET", "/readyz")
        e = cm.exception
        self.assertEqual((e.status, e.code), (503, "unavailable"))
        self.assertIn("no image is built", e.message)
        self.assertIn(self.empty_images, e.message)
        self.assertIn("accelerator probe has not run", e.message)
        self.assertEqual(self.api.call("GET", "/healthz"), {"status": "ok"})
        s = self.scrape()
        self.assertEqual(self.value(s, "airlock_sandboxes", state="running"), 0)
        self.assertEqual(self.value(s, "airlock_http_requests_total", route="/readyz", status="503"), 1)


if __name__ == "__main__":
    unittest.main()

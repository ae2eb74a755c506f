"""Network egress policy end to end (issue 4): a real daemon, real VMs, the
real airlock-net helper, and a little internet of the test's own.

Needs root (network namespaces); skipped otherwise. Topology, all of it in two
namespaces this test creates and always deletes:
  alit-h-PID  "the host": airlockd, QEMU and airlock-net run here; veth
              192.0.2.2/24, default route to the internet namespace; a decoy
              HTTP server on its own 127.0.0.1:80.
  alit-i-PID  "the internet": HTTP on :80 ("hello <local address>") and a
              hold-open server on :81 on 198.51.100.10/.11 and 203.0.113.10/.11,
              DNS on 203.0.113.53 (www/mail.example.com), and decoys that must
              stay unreachable: 169.254.169.254, 10.1.2.3.
Those addresses never exist in the host's own namespace. The helper resolves
through the test's DNS server (AIRLOCK_NET_DNS_UPSTREAM).
"""

import json
import os
import subprocess
import sys
import threading
import time
import unittest

from harness import ROOT, ApiError, DaemonTestCase

LITTLE_INTERNET = os.path.join(ROOT, "tests", "netns", "little_internet.py")

PID = os.getpid()
NS_H = f"alit-h-{PID}"
NS_I = f"alit-i-{PID}"
SERVERS = ["198.51.100.10", "198.51.100.11", "203.0.113.10", "203.0.113.11", "203.0.113.12"]
DECOYS = ["169.254.169.254", "10.1.2.3"]
DNS = "203.0.113.53"
ZONE = {"www.example.com": "203.0.113.10", "mail.example.com": "203.0.113.11",
        "x.wild.example.org": "203.0.113.12", "wild.example.org": "203.0.113.12",
        # DNS rebinding: an allowed name pointing at internal addresses.
        "rebind.example.com": "10.1.2.3", "lo.example.com": "127.0.0.1"}
# UDP echo on :53 of two servers (the image's busybox has no `nc -u`: its
# nslookup is the guest's UDP client).
ECHO = ["198.51.100.10:53", "198.51.100.11:53"]


def sh(*args):
    subprocess.run(args, check=True, capture_output=True)


def can_run():
    if os.geteuid() != 0:
        return "needs root (ip netns add)"
    if subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        return "network namespaces unavailable"
    return None


@unittest.skipIf(can_run(), f"network test skipped: {can_run()}")
class NetworkTest(DaemonTestCase):
    daemon_prefix = ["ip", "netns", "exec", NS_H]
    servers = []

    @classmethod
    def setUpClass(cls):
        try:
            cls.make_internet()
            os.environ["AIRLOCK_NET_DNS_UPSTREAM"] = DNS
            super().setUpClass()
        except BaseException:
            cls.remove_internet()
            raise

    @classmethod
    def tearDownClass(cls):
        try:
            super().tearDownClass()
        finally:
            os.environ.pop("AIRLOCK_NET_DNS_UPSTREAM", None)
            cls.remove_internet()

    @classmethod
    def make_internet(cls):
        sh("ip", "netns", "add", NS_H)
        sh("ip", "netns", "add", NS_I)
        for ns in (NS_H, NS_I):
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        # Created inside NS_H with its peer in NS_I: never in the host's namespace.
        sh("ip", "-n", NS_H, "link", "add", "vh", "type", "veth", "peer", "name", "vi", "netns", NS_I)
        sh("ip", "-n", NS_H, "addr", "add", "192.0.2.2/24", "dev", "vh")
        sh("ip", "-n", NS_H, "link", "set", "vh", "up")
        sh("ip", "-n", NS_H, "route", "add", "default", "via", "192.0.2.1")
        sh("ip", "-n", NS_I, "addr", "add", "192.0.2.1/24", "dev", "vi")
        for a in SERVERS + DECOYS + [DNS]:
            sh("ip", "-n", NS_I, "addr", "add", a + "/32", "dev", "vi")
        sh("ip", "-n", NS_I, "link", "set", "vi", "up")
        # slirp sends the guest's pings with unprivileged ICMP sockets (the
        # helper has no CAP_NET_RAW); this namespace's default forbids them.
        sh("ip", "netns", "exec", NS_H, "sysctl", "-qw", "net.ipv4.ping_group_range=0 2147483647")
        cls.querylog = f"/tmp/alit-dns-{PID}.log"
        open(cls.querylog, "w").close()
        zone = json.dumps({"a": ZONE})
        for ns, role in ((NS_I, "internet"), (NS_H, "loopback")):
            extra = [cls.querylog, zone, DNS] if role == "internet" else []
            if role == "internet":
                for a in ECHO:
                    extra += ["--echo", a]
            p = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, LITTLE_INTERNET, role]
                                 + extra,
                                 stdout=subprocess.PIPE, text=True)
            cls.servers.append(p)
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError(f"{role} servers did not start")

    @classmethod
    def remove_internet(cls):
        for p in cls.servers:
            p.kill()
            p.wait()
            p.stdout.close()
        cls.servers = []
        for ns in (NS_H, NS_I):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        if getattr(cls, "querylog", None) and os.path.exists(cls.querylog):
            os.unlink(cls.querylog)

    # ------------------------------------------------------------ helpers

    def run_in(self, sid, cmd, timeout=60):
        out, err, ex = self.api.exec(sid, cmd=cmd, timeout=timeout)
        return out.decode(errors="replace") + err.decode(errors="replace"), ex["exit_code"]

    def timed(self, sid, cmd):
        t0 = time.time()
        out, code = self.run_in(sid, cmd)
        return out, code, time.time() - t0

    def events(self, sid):
        return self.api.call("GET", f"/v1/sandboxes/{sid}/network/events")

    def flows(self, sid, dst, event="net_flow"):
        return [e for e in self.events(sid) if e["event"] == event and e.get("dst") == dst]

    def new(self, network):
        sb = self.api.create(image="minimal", timeout=600, network=network)
        self.addCleanup(self.cleanup, sb["id"])
        return sb["id"]

    def cleanup(self, sid):
        try:
            self.api.delete(sid)
        except ApiError:
            pass
        self.assertNothingLeft(sid)

    # ------------------------------------------------------------ tests

    def test_default_mode_has_no_interface(self):
        sid = self.new({"mode": "none"})
        out, code = self.run_in(sid, "ls /sys/class/net")
        self.assertEqual(out, "lo\n")
        with self.assertRaises(ApiError) as cm:
            self.api.call("PATCH", f"/v1/sandboxes/{sid}/network", {"mode": "open"})
        self.assertEqual(cm.exception.status, 409)

    def test_bad_policy_is_a_400_naming_the_entry(self):
        with self.assertRaises(ApiError) as cm:
            self.api.create(image="minimal", network={"mode": "allowlist",
                                                      "allow": ["198.51.100.10/32", "169.254.169.254"]})
        self.assertEqual(cm.exception.status, 400)
        self.assertEqual(cm.exception.field, "network.allow[1]")
        self.assertEqual(self.api.call("GET", "/v1/sandboxes"), [])

    def test_allowlist_cidr_and_names_runtime_change_and_journal(self):
        sid = self.new({"mode": "allowlist",
                        "allow": ["198.51.100.10/32", "www.example.com", "*.wild.example.org"]})
        out, _ = self.run_in(sid, "ls /sys/class/net; cat /etc/resolv.conf")
        self.assertEqual(out, "eth0\nlo\nnameserver 10.0.2.3\n")
        # The allowed /32: fetched.
        out, code = self.run_in(sid, "wget -q -O - http://198.51.100.10/")
        self.assertEqual((out, code), ("hello 198.51.100.10\n", 0))
        # Its neighbour (a real server is listening there): refused at once.
        out, code, took = self.timed(sid, "nc -w 20 198.51.100.11 80 </dev/null")
        self.assertNotEqual(code, 0, out)
        self.assertLess(took, 5, "a denied connection must be reset, not time out")
        self.assertIn("refused", out.lower())
        # The allowed name resolves through the test's DNS server and is fetched.
        out, code = self.run_in(sid, "wget -q -O - http://www.example.com/")
        self.assertEqual((out, code), ("hello 203.0.113.10\n", 0))
        # A sibling name: NXDOMAIN (never asked upstream), so nothing to fetch.
        out, code = self.run_in(sid, "nslookup mail.example.com")
        self.assertNotEqual(code, 0, out)
        self.assertNotIn("203.0.113.11", out)
        # Its address is not allowed either.
        out, code = self.run_in(sid, "nc -w 20 203.0.113.11 80 </dev/null")
        self.assertNotEqual(code, 0, out)

        # Wildcard: a subdomain matches, the apex does not.
        out, code = self.run_in(sid, "wget -q -O - http://x.wild.example.org/")
        self.assertEqual((out, code), ("hello 203.0.113.12\n", 0))
        out, code = self.run_in(sid, "nslookup wild.example.org")
        self.assertNotEqual(code, 0, out)
        # DNS exfiltration: random subdomains of a zone that is not allowed get
        # NXDOMAIN from the helper and never reach the upstream server.
        secrets = [f"s{os.urandom(6).hex()}.exfil.example.net" for _ in range(3)]
        for name in secrets:
            out, code = self.run_in(sid, f"nslookup {name}")
            self.assertNotEqual(code, 0, out)
        with open(self.querylog) as f:
            asked = f.read()
        self.assertIn("www.example.com", asked)  # the log works
        self.assertNotIn("exfil", asked)
        self.assertNotIn("mail.example.com", asked)
        recorded = {e["name"] for e in self.events(sid) if e["event"] == "net_dns" and not e["allowed"]}
        self.assertTrue(set(secrets) <= recorded, recorded)

        # Runtime change cuts an open connection: a held connection to the
        # /32 is reset in the guest when the /32 is removed from the policy.
        # (busybox nc itself only exits at stdin EOF, so the guest's TCP
        # state is what is checked.)
        result = {}

        def hold():
            result["out"], result["code"] = self.run_in(
                sid, "(printf 'GET / HTTP/1.0\\r\\n\\r\\n'; sleep 8) | nc 198.51.100.10 81")
        th = threading.Thread(target=hold)
        th.start()
        estab = "netstat -tn | grep '198.51.100.10:81 *ESTABLISHED' || true"
        deadline = time.time() + 20
        while time.time() < deadline and "ESTABLISHED" not in self.run_in(sid, estab)[0]:
            time.sleep(0.2)
        self.assertIn("ESTABLISHED", self.run_in(sid, estab)[0])
        r = self.api.call("PATCH", f"/v1/sandboxes/{sid}/network",
                          {"mode": "allowlist", "allow": ["www.example.com"]})
        self.assertEqual(r["policy"]["mode"], "allowlist")
        self.assertEqual(r["policy"]["allow"], ["www.example.com"])
        self.assertGreaterEqual(r["flows_cut"], 1)
        deadline = time.time() + 5
        while time.time() < deadline and "ESTABLISHED" in self.run_in(sid, estab)[0]:
            time.sleep(0.2)
        self.assertNotIn("ESTABLISHED", self.run_in(sid, estab)[0], "the held connection was not cut")
        snmp = self.run_in(sid, "grep Tcp: /proc/net/snmp")[0].splitlines()
        resets = dict(zip(snmp[0].split()[1:], snmp[1].split()[1:]))["EstabResets"]
        self.assertGreaterEqual(int(resets), 1, "the guest did not see a reset")
        th.join(timeout=30)
        self.assertIn("hello 198.51.100.10", result["out"])
        out, code = self.run_in(sid, "nc -w 20 198.51.100.10 80 </dev/null")
        self.assertNotEqual(code, 0, out)
        self.assertIn("refused", out.lower())
        # A bad runtime policy: 400 naming the entry, the old one stays.
        with self.assertRaises(ApiError) as cm:
            self.api.call("PATCH", f"/v1/sandboxes/{sid}/network",
                          {"mode": "allowlist", "allow": ["10.0.0.0/8"]})
        self.assertEqual((cm.exception.status, cm.exception.field), (400, "network.allow[0]"))

        # The journal: flows with their rule, bytes each way, DNS decisions.
        allowed = [f for f in self.flows(sid, "198.51.100.10", "net_flow_end") if f.get("port") == 80]
        self.assertTrue(allowed, self.events(sid))
        self.assertEqual(allowed[0]["rule"], "allow 198.51.100.10/32")
        self.assertGreater(allowed[0]["bytes_in"], 0)
        self.assertGreater(allowed[0]["bytes_out"], 0)
        cut = [f for f in self.flows(sid, "198.51.100.10", "net_flow_end") if f.get("port") == 81]
        self.assertTrue(cut and cut[0]["reason"] == "policy", cut)
        denied = self.flows(sid, "198.51.100.11")
        self.assertTrue(denied and not denied[0]["allowed"], denied)
        self.assertEqual(denied[0]["rule"], "default deny")
        named = [f for f in self.flows(sid, "203.0.113.10") if f["allowed"]]
        self.assertTrue(named and named[0]["name"] == "www.example.com", named)
        dns = [e for e in self.events(sid) if e["event"] == "net_dns" and e["name"] == "mail.example.com"]
        self.assertTrue(dns and not dns[0]["allowed"], dns)

    def test_wget_and_name_lookups_in_minimal(self):
        # Issue 9: busybox 1.35's wget segfaulted on -T (Debian builds it
        # without FEATURE_WGET_TIMEOUT); images/minimal.sh patches that.
        sid = self.new({"mode": "allowlist", "allow": ["www.example.com", "*.wild.example.org"]})
        for cmd in ["wget -q -O - http://www.example.com/", "wget -T 10 -q -O - http://www.example.com/",
                    "wget -T10 -O - http://x.wild.example.org/"]:
            out, err, ex = self.api.exec(sid, cmd=cmd, timeout=60)
            self.assertEqual((ex["exit_code"], ex["signal"]), (0, None), (cmd, ex, err))
            self.assertTrue(out.startswith(b"hello 203.0.113."), (cmd, out))
        out, code = self.run_in(sid, "nslookup www.example.com")
        self.assertEqual(code, 0, out)
        self.assertIn("203.0.113.10", out)
        # A name that does not resolve: a clean failure, no signal.
        for cmd in ["wget -T 5 -q -O - http://nosuch.example.com/", "wget -q -O - http://nosuch.example.com/"]:
            _, err, ex = self.api.exec(sid, cmd=cmd, timeout=60)
            self.assertNotEqual(ex["exit_code"], 0, (cmd, ex, err))
            self.assertLess(ex["exit_code"], 128, (cmd, ex, err))
            self.assertEqual((ex["signal"], ex["reason"]), (None, "exited"), (cmd, ex, err))
            self.assertIn(b"bad address", err, cmd)
        # No network at all: the same, no signal.
        sid3 = self.new({"mode": "none"})
        _, err, ex = self.api.exec(sid3, cmd="wget -T 3 -q -O - http://www.example.com/", timeout=60)
        self.assertNotEqual(ex["exit_code"], 0, (ex, err))
        self.assertEqual((ex["signal"], ex["reason"]), (None, "exited"), (ex, err))

    def test_open_mode_still_denies_internal_addresses(self):
        sid = self.new({"mode": "open"})
        out, code = self.run_in(sid, "wget -q -O - http://198.51.100.11/")
        self.assertEqual((out, code), ("hello 198.51.100.11\n", 0))
        # 10.0.2.2 is slirp's path to the host's loopback (where the decoy
        # listens); the metadata address and RFC 1918 exist in the test's
        # internet with servers behind them. All refused at once.
        for target in ["10.0.2.2", "169.254.169.254", "10.1.2.3"]:
            out, code, took = self.timed(sid, f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 20 {target} 80")
            self.assertNotEqual(code, 0, f"{target}: {out}")
            self.assertNotIn("REACHED", out)
            self.assertNotIn("hello", out)
            self.assertIn("refused", out.lower())
            self.assertLess(took, 5, target)
        for target in ["169.254.169.254", "10.1.2.3"]:
            f = self.flows(sid, target)
            self.assertTrue(f and not f[0]["allowed"], f"{target}: {self.events(sid)}")
            self.assertTrue(f[0]["rule"].startswith("always-deny"), f)


    def test_udp_icmp_ipv6_rebinding_and_spellings(self):
        sid = self.new({"mode": "allowlist",
                        "allow": ["198.51.100.10/32", "rebind.example.com", "lo.example.com"]})
        # UDP: the allowed address echoes (datagrams reach the guest's
        # socket), its neighbour (also echoing) is denied (none do).
        def udp_in():
            snmp = self.run_in(sid, "grep Udp: /proc/net/snmp")[0].splitlines()
            return int(dict(zip(snmp[0].split()[1:], snmp[1].split()[1:]))["InDatagrams"])
        before = udp_in()
        self.run_in(sid, "nslookup probe.test 198.51.100.10")
        self.assertGreaterEqual(udp_in() - before, 1, "the allowed UDP echo did not come back")
        before = udp_in()
        self.run_in(sid, "nslookup probe.test 198.51.100.11")
        self.assertEqual(udp_in() - before, 0, "a denied UDP destination answered")
        udp = [f for f in self.flows(sid, "198.51.100.11") if f["proto"] == "udp"]
        self.assertTrue(udp and not udp[0]["allowed"], self.events(sid))
        self.assertEqual(udp[0]["rule"], "default deny")
        ok = [f for f in self.flows(sid, "198.51.100.10") if f["proto"] == "udp"]
        self.assertTrue(ok and ok[0]["allowed"] and ok[0]["port"] == 53, ok)
        # ICMP: ping the allowed address, not its neighbour.
        out, code = self.run_in(sid, "ping -c 1 -W 5 198.51.100.10")
        self.assertEqual(code, 0, out)
        out, code = self.run_in(sid, "ping -c 1 -W 3 198.51.100.11")
        self.assertNotEqual(code, 0, out)
        icmp = [f for f in self.flows(sid, "198.51.100.11") if f["proto"] == "icmp"]
        self.assertTrue(icmp and not icmp[0]["allowed"], self.events(sid))
        self.assertTrue([f for f in self.flows(sid, "198.51.100.10") if f["proto"] == "icmp" and f["allowed"]])
        # An IPv6 literal the policy does not allow: refused, never connected.
        out, code, took = self.timed(sid, "nc -w 10 2001:db8::10 80 </dev/null")
        self.assertNotEqual(code, 0, out)
        self.assertLess(took, 5, out)
        if "fec0::15" in self.run_in(sid, "ip -6 addr show dev eth0 2>&1 || true")[0]:
            v6 = self.flows(sid, "2001:db8::10")
            self.assertTrue(v6 and not v6[0]["allowed"], self.events(sid))
        # DNS rebinding: allowed names answered with internal addresses get
        # no address, and the dropped answers are recorded.
        for name, bad in (("rebind.example.com", "10.1.2.3"), ("lo.example.com", "127.0.0.1")):
            out, _ = self.run_in(sid, f"nslookup {name}")
            self.assertNotIn(bad, out.split("Name:")[-1] if "Name:" in out else out)
            dns = [e for e in self.events(sid) if e["event"] == "net_dns" and e["name"] == name
                   and e.get("dropped")]
            self.assertTrue(dns, self.events(sid))
            self.assertEqual(dns[0]["dropped"][0]["ip"], bad)
            self.assertTrue(dns[0]["dropped"][0]["rule"].startswith("always-deny"), dns)
            self.assertEqual(dns[0]["answers"], [])
        # Other spellings of slirp's host address (10.0.2.2, the path to the
        # host's loopback) from inside the guest: canonicalised, denied.
        for spelling in ["167772674", "0x0a.0.0x2.2", "10.0.514"]:
            out, code, took = self.timed(sid, f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 10 {spelling} 80")
            self.assertNotEqual(code, 0, f"{spelling}: {out}")
            self.assertNotIn("REACHED", out)
            self.assertLess(took, 5, spelling)
        host = [f for f in self.flows(sid, "10.0.2.2") if f.get("port") == 80]
        self.assertGreaterEqual(len(host), 3, self.events(sid))
        self.assertTrue(all(not f["allowed"] and f["rule"].startswith("always-deny") for f in host), host)
        # The loopback spellings in a policy are refused, naming the entry.
        for spelling in ["0x7f.0.0.1", "2130706433", "127.1"]:
            with self.assertRaises(ApiError) as cm:
                self.api.create(image="minimal", network={"mode": "allowlist", "allow": [spelling]})
            self.assertEqual((cm.exception.status, cm.exception.field), (400, "network.allow[0]"), spelling)

    def connect_host_port(self, port, send=b""):
        """Connects to 127.0.0.1:port inside the daemon's namespace; returns what came back."""
        code = ("import socket,sys\n"
                f"s=socket.create_connection(('127.0.0.1',{port}),timeout=20)\n"
                f"s.sendall({send!r})\n"
                "s.shutdown(socket.SHUT_WR)\n"
                "d=b''\n"
                "while True:\n"
                "    c=s.recv(4096)\n"
                "    if not c: break\n"
                "    d+=c\n"
                "sys.stdout.write(d.decode())\n")
        return subprocess.run(["ip", "netns", "exec", NS_H, sys.executable, "-c", code],
                              capture_output=True, text=True, timeout=60)

    def test_port_forward_from_host_loopback(self):
        none = self.new({"mode": "none"})
        with self.assertRaises(ApiError) as cm:
            self.api.call("POST", f"/v1/sandboxes/{none}/ports", {"guest_port": 8080})
        self.assertEqual(cm.exception.status, 409)
        self.assertIn("none", str(cm.exception))

        sid = self.new({"mode": "allowlist"})
        self.assertEqual(self.api.call("GET", f"/v1/sandboxes/{sid}/ports"), [])
        with self.assertRaises(ApiError) as cm:
            self.api.call("POST", f"/v1/sandboxes/{sid}/ports", {"guest_port": 70000})
        self.assertEqual((cm.exception.status, cm.exception.field), (400, "guest_port"))
        # A one-shot listener in the guest (busybox nc), in an exec of its own
        # (an exec's background children end with it).
        listener = threading.Thread(target=self.run_in, args=(
            sid, "echo hello-from-guest | nc -l -p 8080 > /tmp/got"), daemon=True)
        listener.start()
        deadline = time.time() + 20
        while time.time() < deadline and ":8080" not in self.run_in(sid, "netstat -tln")[0]:
            time.sleep(0.2)
        fwd = self.api.call("POST", f"/v1/sandboxes/{sid}/ports", {"guest_port": 8080})
        self.assertEqual(fwd["host"], "127.0.0.1")
        self.assertEqual(fwd["guest_port"], 8080)
        hp = fwd["host_port"]
        self.assertGreaterEqual(hp, 1024)
        self.assertEqual(self.api.call("GET", f"/v1/sandboxes/{sid}/ports"), [fwd])
        with self.assertRaises(ApiError) as cm:  # the same guest port twice
            self.api.call("POST", f"/v1/sandboxes/{sid}/ports", {"guest_port": 8080})
        self.assertEqual(cm.exception.status, 409)
        r = self.connect_host_port(hp, b"hello-from-host\n")
        self.assertIn("hello-from-guest", r.stdout,
                      f"{r.stderr}\nguest: {self.run_in(sid, 'netstat -tln; cat /tmp/got')}\n"
                      f"events: {self.events(sid)}")
        listener.join(timeout=30)
        self.assertIn("hello-from-host", self.run_in(sid, "cat /tmp/got")[0])
        ev = self.events(sid)
        ports = [e for e in ev if e["event"] == "net_port"]
        self.assertEqual([(p["action"], p["host_port"], p["guest_port"]) for p in ports],
                         [("add", hp, 8080)])
        inbound = [e for e in ev if e["event"] == "net_flow" and e.get("direction") == "in"]
        self.assertTrue(inbound and inbound[-1]["allowed"] and inbound[-1]["port"] == 8080, ev)
        self.assertEqual(inbound[-1]["rule"], f"port 127.0.0.1:{hp}")
        # Removed: nothing listens on the host port any more.
        self.api.call("DELETE", f"/v1/sandboxes/{sid}/ports/{hp}")
        self.assertEqual(self.api.call("GET", f"/v1/sandboxes/{sid}/ports"), [])
        r = self.connect_host_port(hp)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("refused", r.stderr.lower())
        with self.assertRaises(ApiError) as cm:
            self.api.call("DELETE", f"/v1/sandboxes/{sid}/ports/{hp}")
        self.assertEqual(cm.exception.status, 404)
        self.assertEqual([e["action"] for e in self.events(sid) if e["event"] == "net_port"],
                         ["add", "remove"])

    def test_guest_dns_flood_is_bounded_and_counted(self):
        # Issue 9: every lookup used to be one journal record.
        sid = self.new({"mode": "allowlist", "allow": ["198.51.100.10/32"]})
        n = 300
        t0 = time.time()
        out, code = self.run_in(sid, f"i=0; while [ $i -lt {n} ]; do nslookup q$i.flood.example 10.0.2.3 "
                                     f">/dev/null 2>&1; i=$((i+1)); done; echo done", timeout=300)
        elapsed = time.time() - t0
        self.assertIn("done", out)
        self.api.delete(sid)  # the reader's last summary; the journal stays
        ev = self.events(sid)
        recorded = [e for e in ev if e["event"] == "net_dns" and e.get("name", "").endswith(".flood.example")]
        counted = 0
        for e in ev:
            if e["event"] == "net_suppressed":
                counted += e["counts"].get("net_dns_denied", 0) + e.get("helper_counts", {}).get("net_dns_denied", 0)
                self.assertEqual(e["invalid"], 0, e)
        # burst 100 + 10/s per kind (docs/network.md)
        self.assertLessEqual(len(recorded), 100 + 10 * (elapsed + 2), f"{elapsed:.1f} s")
        self.assertGreater(counted, 0)
        # Every question was either recorded or counted: busybox asks A and
        # AAAA once each (answered at once, so never retried).
        self.assertEqual(len(recorded) + counted, 2 * n)
        print(f"info: {n} guest lookups in {elapsed:.1f} s: {len(recorded)} records, {counted} counted",
              file=sys.stderr)

    def test_helper_is_confined_and_its_death_fails_the_sandbox(self):
        sid = self.new({"mode": "allowlist", "allow": ["198.51.100.10/32"]})
        run_dir = os.path.join(self.data_dir, "sandboxes", sid)
        pids = [p for p in subprocess.run(["pgrep", "-f", f"airlock-net .*{run_dir}/net-ctl.sock"],
                                          capture_output=True, text=True).stdout.split()]
        self.assertEqual(len(pids), 1, pids)
        pid = int(pids[0])
        # Its own user and mount namespaces, but the host's (here: the test
        # namespace's) network: it reached the test's internet above.
        ns = lambda p, kind: os.readlink(f"/proc/{p}/ns/{kind}")
        self.assertNotEqual(ns(pid, "user"), ns("self", "user"))
        self.assertNotEqual(ns(pid, "mnt"), ns("self", "mnt"))
        self.assertEqual(ns(pid, "net"), ns(self.daemon.pid, "net"))  # `ip netns exec` execs airlockd
        with open(f"/proc/{pid}/status") as f:
            status = f.read()
        self.assertIn("NoNewPrivs:\t1", status)
        self.assertIn("Seccomp:\t2", status)
        self.assertIn("CapEff:\t0000000000000000", status)
        # Issue 9: it cannot reach the journal: an empty root, no descriptor
        # of a host file or directory, its sockets only for the daemon's uid.
        self.assertEqual(os.listdir(f"/proc/{pid}/root"), [])
        fds = [os.readlink(f"/proc/{pid}/fd/{n}") for n in os.listdir(f"/proc/{pid}/fd")]
        host_files = [f for f in fds if f.split(":")[0] not in ("socket", "pipe", "anon_inode")
                      and f not in ("/dev/null", os.path.join(run_dir, "net.log"))]
        self.assertEqual(host_files, [], fds)
        self.assertFalse([f for f in fds if "audit" in f], fds)
        for name in ("net-ctl.sock", "net-events.sock"):
            self.assertEqual(os.stat(os.path.join(run_dir, name)).st_mode & 0o777, 0o600, name)
        out, code = self.run_in(sid, "wget -q -O - http://198.51.100.10/")
        self.assertEqual((out, code), ("hello 198.51.100.10\n", 0))

        os.kill(pid, 9)
        deadline = time.time() + 15
        # The failure passes through `stopping` while the VM is torn down.
        while time.time() < deadline and self.api.call("GET", f"/v1/sandboxes/{sid}")["state"] in (
                "running", "stopping"):
            time.sleep(0.2)
        sb = self.api.call("GET", f"/v1/sandboxes/{sid}")
        self.assertEqual((sb["state"], sb["reason"]), ("failed", "network helper died"))
        log = self.api.call("GET", f"/v1/sandboxes/{sid}/logs")
        self.assertTrue([e for e in log if e["event"] == "net_helper_died"], log)
        self.assertNothingLeft(sid)


if __name__ == "__main__":
    unittest.main()

#!/usr/bin/env python3
"""Namespace test of airlock-net: its own little internet, a synthetic guest.

Needs root (network namespaces); exits 77 (ctest: skipped) otherwise.

Topology, all of it inside two namespaces this test creates and always removes:
  alnet-h-PID  "the host": airlock-net runs here; veth 192.0.2.2/24,
               2001:db8:ff::2/64; a decoy HTTP server on 127.0.0.1:80.
  alnet-i-PID  "the internet": veth 192.0.2.1/24 + the documentation and
               decoy addresses the guest tries (198.51.100.10/.20,
               203.0.113.10/.11/.12/.53, 2001:db8:1::80 and, as decoys that
               must stay unreachable, 169.254.169.254, 10.1.2.3, 192.168.1.1).
               HTTP on :80 answers "hello <local address>", a hold-open server
               on :81, UDP echo on :7, DNS on 203.0.113.53:53 (logs queries).
Those addresses never exist in the host's own namespace.

The guest is this process: it speaks QEMU's -netdev stream protocol
(4-byte big-endian length + Ethernet frame) to the helper's socket and does
ARP/NDP, TCP handshakes, UDP, ICMP and DNS with raw crafted frames.
"""
import ipaddress
import json
import os
import queue
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

PID = os.getpid()
NS_H = f"alnet-h-{PID}"
NS_I = f"alnet-i-{PID}"
GUEST_MAC = bytes.fromhex("525400123456")
GUEST_IP = "10.0.2.15"
GUEST_IP6 = "fec0::15"
DNS_IP = "10.0.2.3"
INET_V4 = ["198.51.100.10", "198.51.100.20", "203.0.113.10", "203.0.113.11", "203.0.113.12",
           "203.0.113.53", "169.254.169.254", "10.1.2.3", "192.168.1.1"]
ZONE = {"www.example.com": "203.0.113.10", "mail.example.com": "203.0.113.11",
        "x.wild.example.org": "203.0.113.12", "rebind.example.com": "127.0.0.1",
        "meta.example.com": "169.254.169.254"}
ZONE6 = {"v6.example.com": "2001:db8:1::80"}


# ---------------------------------------------------------------- servers (in alnet-i)

def csum(data):
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def ip_packet(src, dst, proto, l4, csum_off, hops=64):
    s, d = ipaddress.ip_address(src), ipaddress.ip_address(dst)
    if s.version == 4:
        pseudo = s.packed + d.packed + struct.pack("!BBH", 0, proto, len(l4))
        if proto != 1:
            l4 = l4[:csum_off] + struct.pack("!H", csum(pseudo + l4)) + l4[csum_off + 2:]
        else:
            l4 = l4[:csum_off] + struct.pack("!H", csum(l4)) + l4[csum_off + 2:]
        hdr = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(l4), random.randint(0, 65535), 0x4000,
                          64, proto, 0, s.packed, d.packed)
        hdr = hdr[:10] + struct.pack("!H", csum(hdr)) + hdr[12:]
        return 0x0800, hdr + l4
    pseudo = s.packed + d.packed + struct.pack("!IxxxB", len(l4), proto)
    l4 = l4[:csum_off] + struct.pack("!H", csum(pseudo + l4)) + l4[csum_off + 2:]
    hdr = struct.pack("!IHBB16s16s", 0x60000000, len(l4), proto, hops, s.packed, d.packed)
    return 0x86DD, hdr + l4


class Guest:
    """A synthetic guest on the helper's QEMU socket."""

    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.gw_mac = bytes.fromhex("525500000000")
        self.frames = queue.Queue()
        self.lock = threading.Lock()
        self.closed = False
        threading.Thread(target=self._reader, daemon=True).start()

    def _reader(self):
        buf = b""
        while True:
            try:
                d = self.sock.recv(65536)
            except OSError:
                d = b""
            if not d:
                self.closed = True
                return
            buf += d
            while len(buf) >= 4:
                n = struct.unpack("!I", buf[:4])[0]
                if len(buf) < 4 + n:
                    break
                frame, buf = buf[4:4 + n], buf[4 + n:]
                self._on_frame(frame)

    def _on_frame(self, f):
        et = struct.unpack("!H", f[12:14])[0]
        if et == 0x0806 and struct.unpack("!H", f[20:22])[0] == 1 and f[38:42] == socket.inet_aton(GUEST_IP):
            # slirp asks for us: answer
            arp = struct.pack("!HHBBH6s4s6s4s", 1, 0x0800, 6, 4, 2, GUEST_MAC, f[38:42], f[22:28], f[28:32])
            self.send_raw(f[6:12] + GUEST_MAC + b"\x08\x06" + arp)
            return
        if et == 0x86DD and f[20] == 58 and f[54] == 135:  # NDP neighbour solicitation
            target = f[62:78]
            if target == socket.inet_pton(socket.AF_INET6, GUEST_IP6):
                na = struct.pack("!BBHI16sBB6s", 136, 0, 0, 0x60000000, target, 2, 1, GUEST_MAC)
                et2, pkt = ip_packet(GUEST_IP6, socket.inet_ntop(socket.AF_INET6, f[22:38]), 58, na, 2, hops=255)
                self.send_raw(f[6:12] + GUEST_MAC + struct.pack("!H", et2) + pkt)
            return
        self.frames.put(f)

    def send_raw(self, frame):
        with self.lock:
            self.sock.sendall(struct.pack("!I", len(frame)) + frame)

    def send_ip(self, src, dst, proto, l4, csum_off):
        et, pkt = ip_packet(src, dst, proto, l4, csum_off)
        self.send_raw(self.gw_mac + GUEST_MAC + struct.pack("!H", et) + pkt)

    def arp_gateway(self):
        arp = struct.pack("!HHBBH6s4s6s4s", 1, 0x0800, 6, 4, 1, GUEST_MAC, socket.inet_aton(GUEST_IP),
                          b"\0" * 6, socket.inet_aton("10.0.2.2"))
        self.send_raw(b"\xff" * 6 + GUEST_MAC + b"\x08\x06" + arp)
        f = self.wait(lambda f: f[12:14] == b"\x08\x06", 5)
        assert f, "no ARP reply from slirp"
        self.gw_mac = f[22:28]

    def wait(self, match, timeout):
        """The first frame for which match(frame) is true; others are dropped."""
        end = time.time() + timeout
        while time.time() < end:
            try:
                f = self.frames.get(timeout=max(0.01, end - time.time()))
            except queue.Empty:
                return None
            try:
                if match(f):
                    return f
            except (IndexError, struct.error):
                pass
        return None


def parse_ip(f):
    """(src, dst, proto, l4 bytes) of an IPv4/IPv6 frame, or None."""
    et = struct.unpack("!H", f[12:14])[0]
    if et == 0x0800:
        ihl = (f[14] & 0xF) * 4
        total = struct.unpack("!H", f[16:18])[0]
        return (socket.inet_ntoa(f[26:30]), socket.inet_ntoa(f[30:34]), f[23], f[14 + ihl:14 + total])
    if et == 0x86DD:
        plen = struct.unpack("!H", f[18:20])[0]
        return (socket.inet_ntop(socket.AF_INET6, f[22:38]), socket.inet_ntop(socket.AF_INET6, f[38:54]),
                f[20], f[54:54 + plen])
    return None


SYN, ACK, FIN, RST, PSH = 0x02, 0x10, 0x01, 0x04, 0x08


def tcp_seg(sport, dport, seq, ack, flags, payload=b""):
    return struct.pack("!HHIIBBHHH", sport, dport, seq, ack, 5 << 4, flags, 65535, 0, 0) + payload


class Tcp:
    ports = iter(range(40000, 65000))

    def __init__(self, g, dst, dport, src=GUEST_IP):
        self.g, self.dst, self.dport, self.src = g, dst, dport, src
        self.sport = next(Tcp.ports)
        self.seq = random.randint(0, 2 ** 31)
        self.ack = 0
        self.proto = 6

    def _match(self, f):
        p = parse_ip(f)
        if not p or p[2] != 6 or ipaddress.ip_address(p[0]) != ipaddress.ip_address(self.dst):
            return False
        sport, dport = struct.unpack("!HH", p[3][:4])
        return sport == self.dport and dport == self.sport

    def _send(self, flags, payload=b""):
        self.g.send_ip(self.src, self.dst, 6, tcp_seg(self.sport, self.dport, self.seq, self.ack, flags, payload), 16)

    def connect(self, timeout=5):
        """'ok', 'rst' (with the time it took) or 'timeout'."""
        t0 = time.time()
        self._send(SYN)
        f = self.g.wait(self._match, timeout)
        if not f:
            return "timeout", time.time() - t0
        l4 = parse_ip(f)[3]
        flags = l4[13]
        if flags & RST:
            return "rst", time.time() - t0
        if flags & (SYN | ACK) == SYN | ACK:
            self.seq += 1
            self.ack = (struct.unpack("!I", l4[4:8])[0] + 1) & 0xFFFFFFFF
            self._send(ACK)
            return "ok", time.time() - t0
        return "unexpected", time.time() - t0

    def request(self, data, timeout=5, until_close=True):
        """Sends data, collects the reply until FIN (or RST); returns (bytes, 'fin'|'rst'|'timeout')."""
        self._send(ACK | PSH, data)
        self.seq += len(data)
        out = b""
        end = time.time() + timeout
        while time.time() < end:
            f = self.g.wait(self._match, end - time.time())
            if not f:
                break
            l4 = parse_ip(f)[3]
            flags, doff = l4[13], (l4[12] >> 4) * 4
            if flags & RST:
                return out, "rst"
            payload = l4[doff:]
            seq = struct.unpack("!I", l4[4:8])[0]
            if payload and seq == self.ack:
                out += payload
                self.ack = (self.ack + len(payload)) & 0xFFFFFFFF
            if flags & FIN:
                self.ack = (self.ack + 1) & 0xFFFFFFFF
                self._send(ACK | FIN)
                self.seq += 1
                return out, "fin"
            if payload:
                self._send(ACK)
                if not until_close and out:
                    return out, "open"
        return out, "timeout"


def http_get(g, dst, port=80, src=GUEST_IP):
    c = Tcp(g, dst, port, src)
    state, took = c.connect()
    if state != "ok":
        return state, took, b""
    body, how = c.request(b"GET / HTTP/1.0\r\n\r\n")
    return "ok", took, body


def udp(g, dst, dport, payload, sport=None, timeout=3):
    sport = sport or next(Tcp.ports)
    g.send_ip(GUEST_IP, dst, 17, struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload, 6)

    def match(f):
        p = parse_ip(f)
        if not p:
            return False
        if p[2] == 17 and p[0] == dst and struct.unpack("!H", p[3][2:4])[0] == sport:
            return True
        # ICMP unreachable quoting our datagram
        return p[2] == 1 and p[3][0] == 3 and struct.unpack("!H", p[3][8 + 20:8 + 22])[0] == sport
    f = g.wait(match, timeout)
    if not f:
        return "timeout", None
    p = parse_ip(f)
    if p[2] == 1:
        return f"icmp {p[3][0]}/{p[3][1]}", None
    return "reply", p[3][8:]


def dns(g, name, qtype=1):
    qid = random.randint(0, 65535)
    q = struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    for label in name.rstrip(".").split("."):
        q += bytes([len(label)]) + label.encode()
    q += b"\0" + struct.pack("!HH", qtype, 1)
    state, r = udp(g, DNS_IP, 53, q)
    if state != "reply":
        return state, []
    rcode = r[3] & 0xF
    an = struct.unpack("!H", r[6:8])[0]
    off, addrs = len(q), []
    for _ in range(an):
        typ, _, _, rdlen = struct.unpack("!HHIH", r[off + 2:off + 12])
        rdata = r[off + 12:off + 12 + rdlen]
        addrs.append(socket.inet_ntop(socket.AF_INET if typ == 1 else socket.AF_INET6, rdata))
        off += 12 + rdlen
    return {0: "NOERROR", 3: "NXDOMAIN", 1: "FORMERR", 5: "REFUSED"}.get(rcode, str(rcode)), addrs


def ping(g, dst, timeout=3):
    ident = random.randint(1, 65535)
    g.send_ip(GUEST_IP, dst, 1, struct.pack("!BBHHH", 8, 0, 0, ident, 1) + b"airlock-ping", 2)

    def match(f):
        p = parse_ip(f)
        return p and p[2] == 1 and p[0] == dst and p[3][0] in (0, 3)
    f = g.wait(match, timeout)
    if not f:
        return "timeout"
    l4 = parse_ip(f)[3]
    return "reply" if l4[0] == 0 else f"unreachable {l4[0]}/{l4[1]}"


# ---------------------------------------------------------------- test driver

def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def sh(*args, check=True):
    return subprocess.run(list(args), check=check, capture_output=True, text=True)


def setup(tmp):
    sh("ip", "netns", "add", NS_H)
    sh("ip", "netns", "add", NS_I)
    for ns in (NS_H, NS_I):
        sh("ip", "-n", ns, "link", "set", "lo", "up")
    # Created inside NS_H with its peer inside NS_I: never in the host's namespace.
    sh("ip", "-n", NS_H, "link", "add", "vh", "type", "veth", "peer", "name", "vi", "netns", NS_I)
    sh("ip", "-n", NS_H, "addr", "add", "192.0.2.2/24", "dev", "vh")
    sh("ip", "-n", NS_H, "addr", "add", "2001:db8:ff::2/64", "dev", "vh", "nodad")
    sh("ip", "-n", NS_H, "link", "set", "vh", "up")
    sh("ip", "-n", NS_H, "route", "add", "default", "via", "192.0.2.1")
    sh("ip", "-n", NS_H, "-6", "route", "add", "default", "via", "2001:db8:ff::1")
    sh("ip", "-n", NS_I, "addr", "add", "192.0.2.1/24", "dev", "vi")
    sh("ip", "-n", NS_I, "addr", "add", "2001:db8:ff::1/64", "dev", "vi", "nodad")
    for a in INET_V4:
        sh("ip", "-n", NS_I, "addr", "add", a + "/32", "dev", "vi")
    sh("ip", "-n", NS_I, "addr", "add", "2001:db8:1::80/128", "dev", "vi", "nodad")
    sh("ip", "-n", NS_I, "link", "set", "vi", "up")
    # Lets slirp use unprivileged ICMP sockets for allowed pings.
    sh("ip", "netns", "exec", NS_H, "sysctl", "-qw", "net.ipv4.ping_group_range=0 2147483647", check=False)


def teardown():
    for ns in (NS_H, NS_I):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def start_bg(ns, *args):
    p = subprocess.Popen(["ip", "netns", "exec", ns, *args], stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    assert line.strip(), f"{args} did not start"
    return p


class Checks:
    def __init__(self):
        self.failed = []
        self.n = 0

    def __call__(self, ok, what):
        self.n += 1
        print(("PASS " if ok else "FAIL ") + what, flush=True)
        if not ok:
            self.failed.append(what)


def run(helper):
    tmp = tempfile.mkdtemp(prefix="airlock-netns-")
    procs = []
    setup(tmp)
    try:
        querylog = os.path.join(tmp, "queries.log")
        open(querylog, "w").close()
        little = os.path.join(os.path.dirname(os.path.abspath(__file__)), "little_internet.py")
        zone = json.dumps({"a": ZONE, "aaaa": ZONE6})
        procs.append(start_bg(NS_I, sys.executable, little, "internet", querylog, zone,
                              "203.0.113.53", "--v6", "--echo", "198.51.100.10",
                              "--echo", "198.51.100.20"))
        procs.append(start_bg(NS_H, sys.executable, little, "loopback"))
        sock, ctl, evsock = (os.path.join(tmp, n) for n in ("net.sock", "ctl.sock", "events.sock"))
        policy = {"mode": "allowlist",
                  "allow": ["198.51.100.0/28", "www.example.com", "*.wild.example.org",
                            "rebind.example.com", "v6.example.com", "2001:db8:1::/48"]}
        hp = subprocess.Popen(["ip", "netns", "exec", NS_H, helper, "--qemu-socket", sock,
                               "--control-socket", ctl, "--events-socket", evsock, "--max-flows", "256",
                               "--dns-upstream", "203.0.113.53", "--policy", json.dumps(policy)],
                              stdout=subprocess.PIPE, text=True)
        procs.append(hp)
        ready = json.loads(hp.stdout.readline())
        helper_pid = ready["pid"]
        check = Checks()
        # The helper's reports, as the daemon reads them (raw: the daemon's
        # checks are unit-tested, net/intake_test.cc).
        reports, reports_lock = [], threading.Lock()

        def read_reports():
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.connect(evsock)
            buf = b""
            while True:
                d = c.recv(65536)
                if not d:
                    return
                buf += d
                *lines, buf = buf.split(b"\n")
                with reports_lock:
                    reports.extend(json.loads(x) for x in lines if x.strip())
        threading.Thread(target=read_reports, daemon=True).start()
        check(oct(os.stat(evsock).st_mode & 0o777) == "0o600" and oct(os.stat(ctl).st_mode & 0o777) == "0o600",
              "event and control sockets are 0600")
        check(ready.get("confined", {}).get("empty_root") is True and os.listdir(f"/proc/{helper_pid}/root") == [],
              f"helper's root is empty ({ready.get('confined')})")
        g = Guest(sock)
        g.arp_gateway()
        # Once QEMU (here: us) is connected the helper is locked down.
        time.sleep(0.2)
        status = open(f"/proc/{helper_pid}/status").read()
        check("Seccomp:\t2" in status and "NoNewPrivs:\t1" in status
              and "CapEff:\t0000000000000000" in status,
              "helper runs with seccomp filter, no_new_privs, no capabilities")
        check(not os.path.exists(sock), "QEMU socket removed after the one connection")
        fds = [os.readlink(f"/proc/{helper_pid}/fd/{n}") for n in os.listdir(f"/proc/{helper_pid}/fd")]
        check(all(f.split(":")[0] in ("socket", "pipe", "anon_inode") or f == "/dev/null" for f in fds),
              f"helper holds no file or directory of the host ({fds})")

        def control(req):
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.connect(ctl)
            c.sendall((json.dumps(req) + "\n").encode())
            buf = b""
            while not buf.endswith(b"\n"):
                buf += c.recv(65536)
            c.close()
            return json.loads(buf)

        def evs():
            time.sleep(0.05)  # the reports travel on a socket
            with reports_lock:
                return list(reports)

        # allowed CIDR reachable, its neighbour not (though a server listens there)
        st, _, body = http_get(g, "198.51.100.10")
        check(st == "ok" and b"hello 198.51.100.10" in body, f"allowed CIDR reachable ({st} {body!r})")
        st, took, _ = http_get(g, "198.51.100.20")
        check(st == "rst" and took < 1, f"neighbour outside the CIDR reset ({st}, {took * 1000:.0f} ms)")

        # domain allowed, sibling denied
        rc, addrs = dns(g, "www.example.com")
        check(rc == "NOERROR" and addrs == ["203.0.113.10"], f"allowed name resolves ({rc} {addrs})")
        st, _, body = http_get(g, "203.0.113.10")
        check(st == "ok" and b"hello 203.0.113.10" in body, f"pinned address reachable ({st})")
        rc, addrs = dns(g, "mail.example.com")
        check(rc == "NXDOMAIN", f"sibling name NXDOMAIN ({rc})")
        st, _, _ = http_get(g, "203.0.113.11")
        check(st == "rst", f"sibling's address reset ({st})")
        # wildcard
        rc, addrs = dns(g, "X.Wild.Example.Org.")
        check(rc == "NOERROR" and addrs == ["203.0.113.12"], f"wildcard name resolves ({rc} {addrs})")
        st, _, body = http_get(g, "203.0.113.12")
        check(st == "ok" and b"hello 203.0.113.12" in body, f"wildcard pinned address reachable ({st})")
        rc, _ = dns(g, "wild.example.org")
        check(rc == "NXDOMAIN", f"wildcard does not match its apex ({rc})")
        # rebinding
        rc, addrs = dns(g, "rebind.example.com")
        check(rc == "NOERROR" and addrs == [], f"rebinding answer dropped ({rc} {addrs})")
        rebind = [e for e in evs() if e.get("event") == "net_dns" and e.get("name") == "rebind.example.com"]
        check(rebind and rebind[-1].get("dropped", [{}])[0].get("ip") == "127.0.0.1",
              "rebinding drop recorded")
        # IP literal spellings never act as names
        for spelled in ("2130706433", "0x7f.0.0.1", "127.1"):
            rc, _ = dns(g, spelled)
            check(rc == "NXDOMAIN", f"DNS name {spelled} is an IP literal: NXDOMAIN ({rc})")
        r = control({"policy": {"mode": "allowlist", "allow": ["198.51.100.0/28", "0x7f.0.0.1"]}})
        check(r.get("error", {}).get("field") == "network.allow[1]" and "127.0.0.0/8" in r["error"]["message"],
              f"allowing 0x7f.0.0.1 rejected naming the entry ({r})")
        r = control({"policy": {"mode": "allowlist", "allow": ["2130706433"]}})
        check(r.get("error", {}).get("field") == "network.allow[0]", "allowing 2130706433 rejected")
        # UDP and ICMP
        st, data = udp(g, "198.51.100.10", 7, b"ping-udp")
        check(st == "reply" and data == b"ping-udp", f"allowed UDP echoed ({st})")
        st, _ = udp(g, "198.51.100.20", 7, b"ping-udp")
        check(st == "icmp 3/13", f"denied UDP gets ICMP admin-prohibited ({st})")
        # DHCP's port pair to anything but slirp itself is an ordinary flow
        for dst in ("10.1.2.3", "198.51.100.20"):
            st, _ = udp(g, dst, 67, b"\x01" * 240, sport=68)
            check(st == "icmp 3/13", f"UDP 68->67 to {dst} decided by policy: denied ({st})")
        st = ping(g, "198.51.100.20")
        check(st == "unreachable 3/13", f"denied ping gets ICMP admin-prohibited ({st})")
        st = ping(g, "198.51.100.10")
        print(f"info: allowed ping: {st} (needs ICMP sockets for slirp)")
        # IPv6 literals
        for dst in ("::1", "fd00::1", "fe80::1", "fec0::2"):
            c = Tcp(g, dst, 80, src=GUEST_IP6)
            st, _ = c.connect()
            check(st == "rst", f"IPv6 {dst} reset ({st})")
        st, _, body = http_get(g, "2001:db8:1::80", src=GUEST_IP6)
        check(st == "ok" and b"hello 2001:db8:1::80" in body, f"allowed IPv6 CIDR reachable ({st} {body!r})")
        # DNS exfiltration: random subdomains of a zone that is not allowed
        secrets = [f"{random.getrandbits(48):012x}.exfil.example.net" for _ in range(5)]
        rcs = {dns(g, s)[0] for s in secrets}
        check(rcs == {"NXDOMAIN"}, f"exfiltration queries NXDOMAIN ({rcs})")
        logged = {e.get("name") for e in evs() if e.get("event") == "net_dns"}
        check(all(s in logged for s in secrets), "exfiltration queries recorded")
        upstream = open(querylog).read()
        check(not any(s in upstream for s in secrets), "exfiltration queries never reached upstream DNS")

        # runtime policy change cuts an open connection
        c = Tcp(g, "198.51.100.10", 81)
        st, _ = c.connect()
        body, how = c.request(b"GET / HTTP/1.0\r\n\r\n", until_close=False)
        check(st == "ok" and how == "open", f"held connection open ({st} {how})")
        r = control({"policy": {"mode": "allowlist", "allow": ["www.example.com"]}})
        check(r.get("ok") and r.get("flows_cut", 0) >= 1, f"policy update accepted, flows cut ({r})")
        f = g.wait(c._match, 3)
        check(f is not None and parse_ip(f)[3][13] & RST, "open connection reset by the policy change")
        ends = [e for e in evs() if e.get("event") == "net_flow_end" and e.get("reason") == "policy"]
        check(any(e.get("port") == 81 for e in ends), "cut recorded with reason policy")

        # open mode: internal addresses still denied (decoys listen on all of them)
        r = control({"policy": {"mode": "open"}})
        check(r.get("ok"), "switched to open mode")
        for dst in ("169.254.169.254", "127.0.0.1", "10.0.2.2", "10.1.2.3", "192.168.1.1", "192.0.2.2"):
            st, took, body = http_get(g, dst)
            check(st == "rst", f"open mode: {dst} reset ({st}, {took * 1000:.0f} ms)")
        rc, addrs = dns(g, "meta.example.com")
        check(addrs == [], f"open mode: name pointing at metadata dropped ({rc} {addrs})")
        st, _, body = http_get(g, "198.51.100.20")
        check(st == "ok", f"open mode: public address reachable ({st})")

        # allowed flows are recorded with bytes each way and duration at close
        done = [e for e in evs() if e.get("event") == "net_flow_end" and e.get("reason") == "fin"]
        check(any(e["bytes_in"] > 0 and e["bytes_out"] > 0 and "duration_ms" in e for e in done),
              "closed flows recorded with bytes and duration")
        denied = [e for e in evs() if e.get("event") == "net_flow" and not e["allowed"]]
        check(any(e["dst"] == "169.254.169.254" and e["rule"] == "always-deny 169.254.0.0/16" for e in denied),
              "metadata attempt recorded with its rule")

        # flood of SYNs and malformed frames: bounded, still serving
        r = control({"policy": {"mode": "allowlist", "allow": ["198.51.100.0/28"]}})
        rss_before = rss_kib(helper_pid)
        t0 = time.time()
        for i in range(3000):
            g.send_ip(GUEST_IP, "198.51.100.10", 6, tcp_seg(1024 + i % 60000, 80, i, 0, SYN), 16)
        for i in range(2000):
            junk = os.urandom(random.randint(1, 200))
            g.send_raw(g.gw_mac + GUEST_MAC + random.choice([b"\x08\x00", b"\x86\xdd", b"\x08\x06"]) + junk)
        flood_s = time.time() - t0
        stats = control({"stats": True})
        check(stats.get("ok") and stats["stats"]["flows"] <= 64 + 10, f"flow table bounded ({stats.get('stats', {}).get('flows')})")
        rss = rss_kib(helper_pid)
        # slirp keeps ~400 KiB per connection; max_pending_tcp (64) bounds a SYN flood.
        check(0 < rss < 64 * 1024,
              f"helper memory bounded after 3000 SYNs + 2000 junk frames in {flood_s:.1f} s "
              f"(RSS {rss_before} -> {rss} KiB)")
        rc, _ = dns(g, "still.alive.example")
        check(rc == "NXDOMAIN", "helper still answers after the flood")
        full = [e for e in evs() if e.get("rule") in ("flow table full", "too many pending connections")
                or e.get("event") == "net_suppressed"]
        check(bool(full), "flood recorded (flow table full / suppressed)")
        check(evs() and not any("ts" in e or "sandbox" in e for e in evs()),
              f"{len(evs())} reports, none with its own ts/sandbox (the daemon stamps them)")

        # the helper exits when QEMU's side closes
        g.sock.close()
        try:
            code = hp.wait(timeout=10)
        except subprocess.TimeoutExpired:
            code = None
        check(code == 0, f"helper exits 0 when the guest connection closes ({code})")
        time.sleep(0.3)
        ends = [e for e in evs() if e.get("reason") == "helper exit"]
        print(f"info: {len(evs())} events recorded, {len(ends)} flows closed at exit")
        print(f"{check.n - len(check.failed)}/{check.n} checks passed")
        return 1 if check.failed else 0
    finally:
        for p in procs:
            try:
                p.kill()
                p.wait(timeout=5)
            except Exception:
                pass
        teardown()
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    helper = None
    if "--helper" in sys.argv:
        helper = sys.argv[sys.argv.index("--helper") + 1]
    if os.geteuid() != 0:
        print("SKIP: the namespace test needs root (ip netns add)")
        return 77
    if subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        print("SKIP: network namespaces unavailable (ip netns)")
        return 77
    if not helper or not os.access(helper, os.X_OK):
        print("FAIL: --helper PATH to airlock-net is required")
        return 1
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # finally: still removes the namespaces
    return run(helper)


if __name__ == "__main__":
    sys.exit(main())

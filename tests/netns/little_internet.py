#!/usr/bin/env python3
"""The servers of the tests' own small internet; run INSIDE a network
namespace the test created (`ip netns exec NS python3 little_internet.py ...`),
never in the host's namespace. Prints "ready" once listening, then serves
until killed.

  internet QUERYLOG ZONE_JSON DNS_ADDR [--v6] [--echo ADDR]...
      HTTP on :80 ("hello <local address>"), a hold-open HTTP server on :81
      (keeps the connection until the peer goes away), a DNS server on
      DNS_ADDR:53 answering A (and AAAA) from ZONE_JSON
      ({"a": {name: ip}, "aaaa": {name: ip}}), NXDOMAIN otherwise, logging
      every question to QUERYLOG; optional UDP echo on ADDR:7 (or ADDR:PORT).
  loopback
      A decoy HTTP server on 127.0.0.1:80 that must never be reached.
"""

import json
import socket
import struct
import sys
import threading
import time


def _handle(c, hold):
    try:
        c.settimeout(60)
        c.recv(4096)
        body = f"hello {c.getsockname()[0]}\n".encode()
        c.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        if hold:
            while c.recv(4096):  # until the peer goes away
                pass
    except OSError:
        pass
    c.close()


def _http(family, addr, port, hold):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    s.bind((addr, port))
    s.listen(512)
    while True:
        c, _ = s.accept()
        threading.Thread(target=_handle, args=(c, hold), daemon=True).start()


def _echo(addr):
    # Bound to the address, so replies come from the address the guest asked.
    # "ADDR" = port 7, "ADDR:PORT" another port (e.g. 53, for a guest whose
    # only UDP client is nslookup).
    host, _, port = addr.partition(":")
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((host, int(port or 7)))
    while True:
        d, a = s.recvfrom(2048)
        s.sendto(d, a)


def _dns(addr, zone_a, zone_aaaa, querylog):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((addr, 53))
    log = open(querylog, "a", buffering=1)
    while True:
        d, a = s.recvfrom(2048)
        try:
            qid = struct.unpack("!H", d[:2])[0]
            off, labels = 12, []
            while d[off]:
                labels.append(d[off + 1:off + 1 + d[off]].decode())
                off += 1 + d[off]
            qtype = struct.unpack("!H", d[off + 1:off + 3])[0]
            name = ".".join(labels).lower()
            log.write(name + "\n")
            table = zone_a if qtype == 1 else zone_aaaa if qtype == 28 else {}
            answers = b""
            if name in table:
                fam = socket.AF_INET if qtype == 1 else socket.AF_INET6
                rdata = socket.inet_pton(fam, table[name])
                answers = struct.pack("!HHHIH", 0xC00C, qtype, 1, 30, len(rdata)) + rdata
            rcode = 0 if name in zone_a or name in zone_aaaa else 3
            hdr = struct.pack("!HHHHHH", qid, 0x8180 | rcode, 1, 1 if answers else 0, 0, 0)
            s.sendto(hdr + d[12:off + 5] + answers, a)
        except (IndexError, struct.error, UnicodeDecodeError):
            pass


def serve_internet(querylog, zone, dns_addr, v6=False, echo=()):
    targets = [(_http, (socket.AF_INET, "0.0.0.0", 80, False)),
               (_http, (socket.AF_INET, "0.0.0.0", 81, True)),
               (_dns, (dns_addr, zone.get("a", {}), zone.get("aaaa", {}), querylog))]
    if v6:
        targets.append((_http, (socket.AF_INET6, "::", 80, False)))
    targets += [(_echo, (addr,)) for addr in echo]
    for fn, args in targets:
        threading.Thread(target=fn, args=args, daemon=True).start()
    print("ready", flush=True)
    while True:
        time.sleep(3600)


def serve_loopback():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 80))
    s.listen(64)
    print("ready", flush=True)
    while True:
        c, _ = s.accept()
        c.sendall(b"HTTP/1.0 200 OK\r\n\r\nLOOPBACK REACHED\n")
        c.close()


def main(argv):
    if argv[:1] == ["loopback"]:
        serve_loopback()
    elif argv[:1] == ["internet"] and len(argv) >= 4:
        echo = [argv[i + 1] for i, a in enumerate(argv) if a == "--echo"]
        serve_internet(argv[1], json.loads(argv[2]), argv[3], v6="--v6" in argv, echo=echo)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])

#!/usr/bin/env python3
"""Python SDK overhead per exec, against raw HTTP over the same socket.

Starts its own airlockd (temp data dir, shared image dir), creates one
sandbox and, in one run, times alternately:

  sdk   Sandbox.exec("true"): the SDK's request building, pooled keep-alive
        connection, NDJSON parsing and ExecResult.
  raw   the same POST /v1/sandboxes/{id}/exec written by hand with
        http.client on one kept-alive unix-socket connection, reading the
        NDJSON lines until the exit event.

Both pay the same daemon + guest round trip, so the difference of the medians
is what the SDK adds; the client's own CPU time per exec (process_time) is
reported too, as it is free of the round trip's noise. Interleaving the two (sdk, raw, sdk, raw, ...) keeps
load changes on the host from favouring either.

Usage: AIRLOCK_IMAGE_DIR=... python3 bench/sdk_overhead.py [--execs 200]
"""

import argparse
import http.client
import json
import os
import socket
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
sys.path.insert(0, os.path.join(HERE, "..", "sdk", "python"))
import harness  # noqa: E402

import airlock  # noqa: E402


class Unix(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=60)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(self.path)


def raw_exec(conn, sid, body):
    conn.request("POST", f"/v1/sandboxes/{sid}/exec", body=body,
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    exit_event = None
    for line in resp:
        ev = json.loads(line)
        if ev["type"] == "exit":
            exit_event = ev
    assert exit_event and exit_event["exit_code"] == 0, exit_event
    return exit_event


def pct(values, p):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--execs", type=int, default=200)
    args = ap.parse_args()
    harness.DaemonTestCase.setUpClass()
    try:
        client = airlock.Client(socket=harness.DaemonTestCase.sock)
        sb = airlock.Sandbox.create(image="minimal", client=client)
        conn = Unix(harness.DaemonTestCase.sock)
        body = json.dumps({"argv": ["true"]})
        for _ in range(5):  # warm both paths (guest page cache, connections)
            sb.exec("true")
            raw_exec(conn, sb.id, body)
        sdk, raw, sdk_cpu, raw_cpu = [], [], [], []
        for _ in range(args.execs):
            t, c = time.perf_counter(), time.process_time()
            r = sb.exec("true")
            sdk.append((time.perf_counter() - t) * 1000)
            sdk_cpu.append((time.process_time() - c) * 1000)
            assert r.exit_code == 0, r
            t, c = time.perf_counter(), time.process_time()
            raw_exec(conn, sb.id, body)
            raw.append((time.perf_counter() - t) * 1000)
            raw_cpu.append((time.process_time() - c) * 1000)
        conn.close()
        sb.destroy()
        ms, mr = statistics.median(sdk), statistics.median(raw)
        print(f"accel: {sb.info.get('accel', '?')}, execs: {args.execs} each, interleaved")
        print(f"sdk  exec `true`: p50 {ms:7.2f} ms  p90 {pct(sdk, 90):7.2f} ms")
        print(f"raw  exec `true`: p50 {mr:7.2f} ms  p90 {pct(raw, 90):7.2f} ms")
        print(f"SDK overhead per exec: {ms - mr:+.2f} ms (median), ratio {ms / mr:.3f}x")
        # Client CPU per exec: what the SDK itself costs, free of the noise of
        # the guest round trip (both wait on the same daemon).
        cs, cr = statistics.median(sdk_cpu), statistics.median(raw_cpu)
        print(f"client CPU per exec: sdk {cs:.3f} ms, raw {cr:.3f} ms, "
              f"SDK adds {cs - cr:+.3f} ms ({cs / cr:.2f}x)")
    finally:
        harness.DaemonTestCase.tearDownClass()


if __name__ == "__main__":
    main()

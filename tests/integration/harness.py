"""Integration-test harness: a real airlockd on a real unix socket.

Each test class gets its own daemon with a fresh data directory (so registry,
audit and sandboxes are private) and the shared, input-keyed image directory
from AIRLOCK_IMAGE_DIR (built by `make image`). Only the standard library is
used; traffic goes over the daemon's unix socket, nothing else.
"""

import base64
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import unittest

import openapi_check

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("AIRLOCK_BIN", os.path.join(ROOT, "build", "bin"))
IMAGE_DIR = os.environ.get("AIRLOCK_IMAGE_DIR", os.path.join(ROOT, "build", "guest-images"))


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout=300):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self.unix_path)
        self.sock = s


class ApiError(Exception):
    def __init__(self, status, body):
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body
        err = body.get("error", {}) if isinstance(body, dict) else {}
        self.code = err.get("code")
        self.field = err.get("field")
        self.message = err.get("message")


class Client:
    def __init__(self, sock_path):
        self.sock_path = sock_path
        self.headers = {}  # sent with every request (TcpClient: the token)

    def connection(self, timeout):
        return UnixHTTPConnection(self.sock_path, timeout=timeout)

    def raw(self, method, path, body=None, headers=None, timeout=300):
        conn = self.connection(timeout)
        try:
            conn.request(method, path, body=body, headers={**self.headers, **(headers or {})})
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        observe(method, path, resp.status, resp.getheader("Content-Type"), data)
        return resp.status, resp.getheaders(), data

    def call(self, method, path, body=None, timeout=300):
        payload = None if body is None else (body if isinstance(body, (bytes, str)) else json.dumps(body))
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        status, _, data = self.raw(method, path, payload, headers, timeout)
        try:
            parsed = json.loads(data) if data else None
        except ValueError:
            parsed = data
        if status >= 400:
            raise ApiError(status, parsed)
        return parsed

    def create(self, **spec):
        spec.setdefault("image", "minimal")
        return self.call("POST", "/v1/sandboxes", spec)

    def delete(self, sid, wait=True):
        """DELETE answers once the sandbox is out of service, its teardown going on in the
        background; with ?wait=true (the suites' default: they check the host and the
        journal right after) once its VM and files are gone and its journal's `deleted`
        record is written. wait=False is the daemon's plain DELETE."""
        return self.call("DELETE", f"/v1/sandboxes/{sid}" + ("?wait=true" if wait else ""))

    def exec_events(self, sid, http_timeout=300, **req):
        """Runs an exec and returns the list of NDJSON events, in order."""
        conn = self.connection(http_timeout)
        conn.request("POST", f"/v1/sandboxes/{sid}/exec", body=json.dumps(req),
                     headers={**self.headers, "Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status >= 400:
            body = resp.read()
            conn.close()
            observe("POST", f"/v1/sandboxes/{sid}/exec", resp.status,
                    resp.getheader("Content-Type"), body)
            raise ApiError(resp.status, json.loads(body))
        events = []
        for line in resp:
            line = line.strip()
            if line:
                events.append(json.loads(line))
        conn.close()
        openapi_check.observe("POST", f"/v1/sandboxes/{sid}/exec", resp.status,
                              resp.getheader("Content-Type"), events)
        return events

    def exec(self, sid, **req):
        """Runs an exec; returns (stdout bytes, stderr bytes, exit event)."""
        out, err, exit_event = bytearray(), bytearray(), None
        for ev in self.exec_events(sid, **req):
            if ev["type"] == "stdout":
                out += base64.b64decode(ev["data"])
            elif ev["type"] == "stderr":
                err += base64.b64decode(ev["data"])
            elif ev["type"] == "exit":
                exit_event = ev
            elif ev["type"] == "error":
                raise ApiError(500, ev)
        return bytes(out), bytes(err), exit_event

    def put_file(self, sid, path, data, mode=None):
        q = f"path={path}" + (f"&mode={mode}" if mode else "")
        status, _, body = self.raw("PUT", f"/v1/sandboxes/{sid}/files?{q}", data,
                                   {"Content-Type": "application/octet-stream"})
        if status >= 400:
            raise ApiError(status, json.loads(body))
        return json.loads(body) if body else None

    def get_file(self, sid, path):
        status, _, body = self.raw("GET", f"/v1/sandboxes/{sid}/files?path={path}")
        if status >= 400:
            raise ApiError(status, json.loads(body))
        return body


class TcpClient(Client):
    """The same API over airlockd's TCP listener (--listen), with a token
    (Authorization: Bearer) and, for TLS, an ssl.SSLContext."""

    def __init__(self, host, port, token=None, ssl_context=None, source=None):
        super().__init__(None)
        self.host, self.port, self.ssl_context = host, port, ssl_context
        self.source = (source, 0) if source else None  # e.g. "127.0.0.2": another peer address
        if token:
            self.headers = {"Authorization": f"Bearer {token}"}

    def connection(self, timeout):
        if self.ssl_context is not None:
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout,
                                               context=self.ssl_context, source_address=self.source)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout,
                                          source_address=self.source)


def free_port():
    """A TCP port on 127.0.0.1 nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def observe(method, path, status, content_type, data):
    """Hands a response to openapi_check (record + live check against the
    spec), parsed the way its content type says."""
    media = (content_type or "").split(";")[0].strip()
    body = data
    try:
        if not data:
            body = None
        elif media == "application/json":
            body = json.loads(data)
        elif media == "application/x-ndjson":
            body = [json.loads(line) for line in data.splitlines() if line.strip()]
    except ValueError:
        body = data  # not parseable: left to the test that reads it
    openapi_check.observe(method, path, status, content_type, body)


def pids_mentioning(marker):
    """PIDs of live (non-zombie) processes whose command line mentions `marker`."""
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().decode(errors="replace")
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker in cmd and state != "Z":
            pids.append(int(pid))
    return pids


def qemu_pids_for(marker):
    """PIDs of live QEMU processes whose command line mentions `marker`."""
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().decode(errors="replace")
        except OSError:
            continue
        if "qemu-system" in cmd and marker in cmd:
            pids.append(int(pid))
    return pids


def cgroup_dirs_for(sid):
    """Cgroup directories of sandbox `sid` (the QEMU jail's: <hierarchy>/.../airlock/<sid>)."""
    found = []
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return found
    for line in lines:
        pre, _, post = line.partition(" - ")
        if post.split(" ")[:1] not in (["cgroup"], ["cgroup2"]):
            continue
        for base, dirs, _ in os.walk(pre.split(" ")[4]):
            if os.path.basename(base) == "airlock" and sid in dirs:
                found.append(os.path.join(base, sid))
    return found


class DaemonTestCase(unittest.TestCase):
    """Starts one airlockd per test class; checks nothing is left behind."""

    daemon_args = []
    daemon_prefix = []  # e.g. ["ip", "netns", "exec", NS]: run the daemon in a namespace

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="airlock-it-")
        cls.data_dir = os.path.join(cls.tmp, "data")
        cls.sock = os.path.join(cls.tmp, "airlockd.sock")
        cls.log = open(os.path.join(cls.tmp, "airlockd.log"), "wb")
        cls.start_daemon()

    @classmethod
    def start_daemon(cls):
        """Starts airlockd on the class's data dir and socket (again after a kill: re-adoption)."""
        cls.daemon = subprocess.Popen(
            cls.daemon_prefix + [os.path.join(BIN, "airlockd"), "--data-dir", cls.data_dir, "--socket", cls.sock,
             "--image-dir", IMAGE_DIR,
             # Template RAM files stay inside the test's temp dir (not /dev/shm).
             "--template-ram-dir", os.path.join(cls.tmp, "template-ram"),
             # No learned pool: suites count what runs and how creates start.
             # A suite's own daemon_args come after and win (test_pool's learning).
             "--pool-learn", "0"] + cls.daemon_args,
            stdout=cls.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while time.time() < deadline:
            if os.path.exists(cls.sock):
                try:
                    Client(cls.sock).call("GET", "/v1/info", timeout=5)
                    break
                except (OSError, ApiError):
                    pass
            if cls.daemon.poll() is not None:
                raise RuntimeError("airlockd exited: " + cls.daemon_log())
            time.sleep(0.1)
        else:
            raise RuntimeError("airlockd did not answer: " + cls.daemon_log())
        cls.api = Client(cls.sock)

    @classmethod
    def daemon_log(cls):
        cls.log.flush()
        with open(os.path.join(cls.tmp, "airlockd.log"), "rb") as f:
            return f.read().decode(errors="replace")[-4000:]

    @classmethod
    def tearDownClass(cls):
        # Delete whatever a failed test left, then stop the daemon.
        try:
            for sb in cls.api.call("GET", "/v1/sandboxes"):
                try:
                    cls.api.delete(sb["id"])
                except ApiError:
                    pass
        except (OSError, ApiError):
            pass
        cls.daemon.send_signal(signal.SIGTERM)
        try:
            cls.daemon.wait(timeout=20)
        except subprocess.TimeoutExpired:
            cls.daemon.kill()
        cls.log.close()
        for pid in qemu_pids_for(cls.data_dir):  # never leak a VM, even on failure
            os.kill(pid, signal.SIGKILL)
        for pid in pids_mentioning(cls.data_dir):  # nor a network helper
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def assertNothingLeft(self, sid):
        """No QEMU, helper process, socket, overlay or temp file of sandbox `sid` remains."""
        self.assertEqual(leftovers_of(self.data_dir, sid), [])


class TcpDaemonTestCase(DaemonTestCase):
    """A daemon that also listens on TCP (loopback, a free port), as tenants
    reach it; `extra_args` are added to its command line; tokens come from
    the real CLI over the unix socket."""

    extra_args = []

    @classmethod
    def setUpClass(cls):
        cls.port = free_port()
        cls.daemon_args = ["--listen", f"127.0.0.1:{cls.port}"] + cls.extra_args
        super().setUpClass()

    @classmethod
    def new_token(cls, tenant, *flags):
        """(secret, token id) of a new token for `tenant` (`airlock token create`)."""
        r = subprocess.run([os.path.join(BIN, "airlock"), "--socket", cls.sock, "token", "create",
                            "--tenant", tenant, "--json", *flags],
                           capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise AssertionError(f"airlock token create: {r.returncode}: {r.stderr}")
        tok = json.loads(r.stdout)
        return tok["secret"], tok["id"]


def netns_available():
    """Whether this process may make network namespaces (root and `ip netns`)."""
    if os.geteuid() != 0:
        return False
    return subprocess.run(["ip", "netns", "list"], capture_output=True).returncode == 0


class NetnsDaemonTestCase(DaemonTestCase):
    """A DaemonTestCase whose daemon runs in an empty network namespace the
    class creates (loopback only), so whatever its sandboxes may reach by
    policy reaches nothing; the namespace is deleted however the class ends."""

    NS_PREFIX = "alnet"

    @classmethod
    def setUpClass(cls):
        cls.NS = f"{cls.NS_PREFIX}-{os.getpid()}"
        cls.daemon_prefix = ["ip", "netns", "exec", cls.NS]
        subprocess.run(["ip", "netns", "add", cls.NS], check=True, capture_output=True)
        try:
            subprocess.run(["ip", "-n", cls.NS, "link", "set", "lo", "up"], check=True)
            super().setUpClass()
        except BaseException:
            subprocess.run(["ip", "netns", "del", cls.NS], capture_output=True)
            raise

    @classmethod
    def tearDownClass(cls):
        try:
            super().tearDownClass()
        finally:
            subprocess.run(["ip", "netns", "del", cls.NS], capture_output=True)


def pool_member_of(data_dir, sid):
    """The internal name of the pool member that became sandbox `sid` (its journal's
    `created` record says), or None."""
    try:
        with open(os.path.join(data_dir, "audit", sid + ".jsonl")) as f:
            for line in f:
                if '"created"' in line and json.loads(line).get("event") == "created":
                    return json.loads(line).get("pool_member")
    except (OSError, ValueError):
        pass
    return None


def leftovers_of(data_dir, sid, wait=10):
    """What remains of deleted sandbox `sid` (QEMU, helper processes, run dir, cgroups,
    files other than its journal), as a list of descriptions; [] when nothing.
    Waits up to `wait` seconds for teardown to finish first. A pool hit's run
    dir, jail and QEMU keep the member's name: those are checked too."""
    member = pool_member_of(data_dir, sid)
    if member:
        return leftovers_of(data_dir, member, wait) + leftovers_of_name(data_dir, sid, wait)
    return leftovers_of_name(data_dir, sid, wait)


def leftovers_of_name(data_dir, sid, wait):
    run_dir = os.path.join(data_dir, "sandboxes", sid)
    deadline = time.time() + wait
    while time.time() < deadline and (pids_mentioning(sid) or os.path.exists(run_dir)
                                      or cgroup_dirs_for(sid)):
        time.sleep(0.1)
    problems = []
    if qemu_pids_for(sid):
        problems.append(f"QEMU of {sid} still running: {qemu_pids_for(sid)}")
    if pids_mentioning(sid):
        problems.append(f"a process of {sid} (e.g. airlock-net) still running: {pids_mentioning(sid)}")
    if os.path.exists(run_dir):
        problems.append(f"{run_dir} still exists: "
                        + (str(os.listdir(run_dir)) if os.path.isdir(run_dir) else ""))
    if cgroup_dirs_for(sid):
        problems.append(f"cgroups of {sid} remain: {cgroup_dirs_for(sid)}")
    files = []
    for base, _, names in os.walk(data_dir):
        files += [os.path.join(base, f) for f in names if sid in f and not f.endswith(".jsonl")]
    if files:
        problems.append(f"files of the deleted sandbox remain: {files}")
    return problems

"""What the workload suite (and bench/tcg_cache.py) serves from its own
little internet: a real apt repository, a PEP 503 simple index with a wheel,
and a git repository over dumb HTTP, all built here from nothing, plus the
network namespaces they are served in.

Topology (both namespaces created by `LittleInternet.start`, always deleted
by `stop`; neither address exists in the host's own namespace):
  wl-h-PID  "the host": airlockd, QEMU and airlock-net run here; veth
            192.0.2.2/24, default route to the internet namespace.
  wl-i-PID  "the internet": a static HTTP server on 198.51.100.20:8080
            serving the repositories, DNS on 203.0.113.53 answering
            pkgs.example.com -> 198.51.100.20 (tests/netns/little_internet.py).
Only the standard library, dpkg-deb, dpkg-scanpackages (dpkg-dev) and git.
"""

import base64
import hashlib
import json
import os
import subprocess
import sys
import textwrap
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LITTLE_INTERNET = os.path.join(ROOT, "tests", "netns", "little_internet.py")

SERVER = "198.51.100.20"
PORT = 8080
DNS = "203.0.113.53"
NAME = "pkgs.example.com"
BASE_URL = f"http://{NAME}:{PORT}"

APT_PKG = "airlock-hello"
APT_OUTPUT = "hello from the test's apt repository"
PIP_PKG = "airlock-wheel"
PIP_MODULE = "airlock_wheel"
PIP_ANSWER = "wheel served by the test"
GIT_FIRST = "first commit of the test repository"


def run(*args, **kw):
    return subprocess.run(args, check=True, capture_output=True, **kw)


def build_apt_repo(top, extra=()):
    """A flat apt repository under top/apt: one package whose program prints
    APT_OUTPUT (plus `extra`: (name, {path: script}) stub packages whose
    programs are those scripts); Packages from dpkg-scanpackages, a Release
    with its hashes (unsigned: the sandbox's sources.list says [trusted=yes])."""
    repo = os.path.join(top, "apt")
    os.makedirs(repo)
    programs = [(APT_PKG, {f"usr/bin/{APT_PKG}": f"#!/usr/bin/python3\nprint({APT_OUTPUT!r})\n"})]
    for name, files in programs + list(extra):
        pkg = os.path.join(top, "apt-src", name)
        os.makedirs(os.path.join(pkg, "DEBIAN"))
        with open(os.path.join(pkg, "DEBIAN", "control"), "w") as f:
            f.write(textwrap.dedent(f"""\
                Package: {name}
                Version: 1.0
                Architecture: all
                Maintainer: airlock tests <tests@example.com>
                Depends: python3
                Description: a program from the airlock test suites' apt repository
                """))
        for path, text in files.items():
            prog = os.path.join(pkg, path)
            os.makedirs(os.path.dirname(prog), exist_ok=True)
            with open(prog, "w") as f:
                f.write(text)
            os.chmod(prog, 0o755)
        run("dpkg-deb", "--root-owner-group", "--build", pkg, os.path.join(repo, f"{name}_1.0_all.deb"))
    packages = run("dpkg-scanpackages", "--multiversion", ".", "/dev/null", cwd=repo).stdout
    with open(os.path.join(repo, "Packages"), "wb") as f:
        f.write(packages)
    lines = ["Origin: airlock-tests", "Label: airlock-tests",
             "Architectures: all amd64"]
    for field, algo in (("MD5Sum", "md5"), ("SHA256", "sha256")):
        lines.append(field + ":")
        lines.append(f" {hashlib.new(algo, packages).hexdigest()} {len(packages)} Packages")
    with open(os.path.join(repo, "Release"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return repo


def _record_hash(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_pip_index(top, extra=()):
    """A PEP 503 simple index under top/simple with one pure-Python wheel
    (built with zipfile: no wheel tooling needed on the host), plus `extra`:
    (distribution, module, answer) stub wheels built the same way."""
    index = os.path.join(top, "simple")
    os.makedirs(index)
    entries = [(PIP_PKG, PIP_MODULE, PIP_ANSWER)] + list(extra)
    for dist_name, module, answer in entries:
        _build_wheel(top, index, dist_name, module, answer)
    with open(os.path.join(index, "index.html"), "w") as f:
        links = "".join(f'<a href="{d}/">{d}</a>' for d, _, _ in entries)
        f.write(f'<!DOCTYPE html><html><body>{links}</body></html>\n')
    return index


def _build_wheel(top, index, dist_name, module, answer):
    dist = module + "-1.0"
    files = {
        f"{module}/__init__.py": f"ANSWER = {answer!r}\n\ndef answer():\n    return ANSWER\n",
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: 1.0\n"
                                      "Summary: a wheel from the airlock workload suite\n",
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: airlock-tests\n"
                                   "Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{n},{_record_hash(c.encode())},{len(c.encode())}\n" for n, c in files.items())
    record += f"{dist}.dist-info/RECORD,,\n"
    files[f"{dist}.dist-info/RECORD"] = record
    whl_name = f"{dist}-py3-none-any.whl"
    pkgdir = os.path.join(top, "packages")
    os.makedirs(pkgdir, exist_ok=True)
    whl = os.path.join(pkgdir, whl_name)
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as z:
        for n, c in files.items():
            z.writestr(n, c)
    with open(whl, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    os.makedirs(os.path.join(index, dist_name))
    with open(os.path.join(index, dist_name, "index.html"), "w") as f:
        f.write(f'<!DOCTYPE html><html><body><a href="../../packages/{whl_name}#sha256={digest}">'
                f"{whl_name}</a></body></html>\n")
    return index


def build_git_repo(top):
    """A bare repository top/repo.git with two commits, prepared for dumb
    HTTP (`git update-server-info`: served as static files)."""
    work = os.path.join(top, "git-work")
    bare = os.path.join(top, "repo.git")
    env = dict(os.environ, GIT_AUTHOR_NAME="airlock tests", GIT_AUTHOR_EMAIL="tests@example.com",
               GIT_COMMITTER_NAME="airlock tests", GIT_COMMITTER_EMAIL="tests@example.com",
               GIT_CONFIG_GLOBAL="/dev/null", GIT_CONFIG_NOSYSTEM="1")
    run("git", "init", "-q", "-b", "main", work, env=env)
    with open(os.path.join(work, "README"), "w") as f:
        f.write("airlock workload suite\n")
    run("git", "-C", work, "add", "README", env=env)
    run("git", "-C", work, "commit", "-q", "-m", GIT_FIRST, env=env)
    with open(os.path.join(work, "hello.py"), "w") as f:
        f.write("print('hello from git')\n")
    run("git", "-C", work, "add", "hello.py", env=env)
    run("git", "-C", work, "commit", "-q", "-m", "add hello.py", env=env)
    run("git", "clone", "-q", "--bare", work, bare, env=env)
    run("git", "-C", bare, "update-server-info", env=env)
    return bare


def build_all(top):
    build_apt_repo(top)
    build_pip_index(top)
    build_git_repo(top)


def can_run():
    """None if the little internet can be made here, else why not."""
    if os.geteuid() != 0:
        return "needs root (ip netns add)"
    if subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        return "network namespaces unavailable"
    for tool in ("dpkg-deb", "dpkg-scanpackages", "git"):
        if subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True).returncode != 0:
            return f"{tool} not installed (scripts/setup.sh installs it)"
    return None


class LittleInternet:
    """The two namespaces and the servers in them; `prefix` runs a command
    in the host namespace (the daemon goes there)."""

    def __init__(self, top, tag="wl"):
        self.top = top
        pid = os.getpid()
        self.ns_h, self.ns_i = f"{tag}-h-{pid}", f"{tag}-i-{pid}"
        self.prefix = ["ip", "netns", "exec", self.ns_h]
        self.procs = []
        self.querylog = os.path.join(top, "dns-queries.log")

    def start(self):
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self):
        h, i = self.ns_h, self.ns_i
        run("ip", "netns", "add", h)
        run("ip", "netns", "add", i)
        for ns in (h, i):
            run("ip", "-n", ns, "link", "set", "lo", "up")
        # Created inside the host namespace with its peer in the internet one:
        # never in the real host's namespace.
        run("ip", "-n", h, "link", "add", "vh", "type", "veth", "peer", "name", "vi", "netns", i)
        run("ip", "-n", h, "addr", "add", "192.0.2.2/24", "dev", "vh")
        run("ip", "-n", h, "link", "set", "vh", "up")
        run("ip", "-n", h, "route", "add", "default", "via", "192.0.2.1")
        run("ip", "-n", i, "addr", "add", "192.0.2.1/24", "dev", "vi")
        for a in (SERVER, DNS):
            run("ip", "-n", i, "addr", "add", a + "/32", "dev", "vi")
        run("ip", "-n", i, "link", "set", "vi", "up")
        open(self.querylog, "w").close()
        zone = json.dumps({"a": {NAME: SERVER}})
        self._spawn([sys.executable, LITTLE_INTERNET, "internet", self.querylog, zone, DNS])
        # The repositories: plain static files (dumb HTTP for git).
        self._spawn([sys.executable, "-u", "-c",
                     "import functools, http.server, sys\n"
                     "h = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[1])\n"
                     "h.func.log_message = lambda *a: None\n"
                     "s = http.server.ThreadingHTTPServer((sys.argv[2], int(sys.argv[3])), h)\n"
                     "print('ready', flush=True)\n"
                     "s.serve_forever()\n", self.top, SERVER, str(PORT)])

    def _spawn(self, argv):
        p = subprocess.Popen(["ip", "netns", "exec", self.ns_i] + argv, stdout=subprocess.PIPE, text=True)
        self.procs.append(p)
        if p.stdout.readline().strip() != "ready":
            raise RuntimeError(f"server did not start: {argv}")

    def stop(self):
        for p in self.procs:
            p.kill()
            p.wait()
            p.stdout.close()
        self.procs = []
        for ns in (self.ns_h, self.ns_i):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def qemu_memory(pid):
    """(VmHWM, VmRSS) of process `pid` in bytes, from /proc/PID/status."""
    vals = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                vals[key] = int(rest.split()[0]) * 1024
    return vals["VmHWM"], vals["VmRSS"]


# The guest side of the workloads, shared by the suite and the bench.
def apt_script():
    return ("set -e; export DEBIAN_FRONTEND=noninteractive; "
            "rm -f /etc/apt/sources.list.d/*; "
            f"echo 'deb [trusted=yes] {BASE_URL}/apt ./' > /etc/apt/sources.list; "
            f"apt-get update -q 2>&1; apt-get install -y -q {APT_PKG} 2>&1; {APT_PKG}")


def pip_script():
    return (f"set -e; python3 -m pip install --no-cache-dir --break-system-packages "
            f"--index-url {BASE_URL}/simple --trusted-host {NAME} {PIP_PKG} 2>&1; "
            f"cd /; python3 -c 'import {PIP_MODULE}; print({PIP_MODULE}.answer())'")


# Imports every standard-library module that can be imported in a headless
# guest, then does CPU-heavy, code-heavy work (compression, hashing, json,
# regex, decimal, sorting, compiling) until SECONDS have passed, or exactly
# ROUNDS rounds if given (`work.py SECONDS [ROUNDS]`: fixed work for the bench).
PYTHON_SCRIPT = r'''
import importlib, sys, time
SECONDS = float(sys.argv[1])
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else None
skip = {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "__main__"}
ok, failed = [], []
t0 = time.monotonic()
for name in sorted(sys.stdlib_module_names):
    if name in skip or name.startswith("_"):
        continue
    try:
        importlib.import_module(name)
        ok.append(name)
    except Exception as e:
        failed.append(name)
t_import = time.monotonic() - t0
import bz2, decimal, hashlib, json, lzma, random, re, zlib
rng = random.Random(9)
rounds, t1 = 0, time.monotonic()
while (rounds < ROUNDS) if ROUNDS is not None else (time.monotonic() - t1 < SECONDS):
    data = bytes(rng.getrandbits(8) for _ in range(20000))
    assert zlib.decompress(zlib.compress(data)) == data
    assert bz2.decompress(bz2.compress(data)) == data
    assert lzma.decompress(lzma.compress(data[:5000])) == data[:5000]
    doc = {"k%d" % i: [rng.random(), str(i), {"n": i}] for i in range(500)}
    assert json.loads(json.dumps(doc)) == doc
    text = " ".join("w%d" % rng.randrange(1000) for _ in range(3000))
    assert len(re.findall(r"w(\d+)", text)) == 3000
    decimal.getcontext().prec = 60
    s = sum(decimal.Decimal(1) / decimal.Decimal(i) for i in range(1, 400))
    assert s > 6
    xs = [rng.random() for _ in range(20000)]
    assert sorted(xs)[0] == min(xs)
    hashlib.sha256(data * 20).hexdigest()
    compile("def f%d(x):\n    return [y * %d for y in range(x)]\n" % (rounds, rounds), "gen", "exec")
    rounds += 1
print("imported", len(ok), "failed", len(failed), " ".join(failed))
print("import_s %.1f" % t_import)
print("rounds", rounds, "cpu_s %.1f" % (time.monotonic() - t1))
'''

"""A private containerd with the CRI plugin on (runtime handlers `airlock`
and `runc`), its own config, root, state and sockets under a directory
the caller owns, and the tiny OCI images the CRI tests and bench/cri_start.py
import into its k8s.io namespace. No network: pods use the node's network
namespace (no CNI), images come from tars built here."""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import time

import harness
import oci_build

K8S_NS = "k8s.io"
PAUSE_IMG = "localhost/airlock-test/pause:1"
APP_IMG = "localhost/airlock-test/app:1"
BUSYBOX = "/bin/busybox"
APPLETS = ["sh", "echo", "uname", "sleep", "cat", "ls", "true", "id", "seq", "httpd", "tail"]
POD_SUBNET = "10.244.7.0/24"  # the CNI bridge's, inside the test's own network namespace
SHIM_SOCKETS = "/run/containerd/s"  # containerd 1.6 puts every shim's socket here
NETNS = "/run/netns"  # where containerd's CRI pins a pod's network namespace


def have_containerd():
    return bool(shutil.which("containerd") and shutil.which("ctr") and shutil.which("runc"))


def busybox_image(name, marker, cmd):
    """An OCI image layout tar named `name`: busybox-static, its applets,
    PATH, and a file /<marker> holding `marker` that only this image has."""
    with open(BUSYBOX, "rb") as f:
        bb = f.read()
    entries = [oci_build.directory("bin"), oci_build.file("bin/busybox", bb, 0o755),
               oci_build.directory("tmp", 0o1777), oci_build.directory("proc"), oci_build.directory("dev"),
               oci_build.directory("sys"), oci_build.directory("etc"),
               oci_build.file(marker, (marker + "\n").encode())]
    entries += [oci_build.symlink("bin/" + a, "busybox") for a in APPLETS]
    layer = oci_build.make_layer(entries)
    cfg = oci_build.config(env=["PATH=/bin"], cmd=cmd)
    cfg["rootfs"]["diff_ids"] = ["sha256:" + oci_build._sha(layer)]
    files = oci_build.oci_files([layer], cfg)
    index = json.loads(files["index.json"])
    index["manifests"][0]["annotations"] = {"io.containerd.image.name": name,
                                            "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]}
    index["manifests"][0]["platform"] = {"architecture": "amd64", "os": "linux"}
    files["index.json"] = json.dumps(index).encode()
    return oci_build.pack(files)


def shim_socket_name(address, namespace, shim_id):
    """The name of a shim's socket in SHIM_SOCKETS (containerd 1.6's
    shim.SocketAddress: sha256 of containerd's address, namespace and the
    shim's id, which is its pod's for a pod's containers)."""
    return hashlib.sha256(os.path.join(address, namespace, shim_id).encode()).hexdigest()


def entries(d):
    try:
        return set(os.listdir(d))
    except OSError:
        return set()


class Containerd:
    """containerd --config <dir>/config.toml, CRI on; stop() ends it and
    whatever it started."""

    def __init__(self, d, airlock_socket, runtime_config=None, netns=None):
        """netns: the name of a network namespace (`ip netns add`) containerd
        runs in (its mount namespace stays the host's); pods of network POD
        then get an IP of POD_SUBNET on a CNI bridge inside it."""
        self.dir = d
        os.makedirs(os.path.join(d, "cni"), exist_ok=True)
        prefix = []
        if netns:
            prefix = ["nsenter", f"--net=/run/netns/{netns}"]
            with open(os.path.join(d, "cni", "10-bridge.conflist"), "w") as f:
                json.dump({"cniVersion": "0.4.0", "name": "airlock-test", "plugins": [
                    {"type": "bridge", "bridge": "altest0", "isGateway": True, "ipMasq": False,
                     "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET}]],
                              "dataDir": os.path.join(d, "cni-ipam")}}]}, f)
        self.sock = os.path.join(d, "containerd.sock")
        self.cfg = os.path.join(d, "config.toml")
        options = ""
        if runtime_config:
            options = (f'  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.airlock.options]\n'
                       f'    ConfigPath = "{runtime_config}"\n')
        with open(self.cfg, "w") as f:
            f.write(f"""version = 2
root = "{d}/root"
state = "{d}/state"
[grpc]
  address = "{self.sock}"
[ttrpc]
  address = "{self.sock}.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMG}"
  disable_apparmor = true
  # A node's kubelet runs as root with CAP_SYS_RESOURCE; a test's containerd
  # may not (a CI container): clamp the pause process's -998 to our own score.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{d}/cni"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
    Root = "{d}/runc"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.airlock]
    runtime_type = "io.containerd.airlock.v2"
    pod_annotations = ["airlock.dev/*"]
    container_annotations = ["airlock.dev/*"]
{options}""")
        self.netns_before = entries(NETNS)
        self.argv = prefix + ["containerd", "--config", self.cfg]
        self.env = dict(os.environ, PATH=harness.BIN + ":" + os.environ.get("PATH", "/usr/bin:/bin"),
                        AIRLOCK_SOCKET=airlock_socket)
        self.log = open(os.path.join(d, "containerd.log"), "wb")
        self._start()

    def _start(self):
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while time.time() < deadline:
            if os.path.exists(self.sock) and self.ctr("version").returncode == 0:
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        log = self.tail()
        self.stop()
        raise RuntimeError("containerd did not start: " + log)

    def restart(self):
        """containerd ends (SIGTERM, as `systemctl restart` does) and starts
        again with the same config, root, state and sockets; its shims and
        their tasks run on."""
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=20)
        self.log.write(b"\n--- restarted by the test ---\n")
        self._start()

    def tail(self, n=6000):
        self.log.flush()
        with open(self.log.name, "rb") as f:
            return f.read().decode(errors="replace")[-n:]

    def ctr(self, *args, timeout=180):
        return subprocess.run(["ctr", "--address", self.sock, "--namespace", K8S_NS, *args],
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def import_image(self, tar_path):
        r = self.ctr("image", "import", tar_path)
        if r.returncode != 0:
            raise RuntimeError("ctr image import: " + r.stdout + r.stderr)

    def shims(self):
        """PIDs of shims (any runtime's) serving this containerd."""
        pids = []
        for pid in harness.pids_mentioning(self.sock):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"containerd-shim" in f.read().split(b"\0")[0]:
                        pids.append(pid)
            except OSError:
                pass
        return pids

    def mounts(self):
        """Mount points under this containerd's directory."""
        with open("/proc/self/mountinfo") as f:
            return [l.split()[4] for l in f if l.split()[4].startswith(self.dir)]

    def shim_sockets_of(self, ids):
        """Shim sockets left of these pod and container ids (other
        containerds' shims, e.g. a suite running alongside, are not counted)."""
        return {n for n in entries(SHIM_SOCKETS) if n in {shim_socket_name(self.sock, K8S_NS, i) for i in ids}}

    def new_netns(self):
        """Pod network namespaces (cni-...) made since containerd started and still pinned."""
        return {n for n in entries(NETNS) - self.netns_before if n.startswith("cni-")}

    def stop(self):
        if self.proc is None:
            return
        # Whatever a failed test left: tasks killed, containers removed.
        for line in self.ctr("task", "ls", "-q").stdout.split():
            self.ctr("task", "kill", "-s", "SIGKILL", line)
            self.ctr("task", "rm", "-f", line)
        for line in self.ctr("container", "ls", "-q").stdout.split():
            self.ctr("container", "rm", line)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        for pid in self.shims():  # never leak a shim
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for m in sorted(self.mounts(), reverse=True):
            subprocess.run(["umount", "-l", m], capture_output=True)
        for n in self.new_netns():
            subprocess.run(["ip", "netns", "del", n], capture_output=True)
        self.proc = None

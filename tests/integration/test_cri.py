"""kubelet's CRI sequence against a private containerd (CRI plugin on):
RunPodSandbox -> CreateContainer -> StartContainer -> ExecSync -> the
container's log file -> StopContainer -> StopPodSandbox -> RemovePodSandbox,
then nothing left. The same test code runs against runtime handler
`airlock` (containerd-shim-airlock-v2 and a real airlockd: one microVM and
one shim per pod) and handler `runc` (the honest baseline). The CRI client
is cri_client.py (the CRI v1 subset in cri/runtime_v1.proto); images are
OCI tars built here and imported with `ctr -n k8s.io image import`."""

import ipaddress
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

import cri_client
import cri_harness
import harness

SHIM = "containerd-shim-airlock-v2"
SKIP = None
if not cri_harness.have_containerd():
    SKIP = "containerd, ctr and runc are not installed (scripts/setup.sh installs them)"
elif not harness.netns_available():
    SKIP = "network namespaces are not available (root and `ip netns`)"
elif not os.path.exists(os.path.join(harness.BIN, SHIM)):
    SKIP = f"{SHIM} was not built (no Go toolchain at configure time)"
else:
    SKIP = cri_client.missing()

# The app's command: prints to the log, then waits for StopContainer.
APP_CMD = ["sh", "-c", "echo hello-from-app; echo to-stderr >&2; cat /app-marker; exec sleep 600"]


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return ""


class CriFixture:
    """A private containerd (CRI on) and airlockd, the images, and the
    helpers of the CRI tests; a subclass names the runtime handler."""

    HANDLER = None

    @classmethod
    def setUpClass(cls):
        # A private image dir (the shim's imports stay out of the shared one),
        # with the shared kernel cache the import builds boot files from.
        cls.images_tmp = tempfile.mkdtemp(prefix="airlock-cri-images-")
        shared = harness.IMAGE_DIR
        os.makedirs(os.path.join(cls.images_tmp, "cache"))
        os.symlink(os.path.join(os.path.abspath(shared), "cache", "kernel"),
                   os.path.join(cls.images_tmp, "cache", "kernel"))
        harness.IMAGE_DIR = cls.images_tmp
        try:
            super().setUpClass()
        except BaseException:
            shutil.rmtree(cls.images_tmp, ignore_errors=True)
            raise
        finally:
            harness.IMAGE_DIR = shared
        cls.ctd = None
        try:
            cls.ctd = cri_harness.Containerd(os.path.join(cls.tmp, "ctd"), cls.sock, netns=cls.NS)
            for name, marker, cmd in ((cri_harness.PAUSE_IMG, "pod-marker", ["sleep", "2147483647"]),
                                      (cri_harness.APP_IMG, "app-marker", ["sh"])):
                tar = os.path.join(cls.tmp, marker + ".tar")
                with open(tar, "wb") as f:
                    f.write(cri_harness.busybox_image(name, marker, cmd))
                cls.ctd.import_image(tar)
            cls.cri = cri_client.Client(cls.ctd.sock)
            cls.pb = cls.cri.pb
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        try:
            if getattr(cls, "cri", None):
                cls.cri.close()
            if cls.ctd:
                cls.ctd.stop()
        finally:
            super().tearDownClass()
            shutil.rmtree(cls.images_tmp, ignore_errors=True)

    def pod_config(self, name, annotations=None, network=None):
        """A pod on the node's network (NODE) unless network is POD (the CNI bridge)."""
        logs = os.path.join(self.tmp, "pods", name)
        os.makedirs(logs, exist_ok=True)
        pb = self.pb
        network = pb.NODE if network is None else network
        return pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, uid="uid-" + name, namespace="default"),
            log_directory=logs, annotations=annotations or {},
            linux=pb.LinuxPodSandboxConfig(security_context=pb.LinuxSandboxSecurityContext(
                namespace_options=pb.NamespaceOption(network=network, pid=pb.CONTAINER, ipc=pb.POD))))

    def container_config(self, name, image=cri_harness.APP_IMG, command=APP_CMD, memory=256 << 20, tty=False):
        """memory: memory_limit_in_bytes (0: none)."""
        pb = self.pb
        return pb.ContainerConfig(metadata=pb.ContainerMetadata(name=name), image=pb.ImageSpec(image=image),
                                  command=command, envs=[pb.KeyValue(key="GREETING", value="hi")],
                                  log_path=f"{name}/0.log", tty=tty,
                                  linux=pb.LinuxContainerConfig(resources=pb.LinuxContainerResources(
                                      memory_limit_in_bytes=memory)))

    def wait_for(self, what, fn, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            v = fn()
            if v:
                return v
            time.sleep(0.2)
        self.fail(f"timed out waiting for {what}\n" + self.ctd.tail())

    def setUp(self):
        self.ids = []  # pods and containers made: their shims' sockets must go

    def run_pod(self, config):
        pod = self.cri.call("RunPodSandbox", config=config, runtime_handler=self.HANDLER).pod_sandbox_id
        self.ids.append(pod)
        return pod

    def create(self, pod, config, sandbox_config):
        cid = self.cri.call("CreateContainer", pod_sandbox_id=pod, config=config,
                            sandbox_config=sandbox_config).container_id
        self.ids.append(cid)
        return cid

    def vms(self):
        return harness.qemu_pids_for(self.data_dir)

    def assertAllGone(self):
        """No sandbox, QEMU, shim, mount, shim socket or container of this containerd remains."""
        def gone():
            return not (self.api.call("GET", "/v1/sandboxes") or self.ctd.shims() or self.vms()
                        or self.ctd.mounts())
        deadline = time.time() + 20
        while time.time() < deadline and not gone():
            time.sleep(0.2)
        self.assertEqual(self.api.call("GET", "/v1/sandboxes"), [])
        self.assertEqual(self.vms(), [])
        self.assertEqual(self.ctd.shims(), [], "a shim process is left")
        self.assertEqual(self.ctd.mounts(), [], "a mount is left")
        self.assertEqual(self.ctd.shim_sockets_of(self.ids), set(), "a shim socket is left")
        self.assertEqual(self.ctd.new_netns(), set(), "a pod network namespace is left")
        self.assertEqual(list(self.cri.call("ListPodSandbox").items), [])
        self.assertEqual(self.ctd.ctr("container", "ls", "-q").stdout.split(), [])

    def wait_exited(self, cid, timeout=60):
        """The container's status once it has exited."""
        def exited():
            st = self.cri.call("ContainerStatus", container_id=cid).status
            return st if st.state == self.pb.CONTAINER_EXITED else None
        return self.wait_for(f"container {cid} to exit", exited, timeout=timeout)


class CriSequence(CriFixture):
    """kubelet's sequence, the pod IP, bad pod annotations."""

    def test_kubelets_sequence(self):
        pb = self.pb
        v = self.cri.call("Version", version="v1")
        self.assertEqual((v.runtime_name, v.runtime_api_version), ("containerd", "v1"))

        config = self.pod_config("pod1")
        pod = self.run_pod(config)
        st = self.cri.call("PodSandboxStatus", pod_sandbox_id=pod).status
        self.assertEqual((st.state, st.runtime_handler), (pb.SANDBOX_READY, self.HANDLER))
        listed = self.cri.call("ListPodSandbox", filter=pb.PodSandboxFilter(id=pod)).items
        self.assertEqual([p.id for p in listed], [pod])

        cid = self.create(pod, self.container_config("app"), config)
        self.cri.call("StartContainer", container_id=cid)
        self.assertEqual(self.cri.call("ContainerStatus", container_id=cid).status.state, pb.CONTAINER_RUNNING)
        if self.HANDLER == "airlock":
            # Kata's mapping: one microVM and one shim for the pod's two containers.
            self.assertEqual(len(self.vms()), 1, self.vms())
            self.assertEqual(len(self.api.call("GET", "/v1/sandboxes")), 1)
        self.assertEqual(len(self.ctd.shims()), 1, self.ctd.shims())
        # The pod's one shim socket, named after the pod (the app container's shares it).
        self.assertEqual(len(self.ctd.shim_sockets_of([pod])), 1)
        self.assertEqual(self.ctd.shim_sockets_of([cid]), set())

        r = self.cri.call("ExecSync", container_id=cid, timeout=60,
                          cmd=["sh", "-c", 'echo "exec $GREETING"; echo exec-err >&2; cat /app-marker; exit 7'])
        self.assertEqual((r.stdout, r.stderr, r.exit_code), (b"exec hi\napp-marker\n", b"exec-err\n", 7))
        # The app container sees its own image's root filesystem, not the pod's.
        r = self.cri.call("ExecSync", container_id=cid, cmd=["cat", "/pod-marker"], timeout=60)
        self.assertNotEqual(r.exit_code, 0, r)
        r = self.cri.call("ExecSync", container_id=cid, cmd=["uname", "-r"], timeout=60)
        kernel = r.stdout.decode().strip()
        if self.HANDLER == "airlock":
            self.assertNotEqual(kernel, os.uname().release, "the container ran on the host's kernel")
        else:
            self.assertEqual(kernel, os.uname().release)

        # A second app container of the pod, on a terminal, in the same VM.
        # No memory limit: airlock's terminal sessions take none (test_cri_limits.py).
        term = self.container_config("term", command=["sh", "-c", "tty; echo term-ok; exec sleep 600"], memory=0,
                                     tty=True)
        tid = self.create(pod, term, config)
        self.cri.call("StartContainer", container_id=tid)
        tlog = os.path.join(config.log_directory, "term", "0.log")
        self.wait_for("the terminal container's output", lambda: "term-ok" in read(tlog), timeout=30)
        self.assertRegex(read(tlog), r" stdout F /dev/pts/\d+\r?\n")
        if self.HANDLER == "airlock":
            self.assertEqual(len(self.vms()), 1, self.vms())
        self.assertEqual(len(self.ctd.shims()), 1, self.ctd.shims())
        self.cri.call("StopContainer", container_id=tid, timeout=0)
        self.cri.call("RemoveContainer", container_id=tid)

        # Bad input: containerd's codes, the message naming what was wrong.
        with self.assertRaises(self.cri.grpc.RpcError) as e:
            self.cri.call("CreateContainer", pod_sandbox_id=pod, sandbox_config=config,
                          config=self.container_config("ghost", image="localhost/airlock-test/none:1"))
        self.assertEqual(e.exception.code(), self.cri.grpc.StatusCode.NOT_FOUND, e.exception.details())
        self.assertIn("localhost/airlock-test/none:1", e.exception.details())
        with self.assertRaises(self.cri.grpc.RpcError) as e:
            self.cri.call("CreateContainer", pod_sandbox_id=pod, config=self.container_config("app"),
                          sandbox_config=config)
        self.assertIn("reserved", e.exception.details())  # the same name and attempt again

        # containerd's CRI log format: <RFC3339Nano> <stream> <F|P> <line>.
        log = os.path.join(config.log_directory, "app", "0.log")
        self.wait_for("the container's output in its log file",
                      lambda: "app-marker" in read(log), timeout=30)
        lines = read(log).splitlines()
        fmt = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+(Z|[+-]\d\d:\d\d) (stdout|stderr) F (.*)$")
        parsed = [fmt.match(l) for l in lines]
        self.assertTrue(all(parsed), lines)
        self.assertIn(("stdout", "hello-from-app"), [(m.group(2), m.group(3)) for m in parsed])
        self.assertIn(("stderr", "to-stderr"), [(m.group(2), m.group(3)) for m in parsed])
        self.assertIn(("stdout", "app-marker"), [(m.group(2), m.group(3)) for m in parsed])

        self.cri.call("StopContainer", container_id=cid, timeout=2)
        st = self.cri.call("ContainerStatus", container_id=cid).status
        self.assertEqual(st.state, pb.CONTAINER_EXITED)
        self.cri.call("RemoveContainer", container_id=cid)
        self.cri.call("StopPodSandbox", pod_sandbox_id=pod)
        self.assertEqual(self.cri.call("PodSandboxStatus", pod_sandbox_id=pod).status.state, pb.SANDBOX_NOTREADY)
        self.cri.call("StopPodSandbox", pod_sandbox_id=pod)  # kubelet may stop twice: idempotent
        self.cri.call("RemovePodSandbox", pod_sandbox_id=pod)
        self.assertAllGone()

    def fetch(self, url):
        """The body of url fetched from inside the test's network namespace ("" on failure)."""
        get = "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())"
        r = subprocess.run(["ip", "netns", "exec", self.NS, sys.executable, "-c", get, url], capture_output=True,
                           text=True, timeout=30)
        return r.stdout if r.returncode == 0 else ""

    def test_the_pod_ip_reaches_a_port_in_the_container(self):
        """A pod on a CNI bridge: an HTTP server in its app container answers on
        the pod IP (under airlock: the shim's listener in the pod's network
        namespace relays to airlockd's forward into the guest)."""
        pb = self.pb
        config = self.pod_config("web", annotations={"airlock.dev/ports": "8080"}, network=pb.POD)
        pod = self.run_pod(config)
        ip = self.cri.call("PodSandboxStatus", pod_sandbox_id=pod).status.network.ip
        self.assertTrue(ipaddress.ip_address(ip) in ipaddress.ip_network(cri_harness.POD_SUBNET), ip)
        cid = self.create(pod, self.container_config("web", command=["httpd", "-f", "-p", "8080", "-h", "/"]), config)
        self.cri.call("StartContainer", container_id=cid)
        body = self.wait_for("the server to answer on the pod IP",
                             lambda: self.fetch(f"http://{ip}:8080/app-marker"), timeout=30)
        self.assertEqual(body, "app-marker\n")
        if self.HANDLER == "airlock":
            self.assertEqual(len(self.vms()), 1, self.vms())
        self.cri.call("StopContainer", container_id=cid, timeout=0)
        self.cri.call("RemoveContainer", container_id=cid)
        self.cri.call("StopPodSandbox", pod_sandbox_id=pod)
        self.cri.call("RemovePodSandbox", pod_sandbox_id=pod)
        self.assertEqual(self.fetch(f"http://{ip}:8080/app-marker"), "")
        self.assertAllGone()

    def test_bad_pod_annotations_are_refused_and_leave_nothing(self):
        """airlock.dev/ annotations out of range: RunPodSandbox fails naming the
        key (runc ignores them: the pod runs)."""
        for key, value in (("airlock.dev/memory_mb", "8"), ("airlock.dev/cpus", "many"),
                           ("airlock.dev/ports", "70000")):
            config = self.pod_config("bad", annotations={key: value})
            if self.HANDLER == "runc":
                pod = self.run_pod(config)
                self.cri.call("StopPodSandbox", pod_sandbox_id=pod)
                self.cri.call("RemovePodSandbox", pod_sandbox_id=pod)
                continue
            with self.assertRaises(self.cri.grpc.RpcError) as e:
                self.cri.call("RunPodSandbox", config=config, runtime_handler=self.HANDLER)
            self.assertEqual(e.exception.code(), self.cri.grpc.StatusCode.INVALID_ARGUMENT, e.exception.details())
            self.assertIn(key.split("/")[1], e.exception.details())
        self.assertAllGone()


@unittest.skipIf(SKIP, SKIP)
class CriAirlockTest(CriSequence, harness.NetnsDaemonTestCase):
    HANDLER = "airlock"


@unittest.skipIf(SKIP, SKIP)
class CriRuncTest(CriSequence, harness.NetnsDaemonTestCase):
    HANDLER = "runc"


if __name__ == "__main__":
    unittest.main()

"""Pods under the CRI beyond kubelet's plain sequence (test_cri.py): a
containerd restarted under a running pod and two pods at once. The same test code runs against runtime handler
`airlock` and `runc`; where the two differ, the assertion says how."""

import concurrent.futures
import re
import unittest

import harness
import test_cri
from test_cri import SKIP, read

# Prints tick-1, tick-2, ... to its log, one every 0.2 s, until stopped.
TICKER = ["sh", "-c", "i=0; while :; do i=$((i+1)); echo tick-$i; sleep 0.2; done"]


class PodsTests(test_cri.CriFixture):

    def tearDown(self):
        # A failed test's pods go, so that the next test counts only its own.
        for p in self.cri.call("ListPodSandbox").items:
            try:
                self.cri.call("StopPodSandbox", pod_sandbox_id=p.id)
                self.cri.call("RemovePodSandbox", pod_sandbox_id=p.id)
            except self.cri.grpc.RpcError:
                pass

    def start_container(self, pod, config, name, **kw):
        cid = self.create(pod, self.container_config(name, **kw), config)
        self.cri.call("StartContainer", container_id=cid)
        return cid

    def remove_pod(self, pod, cids):
        for cid in cids:
            self.cri.call("StopContainer", container_id=cid, timeout=0)
            self.cri.call("RemoveContainer", container_id=cid)
        self.cri.call("StopPodSandbox", pod_sandbox_id=pod)
        self.cri.call("RemovePodSandbox", pod_sandbox_id=pod)

    def ticks(self, log):
        return [int(n) for n in re.findall(r" stdout F tick-(\d+)$", read(log), re.M)]

    def test_containerd_restarted_mid_pod(self):
        """containerd ends and starts again under a running pod: the CRI
        finds the pod and its container running, ExecSync reaches the
        container, its log goes on without losing a line (what it wrote
        while containerd was down included), and the pod's end (which waits
        for the shim's exit event through the new containerd) leaves nothing."""
        pb = self.pb
        config = self.pod_config("survivor")
        pod = self.run_pod(config)
        cid = self.start_container(pod, config, "ticker", command=TICKER)
        log = f"{config.log_directory}/ticker/0.log"
        self.wait_for("ticks in the log", lambda: len(self.ticks(log)) >= 3, timeout=30)
        shims, vms = self.ctd.shims(), self.vms()

        self.ctd.restart()
        self.wait_for("the CRI to answer again", self.cri_answers, timeout=30)
        self.assertEqual(self.cri.call("PodSandboxStatus", pod_sandbox_id=pod).status.state, pb.SANDBOX_READY)
        self.assertEqual(self.cri.call("ContainerStatus", container_id=cid).status.state, pb.CONTAINER_RUNNING)
        self.assertEqual(self.ctd.shims(), shims, "the pod's shim was not the one that ran before")
        self.assertEqual(self.vms(), vms)

        r = self.cri.call("ExecSync", container_id=cid, cmd=["sh", "-c", "echo after-restart; exit 4"], timeout=60)
        self.assertEqual((r.stdout, r.exit_code), (b"after-restart\n", 4))
        before = max(self.ticks(log))
        self.wait_for("new ticks in the log", lambda: max(self.ticks(log)) >= before + 5, timeout=30)
        ticks = self.ticks(log)
        self.assertEqual(ticks, list(range(1, len(ticks) + 1)), "lines of the log were lost over the restart")

        self.cri.call("StopContainer", container_id=cid, timeout=2)
        self.assertEqual(self.cri.call("ContainerStatus", container_id=cid).status.state, pb.CONTAINER_EXITED)
        self.cri.call("RemoveContainer", container_id=cid)
        self.cri.call("StopPodSandbox", pod_sandbox_id=pod)
        self.cri.call("RemovePodSandbox", pod_sandbox_id=pod)
        self.assertAllGone()

    def cri_answers(self):
        try:
            self.cri.call("Version", version="v1", deadline=5)
            return True
        except self.cri.grpc.RpcError:
            return False

    def test_two_pods_at_once(self):
        """Two RunPodSandbox at once: each pod gets its own shim (and, under
        airlock, its own VM and sandbox); each container sees its own pod."""
        names = ("left", "right")
        configs = {n: self.pod_config(n) for n in names}
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            pods = dict(zip(names, pool.map(lambda n: self.run_pod(configs[n]), names)))
            cids = dict(zip(names, pool.map(lambda n: self.start_container(pods[n], configs[n], "app-" + n),
                                            names)))
        self.assertNotEqual(pods["left"], pods["right"])
        self.assertEqual(len(self.ctd.shims()), 2, self.ctd.shims())
        for n in names:
            self.assertEqual(len(self.ctd.shim_sockets_of([pods[n]])), 1, n)
        if self.HANDLER == "airlock":
            self.assertEqual(len(self.vms()), 2, self.vms())
            sandboxes = self.api.call("GET", "/v1/sandboxes")
            self.assertEqual(sorted(s["metadata"]["containerd.id"] for s in sandboxes), sorted(pods.values()))

        def run(n, *cmd):
            r = self.cri.call("ExecSync", container_id=cids[n], cmd=["sh", "-c", *cmd], timeout=60)
            return r.exit_code, r.stdout.decode()
        self.assertEqual(run("left", "echo left > /tmp/mine"), (0, ""))
        self.assertEqual(run("left", "cat /tmp/mine"), (0, "left\n"))
        self.assertNotEqual(run("right", "cat /tmp/mine")[0], 0, "the right pod sees the left one's file")
        boot = {n: run(n, "cat /proc/sys/kernel/random/boot_id") for n in names}
        if self.HANDLER == "airlock":
            self.assertNotEqual(boot["left"], boot["right"], "the two pods run on one kernel")
        else:
            self.assertEqual(boot["left"], boot["right"])  # runc: both on the host's kernel

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda n: self.remove_pod(pods[n], [cids[n]]), names))
        self.assertAllGone()


@unittest.skipIf(SKIP, SKIP)
class CriPodsAirlockTest(PodsTests, harness.NetnsDaemonTestCase):
    HANDLER = "airlock"


@unittest.skipIf(SKIP, SKIP)
class CriPodsRuncTest(PodsTests, harness.NetnsDaemonTestCase):
    HANDLER = "runc"


if __name__ == "__main__":
    unittest.main()

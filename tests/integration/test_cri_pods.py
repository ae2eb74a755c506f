"""Pods under the CRI beyond kubelet's plain sequence (test_cri.py): a
containerd restarted under a running pod, two pods at once, and app
containers' memory limits. The same test code runs against runtime handler
`airlock` and `runc`; where the two differ, the assertion says how."""

import concurrent.futures
import re
import time
import unittest

import harness
import test_cri
from test_cri import SKIP, read

# Prints tick-1, tick-2, ... to its log, one every 0.2 s, until stopped.
TICKER = ["sh", "-c", "i=0; while :; do i=$((i+1)); echo tick-$i; sleep 0.2; done"]
HOG = ["tail", "/dev/zero"]  # no newline in /dev/zero: tail keeps it all in memory


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

    def test_a_pods_container_paused_and_resumed(self):
        """`ctr task pause` of a pod's app container (the CRI has no pause;
        containerd's task API does): its log stops, and runs on after resume."""
        config = self.pod_config("napping")
        pod = self.run_pod(config)
        cid = self.start_container(pod, config, "ticker", command=TICKER)
        log = f"{config.log_directory}/ticker/0.log"
        self.wait_for("ticks in the log", lambda: len(self.ticks(log)) >= 3, timeout=30)
        r = self.ctd.ctr("task", "pause", cid)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("PAUSED", self.ctd.ctr("task", "ls").stdout)
        time.sleep(0.5)  # a line already on its way may still land
        before = self.ticks(log)
        time.sleep(1.5)
        self.assertEqual(self.ticks(log), before, "the paused container went on printing")
        r = self.ctd.ctr("task", "resume", cid)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.wait_for("new ticks", lambda: max(self.ticks(log)) >= max(before) + 3, timeout=30)
        self.remove_pod(pod, [cid])
        self.assertAllGone()

    def test_a_container_past_its_memory_limit_is_oom_killed(self):
        """memory_limit_in_bytes bounds the container's processes: one that
        allocates past it is OOM-killed (137, reason OOMKilled), and so is an
        exec into a limited container that does; the pod runs on."""
        pb = self.pb
        config = self.pod_config("hogs")
        pod = self.run_pod(config)
        hog = self.start_container(pod, config, "hog", command=HOG, memory=32 << 20)
        st = self.wait_exited(hog)
        self.assertEqual((st.exit_code, st.reason), (137, "OOMKilled"), st)

        calm = self.start_container(pod, config, "calm", command=["sleep", "600"], memory=32 << 20)
        r = self.cri.call("ExecSync", container_id=calm, cmd=HOG, timeout=60)
        self.assertEqual(r.exit_code, 137, r)
        # Well under the limit: runs.
        r = self.cri.call("ExecSync", container_id=calm, cmd=["sh", "-c", "x=$(seq 1 1000); echo ${#x}"],
                          timeout=60)
        self.assertEqual((r.exit_code, r.stdout), (0, b"3892\n"))
        self.assertEqual(self.cri.call("PodSandboxStatus", pod_sandbox_id=pod).status.state, pb.SANDBOX_READY)
        self.cri.call("RemoveContainer", container_id=hog)
        self.remove_pod(pod, [calm])
        self.assertAllGone()

    def test_limits_airlock_cannot_honour_are_refused(self):
        """Under airlock, a memory limit below the guest agent's 1 MiB or above
        the pod VM's memory (256 MiB by default) is refused at StartContainer
        naming the field, with nothing made in the VM; a terminal container
        runs with its limit (airlockd's PTY start takes the exec limits). runc
        refuses the tiny one too (below what its init already uses, with
        containerd's code Unknown) and runs the other two (a cgroup limit, no
        VM)."""
        pb = self.pb
        config = self.pod_config("strict")
        pod = self.run_pod(config)
        cases = {"tiny": dict(memory=512 << 10), "huge": dict(memory=2 << 30),
                 "tty": dict(memory=64 << 20, tty=True)}
        for name, kw in cases.items():
            cid = self.create(pod, self.container_config(name, command=["sleep", "600"], **kw), config)
            if self.HANDLER == "runc" and name == "tiny":
                with self.assertRaises(self.cri.grpc.RpcError) as e:
                    self.cri.call("StartContainer", container_id=cid)
                self.assertEqual(e.exception.code(), self.cri.grpc.StatusCode.UNKNOWN, e.exception.details())
                self.assertIn("unable to set memory limit to 524288", e.exception.details())
            elif self.HANDLER == "runc" or name == "tty":
                self.cri.call("StartContainer", container_id=cid)
                self.assertEqual(self.cri.call("ContainerStatus", container_id=cid).status.state,
                                 pb.CONTAINER_RUNNING, name)
                if self.HANDLER == "airlock":
                    # The terminal's process, seen from the VM: its cgroup's memory.max.
                    [sb] = self.api.call("GET", "/v1/sandboxes")
                    find = ('for d in /proc/[0-9]*; do [ "$(tr "\\0" " " < $d/cmdline)" = "sleep 600 " ] && '
                            'cat /sys/fs/cgroup$(cut -d: -f3 $d/cgroup)/memory.max; done')
                    out, err, _ = self.api.exec(sb["id"], argv=["sh", "-c", find])
                    self.assertEqual(out.split(), [str(64 << 20).encode()], err)
                self.cri.call("StopContainer", container_id=cid, timeout=0)
            else:
                with self.assertRaises(self.cri.grpc.RpcError) as e:
                    self.cri.call("StartContainer", container_id=cid)
                self.assertEqual(e.exception.code(), self.cri.grpc.StatusCode.INVALID_ARGUMENT,
                                 e.exception.details())
                self.assertIn("memory_limit_in_bytes", e.exception.details())
                # Refused before the shim made anything in the pod's VM (the
                # refused cases come before the terminal one, which runs).
                [sb] = self.api.call("GET", "/v1/sandboxes")
                _, _, exit_event = self.api.exec(sb["id"], argv=["ls", "/.airlock-ctr"])
                self.assertNotEqual(exit_event["exit_code"], 0, name)
            self.cri.call("RemoveContainer", container_id=cid)
        # The pod is fine: a container within the limits runs.
        ok = self.start_container(pod, config, "ok", command=["sleep", "600"], memory=64 << 20)
        self.assertEqual(self.cri.call("ContainerStatus", container_id=ok).status.state, pb.CONTAINER_RUNNING)
        self.remove_pod(pod, [ok])
        self.assertAllGone()


@unittest.skipIf(SKIP, SKIP)
class CriPodsAirlockTest(PodsTests, harness.NetnsDaemonTestCase):
    HANDLER = "airlock"


@unittest.skipIf(SKIP, SKIP)
class CriPodsRuncTest(PodsTests, harness.NetnsDaemonTestCase):
    HANDLER = "runc"


if __name__ == "__main__":
    unittest.main()

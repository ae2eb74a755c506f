#!/usr/bin/env python3
"""CRI start-up: RunPodSandbox -> container running, through containerd's CRI
(kubelet's calls, tests/integration/cri_client.py) for runtime handler
`airlock` (containerd-shim-airlock-v2: one microVM per pod, the app
container's rootfs copied into it) and `runc`, interleaved run by run.

  runc          handler runc
  airlock miss  handler airlock, airlockd with no warm pool for the pod's
                image (the VM is a template clone, or a boot the first time)
  airlock hit   handler airlock, a warm pool of 1 for the pod image's shape
                (PUT /v1/pool; refilled before each run)

Each run: RunPodSandbox, CreateContainer + StartContainer of the app image
(busybox-static, `sleep`), then ExecSync `true`; it reports the time until
StartContainer returned ("running") and until the ExecSync answered
("answers"), medians over --runs. Teardown is not timed. A private
containerd (cri_harness.Containerd) and airlockd in a temp dir; no network.

Usage: sudo AIRLOCK_IMAGE_DIR=... python3 bench/cri_start.py [--runs 5]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))

import cri_client  # noqa: E402
import cri_harness  # noqa: E402
import harness  # noqa: E402


class Bench:
    def __init__(self, tmp):
        self.tmp = tmp
        images = os.path.join(tmp, "images")
        os.makedirs(os.path.join(images, "cache"))
        os.symlink(os.path.join(os.path.abspath(harness.IMAGE_DIR), "cache", "kernel"),
                   os.path.join(images, "cache", "kernel"))
        self.sock = os.path.join(tmp, "airlockd.sock")
        self.daemon_log = open(os.path.join(tmp, "airlockd.log"), "wb")
        self.daemon = subprocess.Popen(
            [os.path.join(harness.BIN, "airlockd"), "--data-dir", os.path.join(tmp, "data"), "--socket", self.sock,
             "--image-dir", images, "--template-ram-dir", os.path.join(tmp, "template-ram"), "--pool-learn", "0"],
            stdout=self.daemon_log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while not os.path.exists(self.sock) and time.time() < deadline:
            time.sleep(0.1)
        self.api = harness.Client(self.sock)
        self.api.call("GET", "/v1/info")
        self.ctd = cri_harness.Containerd(os.path.join(tmp, "ctd"), self.sock)
        for name, marker, cmd in ((cri_harness.PAUSE_IMG, "pod-marker", ["sleep", "2147483647"]),
                                  (cri_harness.APP_IMG, "app-marker", ["sh"])):
            tar = os.path.join(tmp, marker + ".tar")
            with open(tar, "wb") as f:
                f.write(cri_harness.busybox_image(name, marker, cmd))
            self.ctd.import_image(tar)
        self.cri = cri_client.Client(self.ctd.sock)
        self.pb = self.cri.pb
        self.n = 0

    def pod(self, handler):
        """(seconds to running, seconds to the first ExecSync answer, the VM's start kind)."""
        pb = self.pb
        self.n += 1
        name = f"bench{self.n}"
        logs = os.path.join(self.tmp, "pods", name)
        os.makedirs(logs)
        config = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, uid="uid-" + name, namespace="default"), log_directory=logs,
            linux=pb.LinuxPodSandboxConfig(security_context=pb.LinuxSandboxSecurityContext(
                namespace_options=pb.NamespaceOption(network=pb.NODE, pid=pb.CONTAINER, ipc=pb.POD))))
        app = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="app"),
                                 image=pb.ImageSpec(image=cri_harness.APP_IMG), command=["sleep", "600"],
                                 log_path="app/0.log")
        t0 = time.monotonic()
        pod = self.cri.call("RunPodSandbox", config=config, runtime_handler=handler).pod_sandbox_id
        cid = self.cri.call("CreateContainer", pod_sandbox_id=pod, config=app, sandbox_config=config).container_id
        self.cri.call("StartContainer", container_id=cid)
        running = time.monotonic() - t0
        r = self.cri.call("ExecSync", container_id=cid, cmd=["true"], timeout=60)
        answers = time.monotonic() - t0
        if r.exit_code != 0:
            raise RuntimeError(f"ExecSync true: {r}")
        start = ",".join(sb["start"] for sb in self.api.call("GET", "/v1/sandboxes")) or "-"
        self.cri.call("StopContainer", container_id=cid, timeout=0)
        self.cri.call("RemoveContainer", container_id=cid)
        self.cri.call("StopPodSandbox", pod_sandbox_id=pod)
        self.cri.call("RemovePodSandbox", pod_sandbox_id=pod)
        return running, answers, start

    def pool_shape(self):
        """The pod image's airlock image and the shape the shim creates it with (from one pod)."""
        seen = {}

        def watch():
            for sb in self.api.call("GET", "/v1/sandboxes"):
                seen.update(image=sb["image"], disk_mb=sb["disk_mb"])
        pb = self.pb
        config = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name="shape", uid="uid-shape", namespace="d"),
                                     log_directory=os.path.join(self.tmp, "pods"),
                                     linux=pb.LinuxPodSandboxConfig(security_context=pb.LinuxSandboxSecurityContext(
                                         namespace_options=pb.NamespaceOption(network=pb.NODE))))
        pod = self.cri.call("RunPodSandbox", config=config, runtime_handler="airlock").pod_sandbox_id
        watch()
        self.cri.call("StopPodSandbox", pod_sandbox_id=pod)
        self.cri.call("RemovePodSandbox", pod_sandbox_id=pod)
        return seen

    def set_pool(self, shape, size):
        self.api.call("PUT", "/v1/pool", dict(shape, size=size))
        deadline = time.time() + 120
        while time.time() < deadline:
            slots = [s for s in self.api.call("GET", "/v1/pool") if s["image"] == shape["image"]]
            if size == 0 and not slots or slots and slots[0]["ready"] >= size:
                return slots
            time.sleep(0.2)
        raise RuntimeError("the pool did not fill")

    def close(self):
        self.cri.close()
        self.ctd.stop()
        for sb in self.api.call("GET", "/v1/sandboxes"):
            self.api.delete(sb["id"])
        self.daemon.terminate()
        self.daemon.wait(timeout=30)
        self.daemon_log.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    why = cri_client.missing()
    if why or not cri_harness.have_containerd():
        sys.exit(why or "containerd, ctr and runc are needed")
    tmp = tempfile.mkdtemp(prefix="airlock-cri-bench-")
    b = None
    try:
        b = Bench(tmp)
        shape = b.pool_shape()  # imports the pod image, makes its template
        b.pod("airlock")  # and the app image's first copy path, once
        results = {"runc": [], "airlock miss": [], "airlock hit": []}
        starts = {k: [] for k in results}
        for _ in range(args.runs):
            for mode in results:
                if mode == "airlock hit":
                    b.set_pool(shape, 1)
                running, answers, start = b.pod("runc" if mode == "runc" else "airlock")
                if mode == "airlock hit":
                    b.set_pool(shape, 0)
                results[mode].append((running, answers))
                starts[mode].append(start)
        print(f"CRI RunPodSandbox -> container running, medians of {args.runs} runs (ms)")
        print(f"{'':14} {'running':>8} {'answers':>8}  VM start")
        for mode, rs in results.items():
            med = [statistics.median(x[i] for x in rs) * 1000 for i in (0, 1)]
            print(f"{mode:14} {med[0]:8.0f} {med[1]:8.0f}  {','.join(sorted(set(starts[mode])))}")
    finally:
        if b:
            b.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

"""deploy/kubernetes/ parses, and its parts agree with each other and with
the shim: the RuntimeClass's handler is containerd's runtime name, whose
runtime_type is the shim's runtime, the ConfigPath file names airlockd's
socket as the unit starts it, the template's annotations are ones the shim
reads, the warm pool names the template; containerd itself accepts the
runtime's config (`containerd config dump`). No cluster is needed (none
runs here); what this does not prove is listed in deploy/kubernetes/README.md."""

import os
import re
import shutil
import subprocess
import tempfile
import tomllib
import unittest

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY = os.path.join(ROOT, "deploy", "kubernetes")
SHIM_SRC = os.path.join(ROOT, "shim")


def load_yaml(name):
    with open(os.path.join(DEPLOY, name)) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    assert len(docs) == 1, name
    return docs[0]


def load_toml(name):
    with open(os.path.join(DEPLOY, name), "rb") as f:
        return tomllib.load(f)


def shim_source():
    text = ""
    for name in sorted(os.listdir(SHIM_SRC)):
        if name.endswith(".go") and not name.endswith("_test.go"):
            with open(os.path.join(SHIM_SRC, name)) as f:
                text += f.read()
    return text


def quantity_bytes(q):
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi)?", q)
    assert m, q
    return int(m.group(1)) * units.get(m.group(2), 1)


class ManifestTest(unittest.TestCase):
    def runtime(self):
        cfg = load_toml("containerd-config.toml")
        return cfg["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]

    def test_runtime_class_names_the_containerd_runtime_of_the_shim(self):
        rc = load_yaml("runtimeclass.yaml")
        self.assertEqual((rc["apiVersion"], rc["kind"]), ("node.k8s.io/v1", "RuntimeClass"))
        runtimes = self.runtime()
        self.assertIn(rc["handler"], runtimes)
        rtype = runtimes[rc["handler"]]["runtime_type"]
        self.assertIn(f'runtimeName = "{rtype}"', shim_source())
        # The VM's own cost: at least QEMU's translation-cache cap (128 MiB) and QEMU.
        fixed = rc["overhead"]["podFixed"]
        self.assertGreaterEqual(quantity_bytes(fixed["memory"]), 256 << 20)
        self.assertRegex(fixed["cpu"], r"^\d+m?$")

    def test_shim_config_names_the_socket_airlockd_serves(self):
        opts = self.runtime()["airlock"]["options"]
        self.assertEqual(os.path.basename(opts["ConfigPath"]), "containerd-shim.toml")
        socket = load_toml("containerd-shim.toml")["socket"]
        self.assertTrue(os.path.isabs(socket))
        with open(os.path.join(DEPLOY, "airlockd.service")) as f:
            unit = f.read()
        start = [l for l in unit.splitlines() if l.startswith("ExecStart=")]
        self.assertEqual(len(start), 1)
        self.assertIn("--socket " + socket, start[0])
        # The shim's own default is the same path.
        self.assertIn(f'defaultSocket = "{socket}"', shim_source())

    def test_template_and_warm_pool(self):
        tpl = load_yaml("sandbox-template.yaml")
        pool = load_yaml("warm-pool.yaml")
        for d in (tpl, pool):
            self.assertEqual(d["apiVersion"], "extensions.agents.x-k8s.io/v1beta1")
        self.assertEqual((tpl["kind"], pool["kind"]), ("SandboxTemplate", "SandboxWarmPool"))
        pod = tpl["spec"]["podTemplate"]
        self.assertEqual(pod["spec"]["runtimeClassName"], load_yaml("runtimeclass.yaml")["metadata"]["name"])
        self.assertEqual(pool["spec"]["sandboxTemplateRef"]["name"], tpl["metadata"]["name"])
        self.assertGreaterEqual(pool["spec"]["replicas"], 1)
        # Every airlock.dev/ annotation is one the shim reads, and containerd lets it through.
        src = shim_source()
        for key in pod["metadata"]["annotations"]:
            self.assertTrue(key.startswith("airlock.dev/"), key)
            self.assertIn(f'"{key}"', src, f"the shim does not read {key}")
        self.assertIn("airlock.dev/*", self.runtime()["airlock"]["pod_annotations"])

    @unittest.skipUnless(shutil.which("containerd"), "containerd is not installed (scripts/setup.sh installs it)")
    def test_containerd_accepts_the_runtime_config(self):
        with tempfile.TemporaryDirectory(prefix="airlock-ctdcfg-") as d:
            with open(os.path.join(DEPLOY, "containerd-config.toml")) as f:
                body = f.read()
            path = os.path.join(d, "config.toml")
            with open(path, "w") as f:
                f.write(body.replace("version = 2\n", f'version = 2\nroot = "{d}/root"\nstate = "{d}/state"\n', 1))
            r = subprocess.run(["containerd", "--config", path, "config", "dump"], capture_output=True,
                               text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            dumped = tomllib.loads(r.stdout)
            rt = dumped["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["airlock"]
            self.assertEqual(rt["runtime_type"], "io.containerd.airlock.v2")
            self.assertEqual(rt["options"]["ConfigPath"], self.runtime()["airlock"]["options"]["ConfigPath"])


if __name__ == "__main__":
    unittest.main()

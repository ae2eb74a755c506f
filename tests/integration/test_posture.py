"""The QEMU jail, read back through the daemon: GET /v1/sandboxes/{id}/posture
and `airlock inspect ID --posture`.

As root (as here) every protection of the jail must be in force; any one
missing fails the test. Not root: the posture must name what is missing.
"""

import json
import os
import subprocess
import unittest

from harness import BIN, DaemonTestCase, cgroup_dirs_for

ROOT = os.geteuid() == 0
NAMESPACES = ["mnt", "pid", "ipc", "uts", "net"]


class PostureTest(DaemonTestCase):
    def test_the_jail_is_in_force_and_read_back_from_proc(self):
        sb = self.api.create(image="minimal", memory_mb=256, cpus=1)
        sid = sb["id"]
        try:
            p = self.api.call("GET", f"/v1/sandboxes/{sid}/posture")
            proc = p["process"]
            self.assertEqual(proc["pid"], sb["pid"])
            self.assertIn(p["isolation"], ("kvm", "tcg"))
            self.assertEqual(p["isolation"], sb["accel"])
            if p["isolation"] == "tcg":
                self.assertIn("not treat TCG as a security boundary", p["note"])
            # QEMU's own seccomp filter and no_new_privs: root or not.
            self.assertEqual(proc["seccomp"], 2, proc)
            self.assertTrue(proc["no_new_privs"], proc)
            self.assertEqual(proc["rlimits"]["core"]["hard"], 0)
            if not ROOT:
                self.assertIn("uid", p["missing"])
                return
            self.assertEqual(p["jail"], "full")
            # Nothing missing, clones included: a clone maps its template's
            # RAM as a write-sealed memfd (read back from the QEMU process).
            self.assertEqual(p["missing"], [], json.dumps(p, indent=2))
            self.assertNotEqual(proc["uid"]["effective"], 0)
            self.assertNotEqual(proc["uid"]["real"], 0)
            self.assertNotEqual(proc["gid"]["effective"], 0)
            self.assertEqual(int(proc["capabilities"]["effective"], 16), 0)
            self.assertEqual(int(proc["capabilities"]["bounding"], 16), 0)
            for ns in NAMESPACES:
                self.assertTrue(proc["namespaces"][ns]["own"], f"{ns} namespace shared with the daemon")
                self.assertNotEqual(proc["namespaces"][ns]["id"], os.readlink(f"/proc/self/ns/{ns}"))
            self.assertTrue(proc["root"]["own"], "QEMU sees the host's /")
            for host_dir in ("home", "root", "sys", "var", "boot"):
                self.assertNotIn(host_dir, proc["root"]["entries"])
            if "proc" in proc["root"]["entries"]:
                # Only a clone's (to open its sealed RAM as /proc/self/fd/4):
                # its own pid namespace, processes only (subset=pid).
                self.assertNotEqual(sb.get("start"), "boot", sb)
                seen = os.listdir(f"/proc/{sb['pid']}/root/proc")
                self.assertTrue(all(e.isdigit() or e in ("self", "thread-self") for e in seen), seen)
                self.assertNotIn("sys", seen)
            cg = proc["cgroup"]
            # 256 MiB guest + the TCG translation-cache cap (128 MiB) + 256 MiB + 25 %.
            self.assertEqual(cg["memory_max"], (256 + 128 + 256 + 64) << 20, cg)
            self.assertEqual(cg["pids_max"], 1024)
            self.assertEqual(cg["cpu_max"], "100000 100000")
            self.assertEqual(len(cgroup_dirs_for(sid)), len(set(cg["paths"].values())))

            # The CLI shows the same, readable and as JSON.
            env = dict(os.environ)
            out = subprocess.run([os.path.join(BIN, "airlock"), "--socket", self.sock, "inspect", sid,
                                  "--posture"], capture_output=True, text=True, env=env, timeout=60)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertIn("missing: " + (", ".join(p["missing"]) or "none"), out.stdout)
            self.assertIn("seccomp: filter", out.stdout)
            out = subprocess.run([os.path.join(BIN, "airlock"), "--socket", self.sock, "inspect", sid,
                                  "--posture", "--json"], capture_output=True, text=True, env=env, timeout=60)
            self.assertEqual(json.loads(out.stdout)["missing"], p["missing"])
            out = subprocess.run([os.path.join(BIN, "airlock"), "--socket", self.sock, "inspect", sid],
                                 capture_output=True, text=True, env=env, timeout=60)
            self.assertEqual(json.loads(out.stdout)["id"], sid)
            # The jailed VM works as any other.
            _, _, ex = self.api.exec(sid, argv=["sh", "-c", "echo jailed-ok"])
            self.assertEqual(ex["exit_code"], 0)
        finally:
            self.api.delete(sid)
        self.assertNothingLeft(sid)

    def test_posture_of_an_unknown_sandbox_is_404(self):
        from harness import ApiError
        with self.assertRaises(ApiError) as ctx:
            self.api.call("GET", "/v1/sandboxes/sb-nosuch/posture")
        self.assertEqual(ctx.exception.status, 404)


if __name__ == "__main__":
    unittest.main()

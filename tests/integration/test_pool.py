"""The warm pool's hand-out and the background delete (issue 13), on real VMs.

Behaviour only (speed lives in bench/start.py): a pool hit is a running
sandbox of its own, recorded in the journal; a delete answers with the
sandbox out of service, and its teardown finishes in the background leaving
nothing behind, also when the daemon is stopped while teardowns are pending.
Also: one slot per shape (a plain and a networked slot of one image), the
learned pool (a used shape learned, bounded by its memory budget, forgotten
when idle), and a member's clock set at hand-out. About 1.5-2 minutes under
TCG.
"""

import glob
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

import harness
import test_network as tn  # its little internet (module import: its tests do not run here)


def wait_pool(api, n, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        slots = api.call("GET", "/v1/pool")
        if sum(s["ready"] for s in slots) >= n:
            return slots
        time.sleep(0.1)
    raise AssertionError(f"the pool did not reach {n} ready members")


def journal(data_dir, sid):
    with open(os.path.join(data_dir, "audit", sid + ".jsonl")) as f:
        return [json.loads(ln) for ln in f if ln.strip()]


class PoolHandOut(harness.DaemonTestCase):
    daemon_args = ["--pool", "minimal=2"]

    def test_hand_out_is_a_running_sandbox_of_its_own(self):
        slots = wait_pool(self.api, 2)
        members = slots[0]["members"]
        sb = self.api.create(image="minimal", env={"GREETING": "hi"})
        self.assertEqual(sb["start"], "pool")
        self.assertEqual(sb["state"], "running")
        self.assertIn(harness.pool_member_of(self.data_dir, sb["id"]), members)
        # Out of the pool at once: never handed out twice.
        self.assertNotIn(sb["id"], self.api.call("GET", "/v1/pool")[0]["members"])
        sb2 = self.api.create(image="minimal")
        self.assertNotEqual(sb2["id"], sb["id"])
        out, _, res = self.api.exec(sb["id"], argv=["sh", "-c", "echo $GREETING"])
        self.assertEqual((res["exit_code"], out), (0, b"hi\n"))
        # The hand-out is on record (written without fsync: design.md says
        # why that is crash-safe): the member's journal, from `pooled`, ends
        # with the id it became; the sandbox's starts with its `created`.
        member = harness.pool_member_of(self.data_dir, sb["id"])
        events = journal(self.data_dir, member)
        self.assertLess([r["event"] for r in events].index("pooled"), len(events) - 1)
        self.assertEqual((events[-1]["event"], events[-1]["id"]), ("handed_out", sb["id"]))
        self.assertEqual(journal(self.data_dir, sb["id"])[0]["event"], "created")
        for s in (sb, sb2):
            self.api.delete(s["id"])
            self.assertNothingLeft(s["id"])

    def test_the_id_of_a_pool_hit_is_minted_at_hand_out(self):
        """Before, a member had its public id from the moment it was made, so
        the operator's views (and anything that leaked them) showed the id a
        later create returned. Now the member has an internal name until its
        hand-out mints the id; the sandbox is re-adopted under it."""
        wait_pool(self.api, 2)
        seen = json.dumps([self.api.call("GET", "/v1/info"), self.api.call("GET", "/v1/pool"),
                           self.api.call("GET", "/v1/sandboxes?all=true")])
        for base, dirs, files in os.walk(self.data_dir):
            seen += " ".join(dirs + files)
        members = [m for s in self.api.call("GET", "/v1/pool") for m in s["members"]]
        sb = self.api.create(image="minimal")
        self.assertEqual(sb["start"], "pool")
        self.assertNotIn(sb["id"], seen)
        self.assertTrue(all(m.startswith("pool-") for m in members), members)
        self.assertIn(harness.pool_member_of(self.data_dir, sb["id"]), members)
        out, _, res = self.api.exec(sb["id"], argv=["cat", "/proc/sys/kernel/hostname"])
        self.assertEqual((res["exit_code"], out), (0, sb["id"].encode() + b"\n"))
        # A restarted daemon re-adopts it under its public id.
        self.daemon.send_signal(signal.SIGTERM)
        self.daemon.wait(timeout=60)
        type(self).start_daemon()
        got = self.api.call("GET", f"/v1/sandboxes/{sb['id']}")
        self.assertEqual((got["state"], got["start"]), ("running", "pool"), got)
        self.assertIn(sb["id"], [s["id"] for s in self.api.call("GET", "/v1/sandboxes")])
        out, _, res = self.api.exec(sb["id"], argv=["cat", "/proc/sys/kernel/hostname"])
        self.assertEqual((res["exit_code"], out), (0, sb["id"].encode() + b"\n"))
        self.assertIn("adopted", [r["event"] for r in journal(self.data_dir, sb["id"])])
        self.api.delete(sb["id"])
        self.assertNothingLeft(sb["id"])
        wait_pool(self.api, 2)  # refilled for the class's other tests

    def test_members_yield_the_cpu_until_their_hand_out(self):
        # A member's QEMU runs under a low cpu weight (a refill yields to
        # sandboxes in use); the hand-out gives it the default, read back
        # from its cgroup's files and from the posture endpoint.
        def weight(sid):
            for d in harness.cgroup_dirs_for(sid):
                for name, scale in (("cpu.weight", 1), ("cpu.shares", 100 / 1024)):
                    path = os.path.join(d, name)
                    if os.path.exists(path):
                        with open(path) as f:
                            return round(int(f.read()) * scale)
            return None
        slots = wait_pool(self.api, 2)
        members = slots[0]["members"]
        if weight(members[0]) is None:
            self.skipTest("no cpu controller for the jail here")
        for m in members:
            self.assertEqual(weight(m), 10, m)
        sb = self.api.create(image="minimal")
        self.assertEqual(sb["start"], "pool")
        self.assertEqual(weight(harness.pool_member_of(self.data_dir, sb["id"])), 100)
        posture = self.api.call("GET", f"/v1/sandboxes/{sb['id']}/posture")
        self.assertEqual(posture["process"]["cgroup"]["cpu_weight"], 100, posture)
        self.api.delete(sb["id"])
        self.assertNothingLeft(sb["id"])

    def test_two_hand_outs_have_their_own_identity(self):
        wait_pool(self.api, 2)
        probe = ("cat /proc/sys/kernel/hostname; cat /etc/machine-id; "
                 "head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n'; echo; date +%s")
        seen = []
        for _ in range(2):
            sb = self.api.create(image="minimal")
            self.assertEqual(sb["start"], "pool")
            out, _, res = self.api.exec(sb["id"], argv=["sh", "-c", probe])
            self.assertEqual(res["exit_code"], 0, out)
            host, mid, rnd, clock = out.decode().split("\n")[:4]
            # The guest clock is the host's (reseeded), not the template's.
            self.assertLess(abs(int(clock) - time.time()), 120)
            self.assertEqual(host, sb["id"])
            seen.append((host, mid, rnd))
            self.api.delete(sb["id"])
            wait_pool(self.api, 1)
        for a, b, what in zip(seen[0], seen[1], ("hostname", "machine-id", "RNG")):
            self.assertNotEqual(a, b, what)

    def test_cli_shows_the_pool_and_refuses_an_image_without_a_size(self):
        wait_pool(self.api, 2)
        env = dict(os.environ, AIRLOCK_SOCKET=self.sock, AIRLOCK_DATA_DIR=self.data_dir)
        cli = os.path.join(harness.BIN, "airlock")
        r = subprocess.run([cli, "pool"], env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout, r"^minimal \(1 cpu, 256M, disk \d+M\): \d+/2 ready, \d+ hits")
        r = subprocess.run([cli, "pool", "--json"], env=env, capture_output=True, text=True,
                           timeout=60)
        self.assertEqual([(s["image"], s["target"]) for s in json.loads(r.stdout)], [("minimal", 2)])
        r = subprocess.run([cli, "pool", "minimal"], env=env, capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(r.returncode, 2)
        self.assertIn("pool IMAGE needs a SIZE", r.stderr)


class BackgroundDelete(harness.DaemonTestCase):
    daemon_args = ["--pool", "minimal=1"]  # background delete is the default

    def test_delete_answers_at_once_and_teardown_completes(self):
        wait_pool(self.api, 1)
        sb = self.api.create(image="minimal")
        self.api.delete(sb["id"], wait=False)
        # Gone from the API the moment DELETE answered: `deleted`, not listed,
        # an exec refused, a second delete a conflict, though the teardown
        # may still run.
        self.assertEqual(self.api.call("GET", f"/v1/sandboxes/{sb['id']}")["state"], "deleted")
        self.assertNotIn(sb["id"], [s["id"] for s in self.api.call("GET", "/v1/sandboxes")])
        with self.assertRaises(harness.ApiError) as cm:
            self.api.exec(sb["id"], argv=["true"])
        self.assertEqual(cm.exception.status, 409)
        with self.assertRaises(harness.ApiError) as cm:
            self.api.delete(sb["id"])
        self.assertEqual(cm.exception.status, 409)
        # The journal's `deleted` record is written when the teardown is done:
        # then nothing of the sandbox may remain.
        deadline = time.time() + 60
        while journal(self.data_dir, sb["id"])[-1]["event"] != "deleted" and time.time() < deadline:
            time.sleep(0.05)
        self.assertEqual(journal(self.data_dir, sb["id"])[-1]["event"], "deleted")
        self.assertEqual(harness.leftovers_of(self.data_dir, sb["id"], wait=0), [])

    def test_delete_with_wait_answers_once_all_is_gone(self):
        sb = self.api.create(image="minimal")
        with self.assertRaises(harness.ApiError) as cm:
            self.api.call("DELETE", f"/v1/sandboxes/{sb['id']}?wait=soon")
        self.assertEqual(cm.exception.status, 400)
        self.assertIn("wait must be true or false", str(cm.exception))
        self.api.call("DELETE", f"/v1/sandboxes/{sb['id']}?wait=true")
        # No polling: the answer itself means the teardown is complete.
        self.assertEqual(harness.leftovers_of(self.data_dir, sb["id"], wait=0), [])
        self.assertEqual(journal(self.data_dir, sb["id"])[-1]["event"], "deleted")

    def test_daemon_stop_finishes_pending_teardowns(self):
        ids = []
        for _ in range(3):
            ids.append(self.api.create(image="minimal")["id"])
        for sid in ids:
            self.api.delete(sid, wait=False)
        # Stop the daemon while (some of) the teardowns are still queued.
        self.daemon.send_signal(signal.SIGTERM)
        self.daemon.wait(timeout=60)
        for sid in ids:
            self.assertEqual(harness.leftovers_of(self.data_dir, sid, wait=0), [])
            self.assertEqual(journal(self.data_dir, sid)[-1]["event"], "deleted")
        type(self).start_daemon()
        for sid in ids:
            self.assertEqual(self.api.call("GET", f"/v1/sandboxes/{sid}")["state"], "deleted")


class SyncDelete(harness.DaemonTestCase):
    daemon_args = ["--sync-delete"]

    def test_every_delete_answers_once_all_is_gone(self):
        sb = self.api.create(image="minimal")
        self.api.delete(sb["id"], wait=False)
        self.assertEqual(harness.leftovers_of(self.data_dir, sb["id"], wait=0), [])
        self.assertEqual(journal(self.data_dir, sb["id"])[-1]["event"], "deleted")


@unittest.skipIf(tn.can_run(), f"networked pool test skipped: {tn.can_run()}")
class NetworkedPool(harness.DaemonTestCase):
    """Members with a NIC under deny-everything serve networked creates; the
    caller's policy is in force when the create returns. The daemon runs in
    a namespace of the test's own (test_network's little internet)."""

    daemon_prefix = ["ip", "netns", "exec", tn.NS_H]
    servers = []

    @classmethod
    def setUpClass(cls):
        try:
            tn.NetworkTest.make_internet.__func__(cls)
            os.environ["AIRLOCK_NET_DNS_UPSTREAM"] = tn.DNS
            super().setUpClass()
        except BaseException:
            tn.NetworkTest.remove_internet.__func__(cls)
            raise

    @classmethod
    def tearDownClass(cls):
        try:
            super().tearDownClass()
        finally:
            os.environ.pop("AIRLOCK_NET_DNS_UPSTREAM", None)
            tn.NetworkTest.remove_internet.__func__(cls)

    def test_plain_and_networked_pools_of_one_image_each_serve_their_shape(self):
        slots = self.api.call("PUT", "/v1/pool", {"image": "minimal", "size": 1, "network": True})
        self.assertTrue(slots[0]["shape"]["network"])
        # A second shape of the same image: a slot of its own beside the first.
        slots = self.api.call("PUT", "/v1/pool", {"image": "minimal", "size": 1})
        self.assertEqual(sorted((s["shape"]["network"], s["target"], s["learned"]) for s in slots),
                         [(False, 1, False), (True, 1, False)])
        slots = wait_pool(self.api, 2)
        member = {s["shape"]["network"]: s["members"][0] for s in slots}
        policy = {"mode": "allowlist", "allow": ["198.51.100.10/32"]}
        sb = self.api.create(image="minimal", network=policy)
        self.assertEqual(sb["start"], "pool")
        self.assertEqual(harness.pool_member_of(self.data_dir, sb["id"]), member[True])
        # At once, with no wait: the allowed host answers (deny-everything
        # would have refused it), its neighbour is refused.
        out, _, res = self.api.exec(sb["id"], cmd="wget -q -O - http://198.51.100.10/")
        self.assertEqual((res["exit_code"], out), (0, b"hello 198.51.100.10\n"))
        out, _, res = self.api.exec(sb["id"], cmd="nc -w 20 198.51.100.11 80 </dev/null 2>&1")
        self.assertNotEqual(res["exit_code"], 0, out)
        self.assertIn(b"refused", out.lower())
        # The policy is on record before the hand-out (in the member's
        # journal: it was in force before the sandbox had its id).
        events = journal(self.data_dir, member[True])
        kinds = [r["event"] for r in events]
        at = kinds.index("net_policy")
        self.assertEqual(events[at]["policy"]["allow"], ["198.51.100.10/32"])
        self.assertLess(at, kinds.index("handed_out"))
        # The helper's reports after the hand-out are the sandbox's, under
        # its public id (its reader was re-attached at hand-out).
        deadline = time.time() + 30
        while time.time() < deadline and not any(
                r["event"] == "net_flow_end" and r.get("dst") == "198.51.100.10"
                for r in journal(self.data_dir, sb["id"])):
            time.sleep(0.2)
        flows = [r for r in journal(self.data_dir, sb["id"]) if r["event"].startswith("net_flow")]
        self.assertTrue(any(r.get("dst") == "198.51.100.10" for r in flows),
                        journal(self.data_dir, sb["id"]))
        self.assertEqual(self.api.call("GET", f"/v1/sandboxes/{sb['id']}")["network"]["allow"],
                         ["198.51.100.10/32"])
        # A create without network gets the plain slot's member: no NIC.
        plain = self.api.create(image="minimal")
        self.assertEqual((plain["start"], harness.pool_member_of(self.data_dir, plain["id"])),
                         ("pool", member[False]))
        out, _, res = self.api.exec(plain["id"], cmd="ls /sys/class/net")
        self.assertEqual((res["exit_code"], out.split()), (0, [b"lo"]))
        self.api.call("PUT", "/v1/pool", {"image": "minimal", "size": 0, "network": True})
        self.assertEqual([s["shape"]["network"] for s in self.api.call("GET", "/v1/pool")], [False])
        for s in (sb, plain):
            self.api.delete(s["id"])
            self.assertNothingLeft(s["id"])


class LearnedPool(harness.DaemonTestCase):
    """No pool configured: the pool learns the shapes creates use, within a
    memory budget (300 MiB: one 256 MiB member, or 256 + 128 is over), and
    forgets a shape unused for 20 s."""

    daemon_args = ["--pool-learn", "2", "--pool-learn-memory-mb", "300",
                   "--pool-learn-idle-s", "20"]

    def test_a_used_shape_is_learned_bounded_and_forgotten(self):
        self.assertEqual(self.api.call("GET", "/v1/info")["pool_learn"],
                         {"shapes": 2, "memory_mb": 300, "idle_s": 20})
        self.assertEqual(self.api.call("GET", "/v1/pool"), [])
        a = self.api.create(image="minimal")
        self.assertNotEqual(a["start"], "pool")
        [slot] = self.api.call("GET", "/v1/pool")
        self.assertEqual((slot["learned"], slot["target"], slot["misses"], slot["shape"]["memory_mb"]),
                         (True, 1, 1, 256))
        self.api.delete(a["id"])
        wait_pool(self.api, 1)
        # The second create of the shape is a hit.
        b = self.api.create(image="minimal")
        self.assertEqual(b["start"], "pool")
        self.api.delete(b["id"])
        [slot] = wait_pool(self.api, 1)  # refilled
        old_member = slot["members"][0]
        # Over the budget with both: the least recently used shape goes, its
        # member deleted.
        c = self.api.create(image="minimal", memory_mb=128)
        self.assertNotEqual(c["start"], "pool")
        self.assertEqual([(s["shape"]["memory_mb"], s["learned"])
                          for s in self.api.call("GET", "/v1/pool")], [(128, True)])
        self.assertEqual(harness.leftovers_of(self.data_dir, old_member, wait=30), [])
        self.api.delete(c["id"])
        [slot] = wait_pool(self.api, 1)
        member = slot["members"][0]
        # Unused for 20 s: forgotten, and nothing of its member is left.
        deadline = time.time() + 120
        while self.api.call("GET", "/v1/pool") and time.time() < deadline:
            time.sleep(0.5)
        self.assertEqual(self.api.call("GET", "/v1/pool"), [])
        self.assertEqual(harness.leftovers_of(self.data_dir, member, wait=30), [])
        for s in (a, b, c):
            self.assertNothingLeft(s["id"])


class WarmUp(harness.DaemonTestCase):
    """An image's declared warm-up runs in its template before the save and
    in every pool member before it is ready. The image: minimal's files
    installed as "warm" with a warm-up that notes the hostname it ran under
    (the template's, then the member's) in a file clones inherit."""

    daemon_args = ["--pool", "warm=1"]

    @classmethod
    def setUpClass(cls):
        metas = glob.glob(os.path.join(harness.IMAGE_DIR, "minimal", "*", "image.json"))
        src = os.path.dirname(max(metas, key=os.path.getmtime))
        cls.images = tempfile.mkdtemp(prefix="warm-images-", dir=os.path.dirname(harness.IMAGE_DIR))
        ver = os.path.join(cls.images, "warm", "v1")
        os.makedirs(ver)
        for f in ("vmlinuz", "initrd.img", "rootfs.ext4"):
            try:
                os.link(os.path.join(src, f), os.path.join(ver, f))
            except OSError:
                shutil.copy2(os.path.join(src, f), os.path.join(ver, f))
        with open(os.path.join(src, "image.json")) as f:
            meta = json.load(f)
        meta.update(kind="installed", source="test",
                    config={"warmup": ["cat /proc/sys/kernel/hostname >> /tmp/warm.log",
                                       # far off: the hand-out must set it right
                                       "date -s @1000000000 >/dev/null"]})
        with open(os.path.join(ver, "image.json"), "w") as f:
            json.dump(meta, f)
        os.symlink("v1", os.path.join(cls.images, "warm", "current"))
        cls.saved_image_dir, harness.IMAGE_DIR = harness.IMAGE_DIR, cls.images
        try:
            super().setUpClass()
        finally:
            harness.IMAGE_DIR = cls.saved_image_dir

    @classmethod
    def tearDownClass(cls):
        try:
            super().tearDownClass()
        finally:
            shutil.rmtree(cls.images, ignore_errors=True)

    def test_template_then_member_ran_the_warmup(self):
        wait_pool(self.api, 1)
        sb = self.api.create(image="warm")
        self.assertEqual(sb["start"], "pool")
        out, _, res = self.api.exec(sb["id"], argv=["cat", "/tmp/warm.log"])
        self.assertEqual(res["exit_code"], 0, out)
        member = harness.pool_member_of(self.data_dir, sb["id"])
        self.assertEqual(out.decode().split(), ["airlock-template", member])
        # The warm-up set the member's clock to 2001; the hand-out set it to
        # the host's before the first exec.
        out, _, res = self.api.exec(sb["id"], argv=["date", "+%s"])
        self.assertEqual(res["exit_code"], 0, out)
        self.assertLess(abs(int(out) - time.time()), 10, out)
        kinds = [r["event"] for r in journal(self.data_dir, member)]
        between = kinds[kinds.index("pooled") + 1:kinds.index("handed_out")]
        self.assertEqual(between, ["pool_warmup", "pool_warmup"])
        self.api.call("PUT", "/v1/pool", {"image": "warm", "size": 0})
        self.api.delete(sb["id"])
        self.assertNothingLeft(sb["id"])


if __name__ == "__main__":
    unittest.main()

"""Attacks of one tenant on the walls between tenants, through the real
daemon's TCP listener with two tenants (tokens made over the unix socket),
on real VMs (minimal image).

Each test names the hole it closes; each failed on the code before the fix:
paused sandboxes counted against no quota, a resume reserved nothing, a
create from a snapshot reserved what its body said, any tenant could start
from, diff against or boot the image of a snapshot taken of another
tenant's sandbox, /v1/info showed a tenant the data dir, the pool's
member ids and every template, parallel `changes` calls filled the host's
disk with scratch copies, and a create that did not fit named the data dir.
"""

import os
import shutil
import subprocess
import threading
import time
import unittest

from harness import ApiError, TcpClient, TcpDaemonTestCase


def error_of(fn):
    """The ApiError fn raises (status, code, message, field)."""
    try:
        fn()
    except ApiError as e:
        return (e.status, e.code, e.message, e.field)
    raise AssertionError("no error")


class TenantAttackTest(TcpDaemonTestCase):
    def tenant(self, name, **quota):
        """A TCP client of a new token of tenant `name` with that quota."""
        self.api.call("PUT", f"/v1/tenants/{name}", quota)
        return TcpClient("127.0.0.1", self.port, self.new_token(name)[0])

    def wait_gone(self, client, sid):
        deadline = time.time() + 60
        while client.call("GET", f"/v1/sandboxes/{sid}")["state"] != "deleted":
            self.assertLess(time.time(), deadline, f"{sid} was not deleted")
            time.sleep(0.05)

    def assertSameAsMissing(self, call, theirs, missing="no-such-name"):
        """call(theirs) fails exactly as call(missing) does, name for name."""
        got, want = error_of(lambda: call(theirs)), error_of(lambda: call(missing))
        want = tuple(x.replace(missing, theirs) if isinstance(x, str) else x for x in want)
        self.assertEqual(got, want, theirs)

    def wait_state(self, client, sid, state, timeout=60):
        deadline = time.time() + timeout
        while client.call("GET", f"/v1/sandboxes/{sid}")["state"] != state:
            self.assertLess(time.time(), deadline, f"{sid} never became {state}")
            time.sleep(0.2)

    def test_paused_sandboxes_hold_their_quota(self):
        """create -> pause -> create used to give a max_sandboxes=1 tenant as
        many sandboxes as it liked; a resume now reserves like a create."""
        c = self.tenant("pauser", max_sandboxes=1)
        a = c.create(image="minimal", timeout=600)["id"]
        self.assertEqual(c.call("POST", f"/v1/sandboxes/{a}/pause")["state"], "paused")
        status, code, message, field = error_of(lambda: c.create(image="minimal"))
        self.assertEqual((status, code, field), (429, "quota_exceeded", "max_sandboxes"))
        # The quota lowered while it was paused: the resume is refused the
        # same way and the sandbox stays paused, whole.
        self.api.call("PUT", "/v1/tenants/pauser", {"max_sandboxes": 1, "max_memory_mb": 128})
        status, code, message, field = error_of(lambda: c.call("POST", f"/v1/sandboxes/{a}/resume"))
        self.assertEqual((status, code, field), (429, "quota_exceeded", "max_memory_mb"))
        self.assertEqual(c.call("GET", f"/v1/sandboxes/{a}")["state"], "paused")
        self.api.call("PUT", "/v1/tenants/pauser", {"max_sandboxes": 1})
        self.assertEqual(c.call("POST", f"/v1/sandboxes/{a}/resume")["state"], "running")
        self.assertEqual(c.exec(a, argv=["echo", "back"])[0], b"back\n")
        # The audit log has the refused resume and the one that went through.
        with open(f"{self.data_dir}/audit.jsonl") as f:
            outcomes = [l for l in f if '"resume_sandbox"' in l and a in l]
        self.assertTrue(any("quota_exceeded" in l for l in outcomes), outcomes)
        self.assertTrue(any("sandbox_resumed" in l for l in outcomes), outcomes)
        c.delete(a)
        self.wait_gone(c, a)

    def test_idle_pause_is_no_way_around_the_quota(self):
        c = self.tenant("idler", max_sandboxes=1)
        a = c.create(image="minimal", timeout=600, idle_timeout=2, on_idle="pause")["id"]
        self.wait_state(c, a, "paused")
        status, code, _, field = error_of(lambda: c.create(image="minimal"))
        self.assertEqual((status, code, field), (429, "quota_exceeded", "max_sandboxes"))
        c.delete(a)
        self.wait_gone(c, a)

    def test_snapshots_and_their_images_belong_to_their_tenant(self):
        alice, bob = self.tenant("alice"), self.tenant("bob")
        a = alice.create(image="minimal", timeout=600)["id"]
        alice.exec(a, cmd="echo secret > /root/alice.txt; sync")
        # A snapshot of alice's sandbox, taken by her, and one the operator
        # takes of it: both are alice's.
        snap = alice.call("POST", f"/v1/sandboxes/{a}/snapshots", {"name": "alice-env"})
        self.assertEqual(snap["tenant"], "alice")
        op = self.api.call("POST", f"/v1/sandboxes/{a}/snapshots", {"name": "alice-op"})
        self.assertEqual(op["tenant"], "alice")
        # The operator's own snapshot of its own sandbox is the operator's.
        o = self.api.create(image="minimal", timeout=600)["id"]
        self.assertNotIn("tenant", self.api.call("POST", f"/v1/sandboxes/{o}/snapshots",
                                                 {"name": "operator-env"}))
        b = bob.create(image="minimal", timeout=600)["id"]

        names = [s["name"] for s in alice.call("GET", "/v1/snapshots")]
        self.assertEqual(sorted(names), ["alice-env", "alice-op"])
        self.assertEqual(bob.call("GET", "/v1/snapshots"), [])
        for theirs in ["alice-env", "alice-op", "operator-env"]:
            # Each answer to bob is exactly the answer for a missing name.
            for call in [lambda n: bob.call("GET", f"/v1/snapshots/{n}"),
                         lambda n: bob.call("DELETE", f"/v1/snapshots/{n}"),
                         lambda n: bob.call("POST", f"/v1/snapshots/{n}/image", {"name": "stolen"}),
                         lambda n: bob.create(image="minimal", **{"from": n}),
                         lambda n: bob.call("GET", f"/v1/sandboxes/{b}/changes?since={n}")]:
                self.assertSameAsMissing(call, theirs)
        self.assertEqual(error_of(lambda: bob.create(image="minimal", **{"from": "alice-env"}))[:2],
                         (400, "invalid_argument"))
        # Alice may use hers, but not the operator's.
        restored = alice.create(image="minimal", timeout=600, **{"from": "alice-env"})["id"]
        self.assertEqual(alice.exec(restored, argv=["cat", "/root/alice.txt"])[0], b"secret\n")
        self.assertEqual(error_of(lambda: alice.create(image="minimal", **{"from": "operator-env"}))[1],
                         "invalid_argument")
        diff = alice.call("GET", f"/v1/sandboxes/{a}/changes?since=alice-env")
        self.assertEqual(diff["since"], "alice-env")

        # The image saved from alice's snapshot (by the operator, as before
        # the fix was possible) is alice's: bob cannot boot it.
        img = self.api.call("POST", "/v1/snapshots/alice-op/image", {"name": "alice-img"})
        self.assertEqual(img["tenant"], "alice")
        self.assertSameAsMissing(lambda n: bob.create(image=n), "alice-img")
        self.assertNotIn("alice-img", [i["name"] for i in bob.call("GET", "/v1/info")["images"]])
        self.assertIn("alice-img", [i["name"] for i in alice.call("GET", "/v1/info")["images"]])
        mine = alice.create(image="alice-img", timeout=600)["id"]
        self.assertEqual(alice.exec(mine, argv=["cat", "/root/alice.txt"])[0], b"secret\n")

        for sid, client in [(mine, alice), (restored, alice), (a, alice), (b, bob), (o, self.api)]:
            client.delete(sid)
        for sid in [mine, restored, a]:
            self.wait_gone(alice, sid)
        self.wait_gone(bob, b)
        self.wait_gone(self.api, o)
        # The image lives in the shared image dir: its template goes first.
        self.api.call("POST", "/v1/prune")
        self.api.call("DELETE", "/v1/images/alice-img")
        # Alice deletes her own; bob's delete of it was a 404 above.
        alice.call("DELETE", "/v1/snapshots/alice-env")
        self.assertEqual([s["name"] for s in alice.call("GET", "/v1/snapshots")], ["alice-op"])

    def test_a_create_from_a_snapshot_reserves_its_real_size(self):
        """The body said memory_mb 64; a memory snapshot restores with its own
        256 MiB, and that is what the quota holds."""
        c = self.tenant("shaper", max_memory_mb=400)
        a = c.create(image="minimal", timeout=600, memory_mb=256)["id"]
        c.call("POST", f"/v1/sandboxes/{a}/snapshots", {"name": "shaper-mem", "memory": True})
        c.delete(a)
        self.wait_gone(c, a)
        small = c.create(image="minimal", timeout=600, memory_mb=192)["id"]  # 192 of 400 in use
        status, code, message, field = error_of(
            lambda: c.create(image="minimal", memory_mb=64, **{"from": "shaper-mem"}))
        self.assertEqual((status, code, field), (429, "quota_exceeded", "max_memory_mb"))
        self.assertIn("256 asked", message)
        c.delete(small)
        self.wait_gone(c, small)
        restored = c.create(image="minimal", memory_mb=64, **{"from": "shaper-mem"})
        self.assertEqual(restored["memory_mb"], 256)
        c.delete(restored["id"])
        self.wait_gone(c, restored["id"])
        c.call("DELETE", "/v1/snapshots/shaper-mem")

    def test_forks_are_creates(self):
        c = self.tenant("forker", max_sandboxes=2)
        a = c.create(image="minimal", timeout=600)["id"]
        status, code, _, field = error_of(
            lambda: c.call("POST", f"/v1/sandboxes/{a}/fork", {"count": 2}))
        self.assertEqual((status, code, field), (429, "quota_exceeded", "max_sandboxes"))
        self.assertEqual(len(c.call("GET", "/v1/sandboxes")), 1)  # nothing forked
        forks = c.call("POST", f"/v1/sandboxes/{a}/fork", {"count": 1})["sandboxes"]
        self.assertEqual(len(forks), 1)
        self.assertEqual(forks[0]["tenant"], "forker")
        # Another tenant cannot fork it: its id is answered as unknown.
        other = self.tenant("onlooker")
        self.assertEqual(error_of(lambda: other.call("POST", f"/v1/sandboxes/{a}/fork", {}))[:2],
                         (404, "not_found"))
        for sid in [a, forks[0]["id"]]:
            c.delete(sid)
            self.wait_gone(c, sid)

    def test_the_tenant_view_discloses_nothing_of_the_host(self):
        # A pool member exists and a template too (the operator's creates).
        self.api.call("PUT", "/v1/pool", {"image": "minimal", "size": 1})
        try:
            deadline = time.time() + 120
            while not any(p.get("members") for p in self.api.call("GET", "/v1/pool")):
                self.assertLess(time.time(), deadline, "the pool did not fill")
                time.sleep(0.5)
            members = [m for p in self.api.call("GET", "/v1/pool") for m in p.get("members", [])]
            op_info = self.api.call("GET", "/v1/info")
            self.assertIn("data_dir", op_info)  # the operator keeps its view
            c = self.tenant("viewer")
            info = c.call("GET", "/v1/info")
            text = str(info)

            def keys(node):
                if isinstance(node, dict):
                    for k, v in node.items():
                        yield k
                        yield from keys(v)
                elif isinstance(node, list):
                    for v in node:
                        yield from keys(v)
            # No field of the host's (the pool, its bounds, the daemon's pid...),
            # and no host path or pool member id anywhere in the text.
            for key in keys(info):
                self.assertNotIn(key, {"data_dir", "templates", "pool", "pool_size", "pool_learn",
                                       "pid", "connections"}, key)
            for leak in [self.data_dir, self.tmp] + members:
                self.assertNotIn(leak, text, leak)
            self.assertEqual(info["version"], op_info["version"])
            self.assertIn("minimal", [i["name"] for i in info["images"]])
            # Its own sandbox's posture: the jail, without host identifiers.
            sid = c.create(image="minimal", timeout=600)["id"]
            p = c.call("GET", f"/v1/sandboxes/{sid}/posture")
            self.assertNotIn("pid", p["process"])
            self.assertNotIn("'/", str(p))
            self.assertTrue(all("id" not in v for v in p["process"]["namespaces"].values()))
            self.assertEqual(p["missing"], self.api.call("GET", f"/v1/sandboxes/{sid}/posture")["missing"])
            c.delete(sid)
            self.wait_gone(c, sid)
        finally:
            self.api.call("PUT", "/v1/pool", {"image": "minimal", "size": 0})


@unittest.skipUnless(os.geteuid() == 0, "mounting the small data filesystem needs root")
class ChangesScratchTest(TcpDaemonTestCase):
    """`changes` materializes both disk layers as raw scratch files in the
    data dir. Before, nothing serialised or counted them: parallel calls on
    a full disk filled the host's data filesystem. The daemon here runs on
    a 1 GiB tmpfs the test mounts, so "full" is cheap to reach."""

    extra_args = ["--no-templates"]
    FS_MB = 1024

    @classmethod
    def start_daemon(cls):
        os.makedirs(cls.data_dir, exist_ok=True)
        if not os.path.ismount(cls.data_dir):
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={cls.FS_MB}m,mode=0700", "tmpfs",
                            cls.data_dir], check=True)
        super().start_daemon()

    @classmethod
    def tearDownClass(cls):
        tmp, data = cls.tmp, cls.data_dir
        try:
            super().tearDownClass()
        finally:
            subprocess.run(["umount", "-l", data], capture_output=True)
            shutil.rmtree(tmp, ignore_errors=True)

    def free_mb(self):
        st = os.statvfs(self.data_dir)
        return st.f_bavail * st.f_frsize // (1 << 20)

    def parallel_changes(self, client, sid, n):
        """n concurrent GET .../changes; (results, least free MiB seen meanwhile)."""
        results, low, done = [None] * n, [self.free_mb()], threading.Event()
        go = threading.Barrier(n)

        def one(i):
            go.wait()
            try:
                results[i] = (200, client.call("GET", f"/v1/sandboxes/{sid}/changes", timeout=600))
            except ApiError as e:
                results[i] = (e.status, e.code, e.message, e.field)

        def watch():
            while not done.is_set():
                low[0] = min(low[0], self.free_mb())
                time.sleep(0.005)
        w = threading.Thread(target=watch)
        w.start()
        calls = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in calls:
            t.start()
        for t in calls:
            t.join()
        done.set()
        w.join()
        return results, low[0]

    def assertClearRefusal(self, r):
        if r[0] == 409:
            self.assertEqual(r[1], "conflict")
            self.assertIn("already running", r[2])
        else:
            self.assertEqual(r[:2], (503, "unavailable"), r)
            self.assertIn("not enough disk for this changes call's scratch space", r[2])
        for leak in [self.data_dir, self.tmp]:
            self.assertNotIn(leak, r[2])

    def test_parallel_changes_on_a_full_disk_do_not_fill_the_host(self):
        c = self.tenant("differ")
        sid = c.create(image="minimal", disk_mb=400, timeout=600)["id"]
        try:
            # Room for one call's scratch: each is 200, or 409 while another runs.
            results, _ = self.parallel_changes(c, sid, 4)
            self.assertIn(200, [r[0] for r in results], results)
            for r in results:
                if r[0] != 200:
                    self.assertClearRefusal(r)
            # The guest fills its disk with what no sparse copy can skip.
            out, err, ex = c.exec(sid, argv=["sh", "-c",
                                             "dd if=/dev/urandom of=/root/fill bs=1M count=300 && sync"])
            self.assertEqual(ex["exit_code"], 0, err)
            results, low = self.parallel_changes(c, sid, 20)
            # Before: 20 raw copies of ~330 MiB each, in a filesystem with
            # ~700 MiB left, ran out of space (qemu-img: No space left).
            self.assertGreater(low, 64, f"the data filesystem went down to {low} MiB free")
            for r in results:
                self.assertNotEqual(r[0], 200, "a diff's scratch did not fit but it ran")
                self.assertClearRefusal(r)
            self.assertIn(503, [r[0] for r in results])
            # The sandbox is unharmed and nothing of the calls is left.
            self.assertEqual(c.exec(sid, argv=["echo", "ok"])[0], b"ok\n")
            self.assertEqual(os.listdir(os.path.join(self.data_dir, "tmp")), [])
        finally:
            c.delete(sid)
            self.wait_gone(c, sid)

    def test_a_create_that_does_not_fit_names_no_host_path(self):
        c = self.tenant("big")
        status, code, message, field = error_of(lambda: c.create(image="minimal", disk_mb=4096))
        self.assertEqual((status, code, field), (503, "unavailable", "disk_mb"))
        self.assertIn("not enough disk for disk_mb=4096", message)
        for leak in [self.data_dir, self.tmp]:
            self.assertNotIn(leak, message)

    tenant = TenantAttackTest.tenant
    wait_gone = TenantAttackTest.wait_gone


if __name__ == "__main__":
    unittest.main()

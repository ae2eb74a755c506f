"""The SDK's asyncio front end, streamed stdin and file watch, against a real
airlockd and real VMs.

Streamed stdin (POST .../exec/{exec_id}/stdin) and file watch (GET
.../files/watch) are daemon routes of their own; against a daemon without
them these tests skip, naming the missing route.
"""

import asyncio
import hashlib
import io
import os
import tempfile
import threading
import time
import unittest

from sdk_harness import DaemonTestCase  # noqa: F401  (sets sys.path)

import airlock
from airlock import AsyncSandbox, Client, InvalidArgument, NotFound, RouteNotFound, Sandbox, Timeout

IMAGE = "minimal"
MiB = 1 << 20


def rss_kib():
    """Current resident set of this process, KiB (from /proc)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


class StreamsTest(DaemonTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.client = Client(socket=cls.sock)
        try:
            cls.sb = Sandbox.create(image=IMAGE, memory_mb=256, metadata={"suite": "sdk-streams"},
                                    client=cls.client)
        except BaseException:
            super().tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        try:
            cls.sb.destroy()
        except airlock.AirlockError:
            pass
        super().tearDownClass()

    # --- asyncio ---------------------------------------------------------

    def test_async_sandbox(self):
        async def main():
            sb = await AsyncSandbox.connect(self.sb.id, client=self.client)
            r = await sb.exec("sh", "-c", "echo $((6*7))")
            self.assertEqual((r.exit_code, r.stdout), (0, b"42\n"))
            events = [(ev.stream, ev.data) async for ev in
                      sb.exec_stream("sh", "-c", "echo a; sleep 0.2; echo b >&2")]
            self.assertEqual(events, [("stdout", b"a\n"), ("stderr", b"b\n")])
            # Eight execs at once on one event loop, each answered by its own.
            outs = await asyncio.gather(*(sb.exec("echo", str(i)) for i in range(8)))
            self.assertEqual([o.stdout for o in outs], [f"{i}\n".encode() for i in range(8)])
            p = await sb.exec("sh", "-c", "sleep 0.5; exit 4", background=True)
            self.assertEqual((await p.wait(30)).exit_code, 4)
            q = await sb.exec("sleep", "300", background=True)
            with self.assertRaises(Timeout):
                await q.wait(0.3)
            await q.kill()
            self.assertEqual((await q.wait(30)).signal, 9)
            await sb.files.mkdir("/work/async", parents=True)
            await sb.files.write("/work/async/f", b"async bytes")
            self.assertEqual(await sb.files.read("/work/async/f"), b"async bytes")
            self.assertEqual([e.name for e in await sb.files.list("/work/async")], ["f"])
            self.assertEqual((await sb.files.stat("/work/async/f")).size, 11)
            await sb.files.remove("/work/async", recursive=True)
            self.assertTrue(any(e.get("event") == "created" for e in await sb.logs()))
            listed = await AsyncSandbox.list(metadata={"suite": "sdk-streams"}, client=self.client)
            self.assertEqual([s.id for s in listed], [self.sb.id])
            with self.assertRaises(airlock.SandboxNotFound):
                await AsyncSandbox.connect("sb-nope", client=self.client)
            with self.assertRaises(InvalidArgument) as cm:
                await sb.exec("true", timeout=-1)
            self.assertEqual(cm.exception.field, "timeout")

        asyncio.run(main())

    def test_async_create_destroys_on_exit(self):
        async def main():
            async with await AsyncSandbox.create(image=IMAGE, client=self.client) as sb:
                self.assertEqual((await sb.exec("echo", "in")).stdout, b"in\n")
                return sb.id

        sid = asyncio.run(main())
        self.assertEqual(Sandbox.connect(sid, client=self.client).info["state"], "deleted")
        self.assertNothingLeft(sid)

    # --- streamed stdin (contract 1) ---------------------------------------

    def test_stdin_100mib_streamed_with_flat_client_memory(self):
        size = 100 * MiB
        digest = hashlib.sha256()
        with tempfile.TemporaryFile(dir=self.tmp) as f:
            block = os.urandom(MiB)
            for i in range(100):
                chunk = bytes([i]) + block[1:]
                digest.update(chunk)
                f.write(chunk)
            f.flush()
            f.seek(0)
            base = rss_kib()
            peak = [base]
            stop = threading.Event()

            def sample():
                while not stop.is_set():
                    peak[0] = max(peak[0], rss_kib())
                    time.sleep(0.02)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            try:
                r = self.sb.exec("sh", "-c", "sha256sum > /tmp/stdin.sum; wc -c < /tmp/stdin.sum",
                                 stdin=f)
            except airlock.Unsupported as e:
                self.skipTest(f"daemon has no streamed stdin yet (contract 1): {e.message}")
            finally:
                stop.set()
                sampler.join()
        self.assertEqual(r.exit_code, 0, r)
        if r.output_captured:
            self.assertEqual(r.stdout.strip(), b"68")  # 64 hex digits, "  -", newline
        got = self.sb.files.read("/tmp/stdin.sum").split()[0].decode()
        self.assertEqual(got, digest.hexdigest())
        grew_mib = (peak[0] - base) / 1024
        # 100 MiB went through; the client held one 256 KiB piece at a time.
        self.assertLess(grew_mib, 24, f"client RSS grew by {grew_mib:.1f} MiB")
        self.assertEqual(r.stdin_bytes, size)

    def test_stdin_stream_into_background_process(self):
        with tempfile.TemporaryFile(dir=self.tmp) as f:
            f.write(b"line one\nline two\n")
            f.seek(0)
            try:
                p = self.sb.exec("sh", "-c", "cat > /tmp/bg.in", stdin=f, background=True)
            except airlock.Unsupported as e:
                self.skipTest(f"daemon has no streamed stdin yet (contract 1): {e.message}")
        self.assertEqual(p.wait(30).exit_code, 0)
        self.assertEqual(self.sb.files.read("/tmp/bg.in"), b"line one\nline two\n")

    def test_async_stdin_stream(self):
        async def main():
            sb = AsyncSandbox(self.sb)
            data = os.urandom(3 * MiB + 5)
            r = await sb.exec("sha256sum", stdin=io.BytesIO(data))
            return r, hashlib.sha256(data).hexdigest()

        try:
            r, want = asyncio.run(main())
        except airlock.Unsupported as e:
            self.skipTest(f"daemon has no streamed stdin yet (contract 1): {e.message}")
        self.assertEqual((r.exit_code, r.stdout.split()[0].decode()), (0, want))

    def test_stdin_iterable_is_answered_piece_by_piece(self):
        first_seen, second_sent = threading.Event(), []

        def typed():
            yield b"echo first\n"
            first_seen.wait(20)  # what a person at a prompt would do
            second_sent.append(time.monotonic())
            yield b"echo second\n"

        out, seen_at = b"", None
        try:
            with self.sb.exec_stream("sh", stdin=typed()) as s:
                for ev in s:
                    out += ev.data
                    if b"first" in out and seen_at is None:
                        seen_at = time.monotonic()
                        first_seen.set()
        except airlock.Unsupported as e:
            self.skipTest(f"daemon has no streamed stdin yet (contract 1): {e.message}")
        self.assertEqual((out, s.result.exit_code), (b"first\nsecond\n", 0))
        # The shell answered the first line before the second was sent.
        self.assertLess(seen_at, second_sent[0])

    # --- file watch (contract 3) -----------------------------------------

    def open_watch(self, path, **kw):
        try:
            return self.sb.files.watch(path, **kw)
        except RouteNotFound as e:
            self.skipTest(f"daemon has no file watch yet (contract 3): {e.message}")

    def test_watch_reports_created_modified_deleted(self):
        self.sb.files.mkdir("/work/w", parents=True)
        seen = []
        with self.open_watch("/work/w") as w:
            guard = threading.Timer(30, w._resp.abort)  # never hang the suite
            guard.start()
            self.assertEqual(w.path, "/work/w")
            self.sb.exec("sh", "-c", "echo x > /work/w/a; echo y >> /work/w/a; rm /work/w/a")
            try:
                for ev in w:
                    seen.append((ev.type, ev.path))
                    if ev.type == "deleted":
                        break
            except airlock.AirlockError:
                pass
            guard.cancel()
        types = [t for t, p in seen if p == "/work/w/a"]
        self.assertTrue(types, seen)
        self.assertEqual(types[0], "created", seen)
        self.assertIn("modified", types, seen)
        self.assertEqual(types[-1], "deleted", seen)

    def test_watch_ends_when_the_sandbox_goes(self):
        sb = Sandbox.create(image=IMAGE, client=self.client)
        try:
            w = sb.files.watch("/tmp")
        except RouteNotFound as e:
            sb.destroy()
            self.skipTest(f"daemon has no file watch yet (contract 3): {e.message}")
        guard = threading.Timer(60, w._resp.abort)  # never hang the suite
        guard.start()
        threading.Timer(0.5, sb.destroy).start()
        try:
            for _ in w:
                pass
        finally:
            guard.cancel()
        # The daemon said why it ended, and the iteration stopped on it.
        self.assertIsNotNone(w.end)
        self.assertTrue(w.end.get("reason"), w.end)
        self.assertNothingLeft(sb.id)

    def test_watch_bad_path_fails_before_streaming(self):
        try:
            self.sb.files.watch("/no/such/dir").close()
            self.fail("watching a missing directory was accepted")
        except RouteNotFound as e:
            self.skipTest(f"daemon has no file watch yet (contract 3): {e.message}")
        except NotFound as e:
            self.assertEqual(e.code, "not_found")
        with self.assertRaises(InvalidArgument) as cm:
            self.sb.files.watch("relative")
        self.assertEqual(cm.exception.field, "path")

    def test_async_watch(self):
        self.sb.files.mkdir("/work/aw", parents=True)

        async def main():
            sb = AsyncSandbox(self.sb)
            async with await sb.files.watch("/work/aw", recursive=False) as w:
                self.assertEqual(w.path, "/work/aw")  # in place: the touch below is seen
                await sb.exec("touch", "/work/aw/t")
                return await asyncio.wait_for(w.__anext__(), 20)

        try:
            ev = asyncio.run(main())
        except RouteNotFound as e:
            self.skipTest(f"daemon has no file watch yet (contract 3): {e.message}")
        self.assertEqual((ev.type, ev.path), ("created", "/work/aw/t"))


if __name__ == "__main__":
    unittest.main()

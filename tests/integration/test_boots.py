"""100 boots in a row must all reach the agent (no silent hangs, no flakes).

Two workers boot, exec and delete sandboxes until 100 have been checked;
every single one must reach the agent and leave nothing behind.
"""

import os
import threading
import unittest

from harness import ApiError, DaemonTestCase, qemu_pids_for

BOOTS = int(os.environ.get("AIRLOCK_BOOTS", "100"))


class HundredBootsTest(DaemonTestCase):
    def test_hundred_boots_all_reach_the_agent(self):
        lock = threading.Lock()
        state = {"next": 0, "ok": 0, "failures": []}

        def worker():
            while True:
                with lock:
                    if state["next"] >= BOOTS:
                        return
                    state["next"] += 1
                try:
                    sb = self.api.create(image="minimal", timeout=600)
                    try:
                        _, _, ex = self.api.exec(sb["id"], argv=["true"])
                        if ex["exit_code"] != 0:
                            raise AssertionError(f"exec true: {ex}")
                    finally:
                        self.api.delete(sb["id"])
                    with lock:
                        state["ok"] += 1
                except (ApiError, AssertionError, OSError) as e:
                    with lock:
                        state["failures"].append(str(e))

        threads = [threading.Thread(target=worker) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(state["failures"], [])
        self.assertEqual(state["ok"], BOOTS)
        self.assertEqual(qemu_pids_for(self.data_dir), [])
        sandboxes = os.path.join(self.data_dir, "sandboxes")
        self.assertEqual(os.listdir(sandboxes) if os.path.isdir(sandboxes) else [], [])


if __name__ == "__main__":
    unittest.main()

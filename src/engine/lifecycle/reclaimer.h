// Background teardown (docs/design.md, "Warm pool": near-free delete). A
// delete moves the sandbox to `stopping` (one registry write) and closes its
// channel, so it is out of service at once and its execs end; killing QEMU
// and the network helper, removing the run dir and cgroup, and the final
// `deleted` record happen here, on one thread of the reclaimer's own.
//
// Crash safety: the registry row says `stopping` before the call returns; a
// daemon that dies with teardowns queued leaves rows in `stopping`, and the
// next daemon's recover() finishes them (engine.cc, recover_one). A daemon
// that stops normally finishes every queued teardown before the engine is
// gone (drain), so "nothing left behind" holds after a delete whatever
// happens next.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "engine/sandbox/sandbox.h"

namespace airlock::engine::lifecycle {

class Reclaimer {
 public:
  // `finish`: the rest of the teardown of a sandbox already in `stopping`,
  // to `deleted` with the reason. Never throws.
  using Finish = std::function<void(Sandbox&, const std::string& reason)>;
  explicit Reclaimer(Finish finish) : finish_(std::move(finish)) {}
  ~Reclaimer() { drain(); }
  Reclaimer(const Reclaimer&) = delete;
  Reclaimer& operator=(const Reclaimer&) = delete;

  // Queues the teardown of `sb` (already `stopping`); the thread starts at
  // the first one.
  void queue(std::shared_ptr<Sandbox> sb, const std::string& reason);
  // Waits (at most `limit`) until no queued teardown is pending: what
  // judges who uses a snapshot or image (a deleted fork still holds its
  // snapshot until its teardown ends), and what reuses a deleted sandbox's
  // files, sees every delete that was answered as complete.
  void settle_all(std::chrono::milliseconds limit = std::chrono::seconds(30));
  // Waits (at most `limit`) for the teardown of `id`; false if still pending.
  bool settle_one(const std::string& id, std::chrono::milliseconds limit);
  // The API's view of a registry row: a sandbox deleted by request whose
  // teardown is still running is shown `deleted` (it is out of service and
  // its end is certain); the registry keeps `stopping` until the teardown
  // ends (crash safety). True if it changed `info`.
  bool deleted_view(SandboxInfo& info);
  // Finishes every queued teardown and stops the thread (engine shutdown).
  void drain();

 private:
  void loop();

  Finish finish_;
  std::mutex mu_;  // everything below
  std::condition_variable cv_;
  std::deque<std::pair<std::shared_ptr<Sandbox>, std::string>> queue_;
  std::set<std::string> deleting_;  // queued or running, not finished
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace airlock::engine::lifecycle

// Background teardown (docs/design.md, "Warm pool": near-free delete). A
// delete moves the sandbox to `stopping` (one registry write) and closes its
// channel, so it is out of service at once and its execs end; killing QEMU
// and the network helper, removing the run dir and cgroup, and the final
// `deleted` record happen here, on one thread of the engine's own.
//
// Crash safety: the registry row says `stopping` before the call returns; a
// daemon that dies with teardowns queued leaves rows in `stopping`, and the
// next daemon's recover() finishes them (engine.cc, recover_one). A daemon
// that stops normally finishes every queued teardown before the engine is
// gone (drain_reclaim), so "nothing left behind" holds after a delete
// whatever happens next.
#include <spdlog/spdlog.h>

#include "engine/engine_impl.h"

namespace airlock::engine {

bool Engine::Impl::teardown_async(const std::shared_ptr<Sandbox>& sb, const std::string& reason) {
  // Never under a running pause/resume/snapshot (as teardown): wait for it.
  std::unique_lock op(sb->op_mu);
  try {
    if (!sb->transition_any(State::stopping, {.reason = reason})) return false;
  } catch (const Error& e) {
    if (e.code() == Errc::conflict) return false;
    spdlog::error("sandbox {}: {}; stopping it anyway", sb->id(), e.what());
  } catch (const std::exception& e) {
    spdlog::error("sandbox {}: {}; stopping it anyway", sb->id(), e.what());
  }
  // Every call waiting on the guest fails now, not when the VM is killed.
  if (sb->channel) sb->channel->close("sandbox " + sb->id() + " is being stopped: " + reason);
  op.unlock();
  {
    std::lock_guard lock(reclaim_mu);
    deleting.insert(sb->id());
    reclaim_queue.push_back({sb, reason});
    if (!reclaim_thread.joinable()) reclaim_thread = std::thread([this] { reclaim_loop(); });
  }
  reclaim_cv.notify_one();
  return true;
}

void Engine::Impl::reclaim_loop() {
  std::unique_lock lock(reclaim_mu);
  for (;;) {
    reclaim_cv.wait(lock, [&] { return reclaim_stopping || !reclaim_queue.empty(); });
    if (reclaim_queue.empty()) return;  // stopping, and all done
    auto [sb, reason] = std::move(reclaim_queue.front());
    reclaim_queue.pop_front();
    lock.unlock();
    finish_stop(*sb, State::deleted, reason, "deleted", {}, nlohmann::json::object());
    lock.lock();
    deleting.erase(sb->id());
    reclaim_cv.notify_all();  // settle_reclaim
  }
}

void Engine::Impl::settle_reclaim(std::chrono::milliseconds limit) {
  std::unique_lock lock(reclaim_mu);
  if (!reclaim_cv.wait_for(lock, limit, [&] { return deleting.empty(); }))
    spdlog::warn("{} teardown(s) still running after {} ms; going on", deleting.size(),
                 limit.count());
}

bool Engine::Impl::settle_one(const std::string& id, std::chrono::milliseconds limit) {
  std::unique_lock lock(reclaim_mu);
  return reclaim_cv.wait_for(lock, limit, [&] { return !deleting.count(id); });
}

bool Engine::Impl::deleted_view(SandboxInfo& info) {
  if (info.state != State::stopping) return false;
  std::lock_guard lock(reclaim_mu);
  if (!deleting.count(info.id)) return false;
  info.state = State::deleted;
  info.pid = 0;
  return true;
}

void Engine::Impl::destroy_now(const std::string& id, const std::string& reason) {
  std::shared_ptr<Sandbox> sb = table.find(id);
  if (sb) teardown(*sb, State::deleted, reason, "deleted");
}

void Engine::Impl::drain_reclaim() {
  {
    std::lock_guard lock(reclaim_mu);
    reclaim_stopping = true;
  }
  reclaim_cv.notify_all();
  if (reclaim_thread.joinable()) reclaim_thread.join();
}

}  // namespace airlock::engine

// The engine's side of a background teardown: the sandbox out of service
// now (stopping, channel closed), the rest queued on the reclaimer
// (lifecycle/reclaimer.h, which says why and what survives a crash).
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
  reclaimer.queue(sb, reason);
  return true;
}

void Engine::Impl::destroy_now(const std::string& id, const std::string& reason) {
  std::shared_ptr<Sandbox> sb = table.find(id);
  if (sb) teardown(*sb, State::deleted, reason, "deleted");
}

}  // namespace airlock::engine

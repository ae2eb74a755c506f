// Engine::set_timeout: a running sandbox's life is moved to `seconds` from
// now (E2B's POST /sandboxes/{id}/timeout, which may shorten or extend it).
#include "common/error.h"
#include "engine/engine.h"
#include "engine/engine_impl.h"
#include "engine/validate.h"

namespace airlock::engine {

SandboxInfo Engine::set_timeout(const std::string& id, int seconds) {
  auto& impl = *impl_;
  if (!limits::kTimeoutS.contains(seconds))
    throw Error(Errc::invalid_argument,
                "timeout must be between " + std::to_string(limits::kTimeoutS.min) + " and " +
                    std::to_string(limits::kTimeoutS.max) + " seconds",
                "timeout");
  auto sb = impl.table.running(id);  // not_found / conflict unless running
  int64_t expires_at = impl.wall_ms() + int64_t{seconds} * 1000;
  SandboxSpec spec;
  {
    std::lock_guard lock(sb->mu);
    sb->rec.info.expires_at_ms = expires_at;
    // The reason a timed-out sandbox gives names the life it had last.
    sb->rec.info.spec.timeout_s = seconds;
    spec = sb->rec.info.spec;
  }
  // The registry first, then the deadline the reaper reads (it wakes at
  // least every second, so an earlier expiry is noticed without a signal).
  impl.registry.set_expiry(id, expires_at, spec);
  sb->expires_steady_ms = steady_ms() + int64_t{seconds} * 1000;
  impl.journal.append(id, "timeout_changed", {{"timeout", seconds}, {"expires_at_ms", expires_at}});
  return sb->info();
}

}  // namespace airlock::engine

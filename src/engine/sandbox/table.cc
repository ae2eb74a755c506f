#include "engine/sandbox/table.h"

#include "common/error.h"

namespace airlock::engine {

std::shared_ptr<Sandbox> SandboxTable::find(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = live_.find(id);
  return it != live_.end() ? it->second : nullptr;
}

std::shared_ptr<Sandbox> SandboxTable::running(const std::string& id) {
  if (auto sb = find(id)) {
    State st = sb->state();
    if (st == State::running) {
      sb->last_activity_ms = steady_ms();  // any call counts for idle_timeout
      return sb;
    }
    throw Error(Errc::conflict, "sandbox " + id + " is " + to_string(st) + ", not running");
  }
  auto rec = registry_.get(id);
  if (!rec) throw Error(Errc::not_found, "no sandbox " + id, "id");
  std::string why = rec->info.reason.empty() ? "" : " (" + rec->info.reason + ")";
  if (!rec->info.failure.empty()) why = " (" + rec->info.failure + ": " + rec->info.reason + ")";
  // "running" in the registry but not live: the reaper or destroy() is
  // tearing it down right now.
  std::string state = rec->info.state == State::running ? "stopping" : to_string(rec->info.state);
  throw Error(Errc::conflict, "sandbox " + id + " is " + state + why + ", not running");
}

std::shared_ptr<Sandbox> SandboxTable::live(const std::string& id) {
  if (auto sb = find(id)) return sb;
  auto rec = registry_.get(id);
  if (!rec) throw Error(Errc::not_found, "no sandbox " + id, "id");
  throw Error(Errc::conflict, "sandbox " + id + " is " + to_string(rec->info.state));
}

std::vector<std::shared_ptr<Sandbox>> SandboxTable::all() {
  std::lock_guard lock(mu_);
  std::vector<std::shared_ptr<Sandbox>> out;
  out.reserve(live_.size());
  for (auto& [id, sb] : live_) out.push_back(sb);
  return out;
}

void SandboxTable::put(const std::string& id, std::shared_ptr<Sandbox> sb) {
  std::lock_guard lock(mu_);
  live_[id] = std::move(sb);
}

void SandboxTable::erase(const std::string& id, const Sandbox* sb) {
  std::lock_guard lock(mu_);
  auto it = live_.find(id);
  if (it != live_.end() && it->second.get() == sb) live_.erase(it);
}

void SandboxTable::close_all(const std::string& why) {
  std::lock_guard lock(mu_);
  for (auto& [id, sb] : live_)
    if (sb->channel) sb->channel->close(why);
  live_.clear();
}

}  // namespace airlock::engine

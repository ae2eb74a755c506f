#include "engine/lifecycle/reclaimer.h"

#include <spdlog/spdlog.h>

namespace airlock::engine::lifecycle {

void Reclaimer::queue(std::shared_ptr<Sandbox> sb, const std::string& reason) {
  {
    std::lock_guard lock(mu_);
    deleting_.insert(sb->id());
    queue_.push_back({std::move(sb), reason});
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  }
  cv_.notify_one();
}

void Reclaimer::loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and all done
    auto [sb, reason] = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    finish_(*sb, reason);
    lock.lock();
    deleting_.erase(sb->id());
    cv_.notify_all();  // settle_*
  }
}

void Reclaimer::settle_all(std::chrono::milliseconds limit) {
  std::unique_lock lock(mu_);
  if (!cv_.wait_for(lock, limit, [&] { return deleting_.empty(); }))
    spdlog::warn("{} teardown(s) still running after {} ms; going on", deleting_.size(),
                 limit.count());
}

bool Reclaimer::settle_one(const std::string& id, std::chrono::milliseconds limit) {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, limit, [&] { return !deleting_.count(id); });
}

bool Reclaimer::deleted_view(SandboxInfo& info) {
  if (info.state != State::stopping) return false;
  std::lock_guard lock(mu_);
  if (!deleting_.count(info.id)) return false;
  info.state = State::deleted;
  info.pid = 0;
  return true;
}

void Reclaimer::drain() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace airlock::engine::lifecycle

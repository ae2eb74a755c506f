#include "engine/snapshots/service.h"

namespace airlock::snapshots {

SnapshotService::Hold::~Hold() {
  if (svc_) svc_->release(name_);
}

std::optional<SnapshotService::Held> SnapshotService::hold(
    const std::string& name, const std::function<bool(const Snapshot&)>& visible) {
  std::lock_guard lock(mu_);
  auto snap = store_.find(name);
  if (!snap || (visible && !visible(*snap))) return std::nullopt;
  ++readers_[snap->name];
  return Held{std::move(*snap), Hold(this, name)};
}

void SnapshotService::release(const std::string& name) {
  std::lock_guard lock(mu_);
  if (auto it = readers_.find(name); it != readers_.end() && --it->second <= 0) readers_.erase(it);
}

int SnapshotService::readers(const std::string& name) const {
  std::lock_guard lock(mu_);
  auto it = readers_.find(name);
  return it == readers_.end() ? 0 : it->second;
}

void SnapshotService::keep_fork_ram(const std::string& name, std::shared_ptr<vmm::SealedRam> ram) {
  std::lock_guard lock(mu_);
  fork_ram_[name] = std::move(ram);
}

void SnapshotService::drop_fork_ram(const std::string& name) {
  std::lock_guard lock(mu_);
  fork_ram_.erase(name);
}

std::shared_ptr<vmm::SealedRam> SnapshotService::fork_ram(const std::string& name) const {
  std::lock_guard lock(mu_);
  auto it = fork_ram_.find(name);
  return it == fork_ram_.end() ? nullptr : it->second;
}

}  // namespace airlock::snapshots

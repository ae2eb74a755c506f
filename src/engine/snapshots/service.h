// The snapshots' room: the store on disk (snapshot_store.h), which snapshots
// are being read right now (a restore, an image save: not deletable
// meanwhile), and the RAM of forks in flight (a fork's internal snapshot has
// no mem.state: its RAM is a sealed memfd, held here while its forks start,
// never on disk). Each under the service's own lock.
//
//   auto held = service.hold(name, visible);   // nullopt: no such snapshot
//   ... restore from held->snapshot ...        // delete refuses it meanwhile
//   // ~Hold: released
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "engine/snapshots/snapshot_store.h"
#include "engine/vmm/sealed_ram.h"

namespace airlock::snapshots {

class SnapshotService {
 public:
  explicit SnapshotService(std::filesystem::path root) : store_(std::move(root)) {}
  SnapshotService(const SnapshotService&) = delete;
  SnapshotService& operator=(const SnapshotService&) = delete;

  SnapshotStore& store() { return store_; }
  const SnapshotStore& store() const { return store_; }

  // One reader of a snapshot (a restore or an image save): while any is
  // alive the snapshot counts as in use (readers()). Move-only; releases on
  // destruction.
  class Hold {
   public:
    Hold(Hold&& o) noexcept : svc_(o.svc_), name_(std::move(o.name_)) { o.svc_ = nullptr; }
    Hold& operator=(Hold&&) = delete;
    Hold(const Hold&) = delete;
    ~Hold();
    const std::string& name() const { return name_; }

   private:
    friend class SnapshotService;
    Hold(SnapshotService* svc, std::string name) : svc_(svc), name_(std::move(name)) {}
    SnapshotService* svc_;
    std::string name_;
  };
  struct Held {
    Snapshot snapshot;
    Hold hold;
  };
  // Finds `name` and holds it in one step (a delete cannot slip between);
  // nullopt if there is none or `visible` (if given) says the caller may not
  // see it, which the caller answers exactly like a missing name.
  std::optional<Held> hold(const std::string& name,
                           const std::function<bool(const Snapshot&)>& visible = {});
  // How many readers hold `name` now.
  int readers(const std::string& name) const;

  // A fork's RAM split out of its source's stream (vmm/ram_split.h), by the
  // fork's internal snapshot name, kept while its forks start. Each fork's
  // QEMU keeps its own fd of the sealed memfd, so the pages live exactly as
  // long as their last user.
  void keep_fork_ram(const std::string& name, std::shared_ptr<vmm::SealedRam> ram);
  void drop_fork_ram(const std::string& name);
  // Null if none is kept (the forks have started, or it never split).
  std::shared_ptr<vmm::SealedRam> fork_ram(const std::string& name) const;

 private:
  void release(const std::string& name);

  SnapshotStore store_;
  mutable std::mutex mu_;  // readers_, fork_ram_
  std::map<std::string, int> readers_;
  std::map<std::string, std::shared_ptr<vmm::SealedRam>> fork_ram_;
};

}  // namespace airlock::snapshots

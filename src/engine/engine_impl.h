// Engine internals shared by engine.cc (construction, queries, reaper,
// re-adoption), engine_lifecycle.cc (create/destroy) and engine_ops.cc
// (exec and files). Not part of the public API.
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "common/error.h"
#include "engine/audit/journal.h"
#include "engine/channel/guest_channel.h"
#include "engine/engine.h"
#include "engine/registry/registry.h"
#include "engine/storage/image_store.h"
#include "engine/vmm/accel.h"
#include "engine/vmm/vm.h"

namespace airlock::engine {

int64_t now_ms();
// "<prefix>" + 12 lowercase hex digits from getrandom.
std::string random_id(const std::string& prefix);

// The in-memory side of a running sandbox. Held by shared_ptr so an exec in
// flight keeps it valid while destroy() tears the VM down under it.
struct Live {
  std::mutex mu;  // state, execs
  SandboxRecord rec;
  State state = State::running;
  std::unique_ptr<vmm::Vm> vm;
  std::unique_ptr<channel::GuestChannel> channel;
  std::map<std::string, uint32_t> execs;  // exec_id -> stream, while running
};

struct Engine::Impl {
  Config cfg;
  Registry registry;
  AuditJournal journal;
  storage::ImageStore images;

  std::mutex mu;                 // live, stopping
  std::condition_variable wake;  // the reaper's
  std::map<std::string, std::shared_ptr<Live>> live;
  bool stopping = false;
  std::thread reaper;

  std::mutex accel_mu;
  std::optional<vmm::AccelVerdict> accel;

  explicit Impl(Config c);

  std::filesystem::path sandbox_dir(const std::string& id) const {
    return cfg.data_dir / "sandboxes" / id;
  }
  // The verdict, probing once (with `img`'s kernel) if not configured.
  vmm::AccelVerdict resolve_accel(const storage::Image& img);
  // The running sandbox `id`, or Error(not_found / conflict naming its state).
  std::shared_ptr<Live> running(const std::string& id);
  // Kills the VM, removes its files, records `state` + `reason` in the
  // registry and `event` in the journal. The sandbox must already be out of
  // `live`. Never throws (teardown must finish; failures are logged).
  void teardown(Live& sb, State state, const std::string& reason, const std::string& event);
  // Re-adopts running sandboxes and cleans up dead ones (construction).
  void recover();
  // One boot attempt (engine_lifecycle.cc): fresh overlay, QEMU, agent
  // hello. On failure nothing of the attempt is left; returns why.
  struct BootFailure {
    Errc code;
    std::string cause;
    std::string console;
  };
  std::optional<BootFailure> boot_once(Live& sb, const storage::Image& img, vmm::Accel accel);
  // A JSON-only guest operation (engine_ops.cc), audited as a "file" event
  // if `audited`.
  nlohmann::json json_op(const std::string& id, nlohmann::json req, bool audited);
  void reaper_loop();
};

}  // namespace airlock::engine

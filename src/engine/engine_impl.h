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
  pid_t net_pid = 0;                      // the airlock-net helper (0 = none: mode "none")
  std::mutex net_mu;                      // serialises policy changes
};

// Network (engine_network.cc; docs/network.md).
// The policy in its normalised form; Error(invalid_argument, field
// "network.allow[i]" ...) for a bad one.
nlohmann::json normalize_network(const nlohmann::json& policy);
// True if `policy` (normalised) gives the VM a NIC (mode != none).
bool network_enabled(const nlohmann::json& policy);
// The airlock-net binary; Error(unavailable) if it cannot be found.
std::filesystem::path net_helper_binary(const Config& cfg);
// The sandbox's NIC MAC, derived from its id.
std::string mac_for(const std::string& id);
// Starts airlock-net detached (it survives a daemon restart) for the sandbox
// whose run dir is `run_dir`, appending its events to `events` (the
// sandbox's audit journal), and waits for its ready line (5 s). Writes
// run_dir/net.pid. On failure nothing is left and Error says why (with the
// helper's stderr).
pid_t start_net_helper(const Config& cfg, const std::string& id,
                       const std::filesystem::path& run_dir, const std::filesystem::path& events,
                       const nlohmann::json& policy);
// True if `pid` is alive and is the helper of `run_dir` (pid-reuse safe).
bool is_our_net_helper(pid_t pid, const std::filesystem::path& run_dir);
// run_dir/net.pid, 0 if none.
pid_t read_net_pid(const std::filesystem::path& run_dir);
// SIGKILLs the helper (`pid`, or net.pid's if 0) if it is still ours, waits
// until it is gone, removes its sockets and pid file. Never throws.
void kill_net_helper(pid_t pid, const std::filesystem::path& run_dir);
// One request/reply on the helper's control socket (5 s bound).
nlohmann::json net_control(const std::filesystem::path& run_dir, const nlohmann::json& request);

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

// Engine internals: the rooms Engine::Impl holds and the lifecycle steps
// still implemented on it (engine.cc: construction, queries, reaper,
// re-adoption; engine_lifecycle.cc: create/destroy; engine_files.cc,
// engine_snapshots.cc, engine_pause.cc, ...). Not part of the public API.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "common/error.h"
#include "engine/audit/journal.h"
#include "engine/channel/guest_channel.h"
#include "engine/channel/guest_client.h"
#include "engine/engine.h"
#include "engine/engine_metrics.h"
#include "engine/exec/service.h"
#include "engine/launcher.h"
#include "engine/lifecycle/admission.h"
#include "engine/lifecycle/reclaimer.h"
#include "engine/net/host/events.h"
#include "engine/net/host/helper.h"
#include "engine/pool/warm_pool.h"
#include "engine/registry/registry.h"
#include "engine/sandbox/sandbox.h"
#include "engine/sandbox/table.h"
#include "engine/snapshots/service.h"
#include "engine/storage/image_store.h"
#include "engine/templates/service.h"
#include "engine/trace.h"
#include "engine/vmm/accel.h"
#include "engine/vmm/sealed_ram.h"
#include "engine/vmm/vm.h"

namespace airlock::engine {

int64_t now_ms();
// Metadata key marking a warm-pool member (value: its image) until it is
// handed out; never visible on a user's sandbox.
inline constexpr const char* kPoolMarker = "airlock.pool";

using lifecycle::free_bytes;
using lifecycle::kLowSpaceBytes;
using lifecycle::rethrow_if_disk_full;

// False if the sandbox has a network helper and it is no longer running
// (the reaper fails the sandbox: its VM would have lost its network).
bool net_helper_alive(const Sandbox& sb);

// Failure detection (engine_failure.cc; docs/design.md "Failure states").
// What the reaper decided about a sandbox: the state to end it in, the
// typed failure (SandboxInfo::failure, "" unless failed), the reason, the
// journal event and extra fields for it (console_tail, pid).
struct Verdict {
  State state;
  std::string failure;
  std::string reason;
  std::string event;
  nlohmann::json details;
};
// Why the QEMU of `run_dir` (pid `pid`) is gone: guest_panic (a panic/reset
// line on the console), oom (its memory cgroup `memory_cgroup` recorded an
// OOM kill; "" or "-" = unknown) or vmm_died (with the signal if qemu.log
// names one, else "exit status unknown"). May wait 300 ms for the console.
Verdict classify_death(const std::filesystem::path& run_dir, int pid,
                       const std::string& memory_cgroup);

// The lifecycle behind the warm pool (engine_handout.cc): members are made by
// launch + warm-up and ended by teardown, like every sandbox.
// The pool's knobs from the engine's Config (pool_tick_ms, pool_learn_*).
inline pool::Options pool_options(const Config& cfg) {
  pool::Options o;
  o.tick_ms = cfg.pool_tick_ms;
  o.learn_shapes = cfg.pool_learn_shapes;
  o.learn_memory_mb = cfg.pool_learn_memory_mb;
  o.learn_idle_s = cfg.pool_learn_idle_s;
  return o;
}
class PoolMembers final : public pool::Members {
 public:
  explicit PoolMembers(Engine::Impl& impl) : impl_(impl) {}
  std::shared_ptr<Sandbox> make(const pool::Key& key) override;
  bool usable(const Sandbox& sb, bool untouched) const override;
  void end(Sandbox& sb, const std::string& reason) override;
  void end_async(const std::shared_ptr<Sandbox>& sb, const std::string& reason) override;

 private:
  Engine::Impl& impl_;
};

struct Engine::Impl {
  Config cfg;
  std::shared_ptr<Launcher> launcher;  // cfg.launcher or QEMU
  Registry registry;
  AuditJournal journal;
  storage::ImageStore images;
  EngineMetrics metrics;  // GET /metrics counters (engine_metrics.h)

  // Wall-clock ms for timestamps shown to users (cfg.wall_clock_ms).
  int64_t wall_ms() const { return cfg.wall_clock_ms ? cfg.wall_clock_ms() : now_ms(); }
  // Free MiB of the data dir's filesystem (cfg.disk_free_mb), -1 if unknown.
  int64_t disk_free_mb() const;
  // The disk every admitted sandbox and running `changes` call holds
  // (`changes` under "changes/<id>", engine_changes.cc), and the VM starts
  // running at once (at most max(2, cores); more creates queue).
  lifecycle::DiskAdmission admission;
  lifecycle::StartSlots starts;
  // Sandboxes with a `changes` call running: one at a time per sandbox.
  std::mutex changes_mu;
  std::set<std::string> changes_running;

  // The live sandboxes (sandbox/table.h).
  SandboxTable table;
  // Execs on them (exec/service.h): foreground, background, attach, stdin,
  // terminal, kill; the Engine's exec calls delegate to it.
  exec::ExecService execs{table, journal, metrics,
                          exec::Options{.buffer_bytes = cfg.exec_buffer_bytes}};
  // The reaper thread (engine.cc, engine_failure.cc): its own lock and wake.
  std::mutex reaper_mu;  // reaper_stopping
  std::condition_variable reaper_wake;
  bool reaper_stopping = false;
  std::thread reaper;
  // Stops and joins the reaper (engine shutdown).
  void stop_reaper();

  std::mutex accel_mu;
  std::optional<vmm::AccelVerdict> accel;

  // Templates: the store, its build locks and the sealed RAM of clones
  // (templates/service.h). Declared after what it refers to.
  templates::TemplateService templates;

  explicit Impl(Config c);

  std::filesystem::path sandbox_dir(const std::string& id) const {
    return cfg.data_dir / "sandboxes" / id;
  }
  // Where a disk's backing files may be (storage/disk_chain.h): the image,
  // template and snapshot directories, never a sandbox's own run directory
  // (another sandbox's disk) or anything else on the host.
  std::vector<std::filesystem::path> disk_roots() const;
  // The verdict, probing once (with `img`'s kernel) if not configured.
  vmm::AccelVerdict resolve_accel(const storage::Image& img);
  // Moves the sandbox to `stopping` (false, nothing done, if it cannot go
  // there: someone else is already stopping it, or it ended), kills the VM
  // and the network helper, removes its files and moves it to `state` with
  // `reason` (+ `failure`), appending `event` (with `details` merged in,
  // e.g. the console tail). Removes it from `live`. Never throws.
  // `only_from`: back off (false) unless the sandbox is still in that state
  // once its op_mu is held (the reaper's verdicts are about a state it saw).
  bool teardown(Sandbox& sb, State state, const std::string& reason, const std::string& event,
                const std::string& failure = {},
                const nlohmann::json& details = nlohmann::json::object(),
                std::optional<State> only_from = std::nullopt);
  // Background teardown (engine_reclaim.cc): moves `sb` to `stopping`
  // (false, nothing done, as teardown), closes its channel and queues the
  // rest (finish_stop to `deleted`) on the reclaimer. Never throws.
  bool teardown_async(const std::shared_ptr<Sandbox>& sb, const std::string& reason);
  // Synchronous teardown to `deleted` of a live sandbox (an engine-internal
  // undo that must be complete when it returns, e.g. a failed fork's
  // members); nothing if it is not live.
  void destroy_now(const std::string& id, const std::string& reason);
  // The rest of teardown for a sandbox already in `stopping`.
  void finish_stop(Sandbox& sb, State state, const std::string& reason, const std::string& event,
                   const std::string& failure, const nlohmann::json& details) noexcept;
  // Re-adopts (or cleans up) one sandbox of the previous daemon (recover()).
  void recover_one(SandboxRecord rec);
  // Ends every exec that has an exec_start but no end record in `id`'s
  // journal as `interrupted` (the daemon died while it ran).
  void close_interrupted_execs(const std::string& id);
  // The exec_start records of `id`'s journal without an end record.
  std::map<std::string, nlohmann::json> open_execs(const std::string& id);
  // Journals `sb`'s detached execs nobody collected as `interrupted`.
  void close_detached_execs(Sandbox& sb, const std::string& why);
  // Re-adopts running sandboxes and cleans up dead ones (construction).
  void recover();
  // One boot attempt (engine_lifecycle.cc): fresh overlay, QEMU, agent
  // hello. On failure nothing of the attempt is left; returns why.
  struct BootFailure {
    Errc code;
    std::string cause;
    std::string console;
  };
  // Creates, starts and registers one sandbox (clone of its shape's
  // template, else cold boot; engine_lifecycle.cc). A normal one is made
  // `running` and put in `live`; a `pooled` one stays `starting`, marked
  // with kPoolMarker, outside `live`, for the pool to hand out. Error as for
  // Engine::create; nothing left behind on failure.
  // `from`: a snapshot to start from instead of the image or a template.
  std::shared_ptr<Sandbox> launch(const SandboxSpec& checked, const storage::Image& img,
                                  const vmm::AccelVerdict& accel, bool pooled,
                                  const snapshots::Snapshot* from = nullptr);

  // Snapshots: the store, their readers and forks' RAM
  // (snapshots/service.h); fork and pause are engine_snapshots.cc and
  // engine_pause.cc.
  std::optional<snapshots::SnapshotService> snaps;
  std::filesystem::path paused_dir(const std::string& id) const {
    return cfg.data_dir / "paused" / id;
  }
  // Who uses snapshot `name`: "sandbox sb-..." / "snapshot x" entries.
  std::vector<std::string> snapshot_users(const std::string& name, const std::string& except_id);
  // A checked spec for a create --from (image, shape taken from the
  // snapshot) and the verified snapshot, held (not deletable) until the
  // caller lets go; Error(field "from").
  snapshots::SnapshotService::Held prepare_from(SandboxSpec& checked);
  // Takes snapshot `name` of sb (held op_mu; running or paused).
  // With `split_ram` (fork), the RAM comes back there as a sealed memfd and
  // the snapshot holds dev.state (the stream without it) instead of
  // mem.state; if the stream cannot be split, mem.state as before.
  snapshots::Snapshot take_snapshot(Sandbox& sb, const std::string& name, bool memory,
                                    bool internal,
                                    std::shared_ptr<vmm::SealedRam>* split_ram = nullptr);
  // Removes an internal (fork) snapshot once nothing uses it. Never throws.
  void release_internal_snapshot(const std::string& name, const std::string& except_id) noexcept;
  // A paused sandbox of the previous daemon: live again, still paused.
  void adopt_paused(const SandboxRecord& rec);
  // Pauses sb (held op_mu, running); the reaper's on_idle "pause" too.
  void pause_locked(Sandbox& sb, const std::string& reason);
  // SIGKILLs sb's foreground execs and waits (up to `wait`) for their calls
  // to return: a pause ends them (engine_pause.cc).
  void kill_foreground_execs(Sandbox& sb, std::chrono::milliseconds wait);

  // The hand-out of a pool member (engine_handout.cc): a ready member of
  // `checked`'s exact shape (image, cpus, memory_mb, disk_mb, NIC or not),
  // made the caller's: running, its spec, metadata and lifetime, its clock
  // set to the host's; nullopt if none (a miss, which the pool learns from).
  // `trace` (if any) gets the hand-out's phases.
  std::optional<SandboxInfo> take_pooled(const SandboxSpec& checked, Trace* trace = nullptr);
  // Runs the image's warm-up commands (or `true`) in a new member and
  // records them (engine_handout.cc: why). False if one failed. Never throws.
  bool warm_up(Sandbox& sb, const std::vector<std::string>& commands);

  // With `tpl`: a clone of it (restore, no boot) instead of a cold boot.
  std::optional<BootFailure> boot_once(Sandbox& sb, const storage::Image& img, vmm::Accel accel,
                                       const templates::Template* tpl = nullptr,
                                       const snapshots::Snapshot* from = nullptr);
  // A short guest operation on the running sandbox `id` (engine_files.cc):
  // `path`, if given, is checked first; `op` runs a guest_client call on its
  // channel within kJsonOpTimeout. A failed call is rethrown as what it
  // means for the sandbox (stopped, failed); a GuestReplyError as it is.
  // `audit`, if given, is journaled as a "file" event, with "error" if the
  // call failed (an unusable reply is no failure: the guest did it).
  using GuestOp = std::function<void(channel::GuestChannel&, channel::Deadline)>;
  void guest_op(const std::string& id, const std::optional<std::string>& path,
                const nlohmann::json* audit, const GuestOp& op);
  void reaper_loop();
  // One reaper check of a live sandbox (engine_failure.cc):
  // nullopt if healthy; else how to end it. A verdict with
  // details["classify"] means "QEMU is gone": classify_death() says why
  // (outside `mu`). Also starts the agent ping when one is due.
  // `now` is steady_ms(). Called WITHOUT `mu` (it reads /proc and cgroups).
  std::optional<Verdict> check_health(const std::shared_ptr<Sandbox>& sb, int64_t now);

  // The warm pool (pool/warm_pool.h): its slots, counters, lock and thread.
  // After what its members' making and ending use; stopped by ~Engine
  // before anything else goes.
  PoolMembers pool_members{*this};
  pool::WarmPool pool{pool_options(cfg), pool_members};

  // The background teardowns (lifecycle/reclaimer.h), last: its thread
  // uses the members above, and it is drained before they go.
  lifecycle::Reclaimer reclaimer{[this](Sandbox& sb, const std::string& reason) {
    finish_stop(sb, State::deleted, reason, "deleted", {}, nlohmann::json::object());
  }};
};

}  // namespace airlock::engine

// One sandbox: the single owner of its state (docs/design.md, "State and
// lifecycle"). Its state lives here and in the registry row, nowhere else,
// and changes only through transition(), which checks the move against
// kTransitions, writes the registry with compare-and-set on the state and
// appends the journal event, all under this sandbox's own lock. A lost race
// (destroy vs. the reaper vs. set_network) is a typed Error(conflict) for
// the loser, never a write-back of a stale state.
//
//   auto sb = std::make_shared<Sandbox>(rec, registry, journal, networked);
//   sb->transition(State::starting, State::running, {.event = "created", ...});
//   if (sb->state() != State::running) throw ...;
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/scope_guard.h"
#include "engine/audit/journal.h"
#include "engine/channel/guest_channel.h"
#include "engine/engine.h"
#include "engine/launcher.h"
#include "engine/registry/registry.h"

namespace airlock::engine {

namespace nethost {
class EventReader;  // net/host/events.h: the helper's checked event stream
}

// Monotonic milliseconds (std::chrono::steady_clock): every deadline
// (lifetime, idle, ping, closed grace) is decided on this clock, so a step
// of the wall clock changes none of them.
int64_t steady_ms();
// Whole milliseconds from `t0` to now on the same clock.
int64_t ms_since(std::chrono::steady_clock::time_point t0);

// Whether `from` -> `to` is in the table (design.md has it with who may
// trigger each move).
bool transition_allowed(State from, State to);

// What a transition writes besides the state. `event` (if not empty) is
// appended to the journal with `details` + reason/failure.
struct Change {
  std::string reason;
  std::string failure;  // kept only for `failed`
  std::string event;
  nlohmann::json details = nlohmann::json::object();
  Durability durability = Durability::sync;
  // The journal record is part of the change: if it cannot be written,
  // transition() throws Error(internal) (the state HAS moved; the caller
  // unwinds, e.g. the create's scope guard tears the sandbox down).
  bool journal_required = false;
  std::optional<int> pid;
  std::optional<int64_t> boot_ms;
  bool write_record = false;  // also write every column of rec (pool hand-out)
};

// The streamed stdin of an exec started with ExecRequest::stdin_stream
// (Engine::write_stdin). Shared by the exec's call and its stdin writers.
struct StdinPipe {
  std::mutex mu;                   // held for a whole write: writes to one exec never interleave
  uint32_t stream = 0;             // the exec's channel stream
  bool closed = false;             // eof sent (under mu)
  std::atomic<bool> ended{false};  // the exec is over
  std::atomic<uint64_t> total{0};  // bytes sent to the guest so far
};

class Sandbox {
 public:
  // `rec` as inserted in the registry (state rec.info.state).
  Sandbox(SandboxRecord rec, Registry& registry, AuditJournal& journal);
  Sandbox(const Sandbox&) = delete;
  Sandbox& operator=(const Sandbox&) = delete;

  const std::string& id() const { return id_; }
  // The name of its run dir, jail, cgroup and QEMU: the id it was launched
  // under (a pool member's internal name stays its run name after hand-out).
  std::string run_name() const { return run_dir_.filename().string(); }
  // Pool hand-out, only before the sandbox is shared: from now on it is
  // `public_id` (rec.info.id too, and every journal record); the next
  // transition that writes the record renames its registry row.
  void hand_out(const std::string& public_id);
  const std::filesystem::path& run_dir() const { return run_dir_; }
  State state() const;
  // Moves `expected` -> `to`. Error(conflict) naming the actual state if the
  // sandbox is not in `expected` (or the registry row is not: someone else
  // moved it) or the move is not in the table. Error(internal) if the
  // registry cannot be written (the state is then unchanged). A journal
  // failure is logged, not thrown: the state change has happened.
  void transition(State expected, State to, const Change& change = {});
  // Moves from the current state to `to` if the table allows it; returns
  // the state it left, nullopt if the move is not allowed (e.g. someone
  // else is already stopping it). Same errors otherwise.
  std::optional<State> transition_any(State to, const Change& change = {});
  // Waits up to `timeout` for a terminal state; returns (state, failure,
  // reason) as of return.
  std::tuple<State, std::string, std::string> wait_ended(std::chrono::milliseconds timeout);

  // The public view: rec's info with the current state, policy and reason.
  SandboxInfo info() const;
  // The egress policy in force (set_network changes it).
  nlohmann::json network() const;
  void set_network(nlohmann::json policy);

  // Set at creation and never changed: whether the VM has a NIC (mode
  // "none" cannot be changed into another mode, nor back).
  bool networked = false;
  // Warm pool: the channel's stream count after the warm-up (engine_handout.cc).
  uint32_t streams_at_ready = 0;
  // Written only before the sandbox is shared (create/recover) or under
  // `mu`; the state field inside is not used (state() is).
  SandboxRecord rec;
  std::unique_ptr<VmHandle> vm;
  std::unique_ptr<channel::GuestChannel> channel;
  std::mutex mu;                          // execs, net_pid, rec (after sharing)
  std::map<std::string, uint32_t> execs;  // exec_id -> stream, while running
  // exec_id -> streamed stdin; ended execs stay (a write then is a conflict,
  // not "unknown") until kMaxEndedStdinPipes newer ones ended.
  std::map<std::string, std::shared_ptr<StdinPipe>> stdin_pipes;
  static constexpr size_t kMaxEndedStdinPipes = 64;
  // Foreground execs of a previous daemon still running in the guest
  // (exec_id -> their exec_start record): the one attach_exec() that sees
  // one end writes its journal record; teardown closes the rest.
  std::map<std::string, nlohmann::json> detached_execs;
  // exec_id -> the guest stream of an attach_exec() in progress (a pty
  // exec's terminal input and resizes go there).
  std::map<std::string, uint32_t> attached_streams;
  pid_t net_pid = 0;  // the airlock-net helper (0 = none: mode "none")
  // Reads, checks and journals the helper's events (attach_net_events);
  // reset it after kill_net_helper (it drains what the helper wrote).
  std::shared_ptr<nethost::EventReader> net_events;
  std::mutex net_mu;  // serialises policy changes
  // Held by pause, resume, snapshot, fork and teardown for their whole
  // run: one of them at a time, and a destroy waits for a pause to finish
  // instead of killing the VM under it (recursive: a failing pause tears
  // down).
  std::recursive_mutex op_mu;
  // Channels closed by a pause: kept until the sandbox goes, since an exec
  // call may still be returning from one.
  std::vector<std::unique_ptr<channel::GuestChannel>> old_channels;

  // Deadlines and activity, on steady_ms().
  std::atomic<int64_t> expires_steady_ms{0};
  std::atomic<int64_t> last_activity_ms{0};
  std::atomic<int> busy{0};
  std::atomic<bool> ping_in_flight{false};
  std::atomic<int64_t> ping_sent_ms{0};
  // Reaper-only (one reaper thread).
  int64_t last_ping_ms = 0;
  int64_t closed_seen_ms = 0;
  std::string memory_cgroup;
  // The image's exec defaults (ImageConfig env/workdir/user), set at
  // create/recover; an exec's own env, cwd and user win, then the sandbox's env.
  std::map<std::string, std::string> image_env;
  std::string image_workdir, image_user;
  std::vector<std::string> image_argv;  // Entrypoint + Cmd: an exec giving no command runs it

 private:
  void apply(State from, State to, const Change& change);  // under state_mu_

  std::string id_;
  std::string row_id_;  // the registry row's id: id_ but between hand_out and its write
  const std::filesystem::path run_dir_;
  Registry& registry_;
  AuditJournal& journal_;
  mutable std::mutex state_mu_;  // state_, failure_, reason_, network_
  std::condition_variable ended_;
  State state_;
  std::string failure_, reason_;
  nlohmann::json network_;
};

// Marks a call on `sb` in flight for idle_timeout: the sandbox is active
// from construction to destruction (the end of the call counts too).
class ActivityGuard {
 public:
  explicit ActivityGuard(Sandbox& sb) : sb_(sb) {
    sb_.last_activity_ms = steady_ms();
    ++sb_.busy;
  }
  ~ActivityGuard() {
    sb_.last_activity_ms = steady_ms();
    --sb_.busy;
  }
  ActivityGuard(const ActivityGuard&) = delete;
  ActivityGuard& operator=(const ActivityGuard&) = delete;

 private:
  Sandbox& sb_;
};

// "<prefix>" + 12 lowercase hex digits from getrandom (sandbox, pool member
// and exec ids).
std::string random_id(const std::string& prefix);

// A pause ends foreground execs (engine_pause.cc, kill_foreground_execs):
// their callers get this, whether the kill's exit status or the channel's
// close reached the call first.
[[noreturn]] void throw_paused_during_call(const Sandbox& sb);
// A guest call on `sb` failed with `e`: rethrown as what it means for the
// sandbox. Stopped meanwhile: the action no longer fits its state (conflict);
// failed (QEMU died, agent lost; the reaper notices within about a second
// and classifies it, and this waits for that, 5 s at most): the cause
// (vmm_died, guest_panic, ...); paused: throw_paused_during_call; else `e`.
[[noreturn]] void rethrow_guest_failure(Sandbox& sb, const Error& e);

}  // namespace airlock::engine

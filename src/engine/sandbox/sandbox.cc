#include "engine/sandbox/sandbox.h"

#include <spdlog/spdlog.h>
#include <sys/random.h>

#include <cerrno>
#include <chrono>

#include "common/error.h"
#include "engine/types_json.h"
#include "protocol/messages.h"

namespace airlock::engine {

int64_t steady_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               t0)
      .count();
}

namespace {

// The closed set of moves. Who triggers each is in docs/design.md ("State
// and lifecycle"): pausing/paused for pause and resume, snapshotting for
// snapshot and fork. Which states hold resources (quotas, followers) is
// holds_resources() in types_json.cc, beside the states' names, so the
// registry's own library has it too.
constexpr std::pair<State, State> kTransitions[] = {
    {State::starting, State::running},      // create committed, pool hand-out
    {State::starting, State::failed},       // boot failed
    {State::starting, State::stopping},     // pool member dropped, create unwound
    {State::running, State::stopping},      // destroy, reaper, recover
    {State::running, State::pausing},       // pause
    {State::running, State::snapshotting},  // snapshot / fork of a running one
    {State::pausing, State::paused},        {State::pausing, State::stopping},
    {State::pausing, State::running},  // the save failed: the VM continues
    {State::paused, State::running},   // resume
    {State::paused, State::snapshotting},   {State::paused, State::stopping},
    {State::snapshotting, State::running},  {State::snapshotting, State::paused},
    {State::snapshotting, State::stopping}, {State::stopping, State::deleted},
    {State::stopping, State::timed_out},    {State::stopping, State::failed},
};

}  // namespace

bool transition_allowed(State from, State to) {
  for (auto [f, t] : kTransitions)
    if (f == from && t == to) return true;
  return false;
}

Sandbox::Sandbox(SandboxRecord r, Registry& registry, AuditJournal& journal)
    : rec(std::move(r)),
      id_(rec.info.id),
      row_id_(rec.info.id),
      run_dir_(rec.run_dir),
      registry_(registry),
      journal_(journal),
      state_(rec.info.state),
      failure_(rec.info.failure),
      reason_(rec.info.reason),
      network_(rec.info.spec.network) {
  networked =
      rec.info.spec.network.is_object() && rec.info.spec.network.value("mode", "none") != "none";
}

void Sandbox::hand_out(const std::string& public_id) {
  id_ = public_id;
  rec.info.id = public_id;
}

State Sandbox::state() const {
  std::lock_guard lock(state_mu_);
  return state_;
}

void Sandbox::apply(State from, State to, const Change& c) {
  RegistryStateWrite w{from, to, c.reason, c.failure, c.pid, c.boot_ms, nullptr};
  SandboxRecord full;
  if (c.write_record) {
    full = rec;
    full.info.spec.network = network_;
    w.record = &full;
  }
  if (!registry_.compare_and_set_state(row_id_, w)) {
    auto now = registry_.get(row_id_);
    throw Error(Errc::conflict, "sandbox " + id_ + " is " +
                                    (now ? to_string(now->info.state) : "gone") +
                                    " in the registry, not " + to_string(from));
  }
  if (w.record) row_id_ = w.record->info.id;  // renamed with it (hand_out)
  state_ = to;
  reason_ = c.reason;
  failure_ = to == State::failed ? c.failure : std::string();
  {
    std::lock_guard lock(mu);  // info() reads rec under it (order: state_mu_, then mu)
    if (c.pid) rec.info.pid = *c.pid;
    if (is_terminal(to)) rec.info.pid = 0;
    if (c.boot_ms) rec.info.boot_ms = *c.boot_ms;
  }
  if (!c.event.empty()) {
    try {
      nlohmann::json ev = c.details.is_object() ? c.details : nlohmann::json::object();
      if (!c.reason.empty()) ev["reason"] = c.reason;
      if (!failure_.empty()) ev["failure"] = failure_;
      journal_.append(id_, c.event, ev, c.durability);
    } catch (const std::exception& e) {
      spdlog::error("sandbox {}: audit append of {} failed: {}", id_, c.event, e.what());
      if (is_terminal(to)) ended_.notify_all();
      if (c.journal_required)
        throw Error(Errc::internal, "sandbox " + id_ + ": cannot record " + c.event +
                                        " in the audit journal: " + e.what());
    }
  }
  if (is_terminal(to)) ended_.notify_all();
}

void Sandbox::transition(State expected, State to, const Change& change) {
  std::lock_guard lock(state_mu_);
  if (state_ != expected || !transition_allowed(expected, to))
    throw Error(Errc::conflict, "sandbox " + id_ + " is " + to_string(state_) + ", cannot go " +
                                    to_string(expected) + " -> " + to_string(to));
  apply(expected, to, change);
}

std::optional<State> Sandbox::transition_any(State to, const Change& change) {
  std::lock_guard lock(state_mu_);
  State from = state_;
  if (!transition_allowed(from, to)) return std::nullopt;
  apply(from, to, change);
  return from;
}

std::tuple<State, std::string, std::string> Sandbox::wait_ended(std::chrono::milliseconds t) {
  std::unique_lock lock(state_mu_);
  ended_.wait_for(lock, t, [&] { return is_terminal(state_); });
  return {state_, failure_, reason_};
}

SandboxInfo Sandbox::info() const {
  SandboxInfo i;
  {
    std::lock_guard lock(const_cast<std::mutex&>(mu));
    i = rec.info;
  }
  std::lock_guard lock(state_mu_);
  i.state = state_;
  i.reason = reason_;
  i.failure = failure_;
  i.spec.network = network_;
  return i;
}

nlohmann::json Sandbox::network() const {
  std::lock_guard lock(state_mu_);
  return network_;
}

void Sandbox::set_network(nlohmann::json policy) {
  std::lock_guard lock(state_mu_);
  network_ = std::move(policy);
}

std::string random_id(const std::string& prefix) {
  char bytes[6];
  size_t got = 0;
  while (got < sizeof bytes) {
    ssize_t n = ::getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno("getrandom");
    got += static_cast<size_t>(n);
  }
  return prefix + protocol::to_hex(std::string_view(bytes, sizeof bytes));
}

void throw_paused_during_call(const Sandbox& sb) {
  throw Error(Errc::conflict, "sandbox " + sb.rec.info.id +
                                  " was paused during the call: a pause ends foreground execs "
                                  "(this one was killed); background execs survive it");
}

void rethrow_guest_failure(Sandbox& sb, const Error& e) {
  if (State now = sb.state(); now == State::pausing || now == State::paused)
    throw_paused_during_call(sb);
  auto [st, failure, reason] =
      sb.wait_ended(sb.channel && sb.channel->closed() ? std::chrono::milliseconds(5000)
                                                       : std::chrono::milliseconds(0));
  if (st == State::failed && !failure.empty())
    throw Error(Errc::guest_error, "sandbox " + sb.rec.info.id +
                                       " failed during the call: " + failure + ": " + reason);
  if (e.code() == Errc::guest_error && st != State::running)
    throw Error(Errc::conflict, "sandbox " + sb.rec.info.id + " was stopped (" + to_string(st) +
                                    (reason.empty() ? "" : ": " + reason) + ") during the call");
  throw e;
}

}  // namespace airlock::engine

#include "engine/exec/service.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <csignal>

#include "common/error.h"
#include "engine/api/limits.h"
#include "engine/audit/chain.h"
#include "engine/channel/guest_client.h"
#include "engine/exec/outcome.h"
#include "engine/trace.h"
#include "engine/types_json.h"
#include "engine/validate.h"

namespace airlock::engine::exec {

namespace {

using channel::Clock;
constexpr auto kJsonOpTimeout = std::chrono::seconds(60);
// Host-side slack after an exec's own timeout before the host gives up on
// the guest reporting it (the guest enforces the timeout itself).
constexpr auto kExecGrace = std::chrono::seconds(30);

// What the daemon's parser cannot see: the engine's own bounds.
void validate_exec_extras(const ExecRequest& r) {
  // 0 = no limit; otherwise within the API's table.
  auto check = [](int64_t v, limits::Range range, const char* field) {
    if (v != 0 && !range.contains(v))
      throw Error(Errc::invalid_argument,
                  std::string(field) + " must be between " + std::to_string(range.min) + " and " +
                      std::to_string(range.max) + " (0 = none)",
                  field);
  };
  check(r.limits.pids, limits::kExecPids, "limits.pids");
  check(r.limits.memory_mb, limits::kExecMemoryMb, "limits.memory_mb");
  if (!(r.limits.cpu_seconds == 0 ||
        (r.limits.cpu_seconds >= 0.01 && r.limits.cpu_seconds <= 31536000)))
    throw Error(Errc::invalid_argument,
                "limits.cpu_seconds must be between 0.01 and 31536000 (0 = none)",
                "limits.cpu_seconds");
  if (r.stdin_stream && r.stdin_data)
    throw Error(Errc::invalid_argument, "give either stdin or stdin_stream, not both",
                "stdin_stream");
  if (r.output_limit_bytes > (uint64_t{1} << 40))
    throw Error(Errc::invalid_argument, "output_limit_bytes must be at most 2^40",
                "output_limit_bytes");
}

// The guest exec request for `request` (argv, env, cwd, user, timeout, limits).
// An exec giving neither argv nor cmd (and no pty) runs the image's
// Entrypoint + Cmd, as `docker run IMAGE` does; `copy` holds the result.
const ExecRequest& with_image_command(const Sandbox& sb, const ExecRequest& r, ExecRequest& copy) {
  if (r.pty || !r.argv.empty() || !r.cmd.empty() || sb.image_argv.empty()) return r;
  copy = r;
  copy.argv = sb.image_argv;
  return copy;
}

// What the guest runs for `request`: argv (cmd through /bin/sh -c), env,
// cwd, user, timeout, limits and the output cap.
channel::ExecParams exec_params(const Sandbox& sb, const ExecRequest& request) {
  channel::ExecParams p;
  p.argv =
      request.cmd.empty() ? request.argv : std::vector<std::string>{"/bin/sh", "-c", request.cmd};
  // The image's env, then the sandbox's, then the request's own entries win.
  p.env = sb.image_env;
  for (const auto& [k, v] : sb.rec.info.spec.env) p.env[k] = v;
  for (const auto& [k, v] : request.env) p.env[k] = v;
  // A pty exec without a command gets the user's login shell (empty argv),
  // in the user's home (no cwd): the guest's defaults.
  std::string cwd = request.cwd.empty() ? sb.image_workdir : request.cwd;
  if (!cwd.empty() || !request.pty) p.cwd = cwd.empty() ? "/" : cwd;
  if (request.pty) p.pty = channel::PtySize{request.pty->cols, request.pty->rows};
  p.user = request.user.empty() ? sb.image_user : request.user;
  if (request.timeout_s > 0) p.timeout_ms = static_cast<int64_t>(request.timeout_s * 1000);
  p.limit_pids = request.limits.pids;
  p.limit_memory_mb = request.limits.memory_mb;
  p.limit_cpu_seconds = request.limits.cpu_seconds;
  p.output_limit_bytes = request.output_limit_bytes;
  return p;
}

// A background exec as the guest's job reports it.
ExecStatus status_of(const channel::Job& j) {
  ExecStatus s;
  s.exec_id = j.exec_id;
  s.argv = j.argv;
  s.pid = j.pid;
  s.started_at_ms = j.started_at_ms;
  s.running = j.running;
  s.result.exec_id = s.exec_id;
  if (!s.running) take_exit(j.outcome, s.result);
  return s;
}

// The names of the environment an exec was given, never the values (they
// hold secrets), for the journal.
nlohmann::json env_keys(const ExecRequest& request) {
  nlohmann::json keys = nlohmann::json::array();
  for (const auto& [k, v] : request.env) keys.push_back(k);
  return keys;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One foreground exec, step by step: its stream in the sandbox's exec table
// (and stdin pipe), the start on record, the guest's run with the caller's
// callbacks, and the end on record with the SHA-256 of exactly the bytes
// handed to the caller, hashed here on the host as they pass (never the
// guest's word).
class ForegroundExec {
 public:
  ForegroundExec(AuditJournal& journal, const Options& opts, std::shared_ptr<Sandbox> sb,
                 const std::string& id, const ExecRequest& request, const ExecCallbacks& callbacks,
                 Trace& trace)
      : journal_(journal),
        opts_(opts),
        sb_(std::move(sb)),
        id_(id),
        request_(request),
        callbacks_(callbacks),
        trace_(trace) {}

  ExecResult run() {
    prepare();
    // The start is on record before the guest runs anything: a daemon killed
    // mid-exec leaves exec_start without an end; the next daemon's recover()
    // marks it detached (attach_exec writes the end) or, if the sandbox is
    // gone, closes it as `interrupted`.
    try {
      journal_.append(id_, "exec_start", audit_);  // write(2) survives a daemon kill
    } catch (...) {
      finish();
      throw;
    }
    trace_.mark("journal_start");
    channel::ExecOutcome r;
    try {
      r = channel::run_exec(*sb_->channel, stream_, params_, stdin_source(), handlers(), deadline_);
    } catch (const Error& e) {
      fail(e);
    }
    finish();
    complete(r);
    return std::move(result_);
  }

 private:
  // The guest's parameters, the exec id (named in the guest too: if this
  // daemon dies, the exec runs on there, detached, keeping its last
  // exec_buffer_bytes of output for attach_exec; a pty exec too: its
  // terminal output), its stream and stdin pipe, and the start record.
  void prepare() {
    params_ = exec_params(*sb_, request_);
    if (request_.timeout_s > 0) {
      deadline_ = Clock::now() +
                  std::chrono::milliseconds(static_cast<int64_t>(request_.timeout_s * 1000)) +
                  kExecGrace;
    }
    result_.exec_id = random_id("ex-");
    params_.exec_id = result_.exec_id;
    params_.output_buffer_bytes = opts_.buffer_bytes;
    stream_ = sb_->channel->open_stream();
    {
      std::lock_guard lock(sb_->mu);
      sb_->execs[result_.exec_id] = stream_;
    }
    if (request_.stdin_stream) {
      params_.stdin_stream = true;  // open, fed by write_stdin() (GuestChannel::exec)
      pipe_ = std::make_shared<StdinPipe>();
      pipe_->stream = stream_;
      std::lock_guard lock(sb_->mu);
      sb_->stdin_pipes[result_.exec_id] = pipe_;
    }
    audit_ = {{"exec_id", result_.exec_id},
              {"argv", params_.argv},
              {"cwd", params_.cwd.value_or("~")},
              {"user", request_.user.empty() ? "root" : request_.user},
              {"env_keys", env_keys(request_)}};
    if (request_.pty) audit_["pty"] = true;
    t0_ = std::chrono::steady_clock::now();
  }

  channel::ChunkSource stdin_source() {
    if (!request_.stdin_data) return {};
    auto sent = std::make_shared<size_t>(0);
    const std::string* data = &*request_.stdin_data;
    return [data, sent, this]() -> std::optional<std::string> {
      if (*sent >= data->size()) return std::nullopt;
      std::string chunk = data->substr(*sent, 64 * 1024);
      *sent += chunk.size();
      result_.stdin_bytes += chunk.size();
      return chunk;
    };
  }

  channel::ExecHandlers handlers() {
    channel::ExecHandlers h;
    h.on_start = [this](int pid) {
      if (callbacks_.on_start) callbacks_.on_start(result_.exec_id, pid);
    };
    h.on_output = [this](int ch, std::string_view bytes) {
      (ch == 1 ? result_.stdout_bytes : result_.stderr_bytes) += bytes.size();
      (ch == 1 ? out_hash_ : err_hash_).update(bytes);
      return callbacks_.on_output ? callbacks_.on_output(ch, bytes) : true;
    };
    return h;
  }

  int64_t elapsed_ms() const {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                 t0_)
        .count();
  }

  // The exec is out of the sandbox's tables; its pipe, if any, ended.
  void finish() {
    std::lock_guard lock(sb_->mu);
    sb_->execs.erase(result_.exec_id);
    if (!pipe_) return;
    pipe_->ended = true;
    result_.stdin_bytes = pipe_->total;
    // Forget the oldest ended pipes beyond the cap (ids are random, so
    // "oldest" is approximate: any ended one will do).
    size_t ended = 0;
    for (auto& [k, p] : sb_->stdin_pipes) ended += p->ended ? 1 : 0;
    for (auto it = sb_->stdin_pipes.begin();
         ended > Sandbox::kMaxEndedStdinPipes && it != sb_->stdin_pipes.end();) {
      if (it->second->ended && it->first != result_.exec_id) {
        it = sb_->stdin_pipes.erase(it);
        --ended;
      } else {
        ++it;
      }
    }
  }

  // The guest run failed: its end on record with the error, then the error
  // as what it means for the sandbox.
  [[noreturn]] void fail(const Error& e) {
    finish();
    audit_["error"] = e.what();
    audit_["duration_ms"] = elapsed_ms();
    try {
      journal_.append(id_, "exec", audit_);
    } catch (const std::exception& a) {
      spdlog::error("sandbox {}: audit: {}", id_, a.what());
    }
    rethrow_guest_failure(*sb_, e);
  }

  void complete(const channel::ExecOutcome& r) {
    result_.duration_ms = elapsed_ms();
    // The guest's response is untrusted (the client took only well-typed
    // fields). The byte counts are what the host delivered plus what the
    // guest says it dropped beyond the cap; the duration is the host's.
    int64_t host_ms = result_.duration_ms;
    take_outcome(r, result_);
    result_.duration_ms = host_ms;
    result_.stdout_bytes += result_.stdout_dropped;
    result_.stderr_bytes += result_.stderr_dropped;
    // The host's own deadline (the guest did not report in time) is a timeout too.
    if (result_.timed_out && (result_.reason == "killed" || result_.reason == "signaled"))
      result_.reason = "timeout";
    trace_.mark("guest");
    // The guest's own account (integers or nothing: it is untrusted and only
    // logged): request to reply inside the agent, and the process's life.
    trace_.note("agent_us", static_cast<int64_t>(r.agent_us));
    trace_.note("run_us", static_cast<int64_t>(r.run_us));
    if (Trace::enabled()) {
      // ... and its phases (api/guest-protocol.md §5, spawn_us), the same way.
      for (const char* k : channel::kSpawnPhases) {
        auto it = r.spawn_us.find(k);
        uint64_t us = it == r.spawn_us.end() ? 0 : it->second;
        trace_.note((std::string("agent_") + k).c_str(), static_cast<int64_t>(us));
      }
    }
    audit_.update(to_json(result_));
    audit_["stdout_sha256"] = out_hash_.hex();
    audit_["stderr_sha256"] = err_hash_.hex();
    // Killed by a pause (kill_foreground_execs): on record as such, typed.
    State now = sb_->state();
    bool paused = result_.signal == SIGKILL && (now == State::pausing || now == State::paused);
    if (paused) audit_["ended_by"] = "pause";
    journal_.append(id_, "exec", audit_);
    trace_.mark("journal_end");
    if (paused) throw_paused_during_call(*sb_);
  }

  AuditJournal& journal_;
  const Options& opts_;
  std::shared_ptr<Sandbox> sb_;
  const std::string& id_;
  const ExecRequest& request_;
  const ExecCallbacks& callbacks_;
  Trace& trace_;
  channel::ExecParams params_;
  std::optional<channel::Deadline> deadline_;
  ExecResult result_;
  uint32_t stream_ = 0;
  std::shared_ptr<StdinPipe> pipe_;
  Sha256 out_hash_, err_hash_;
  nlohmann::json audit_;
  std::chrono::steady_clock::time_point t0_;
};

// The request as the sandbox runs it (the image's command if it names
// none; in `copy` then), checked.
const ExecRequest& checked_request(const Sandbox& sb, const ExecRequest& given, ExecRequest& copy) {
  const ExecRequest& request = with_image_command(sb, given, copy);
  validate_exec(request);
  validate_exec_extras(request);
  return request;
}

}  // namespace

// run() without the metrics: the lookup and checks, then the run.
ExecResult ExecService::run_foreground(const std::string& id, const ExecRequest& given,
                                       const ExecCallbacks& callbacks) {
  Trace trace("exec", id);
  auto sb = table_.running(id);
  ActivityGuard active(*sb);
  ExecRequest with_image;
  const ExecRequest& request = checked_request(*sb, given, with_image);
  if (request.background)
    throw Error(Errc::invalid_argument, "a background exec is started with exec_background()",
                "background");
  trace.mark("lookup");
  return ForegroundExec(journal_, opts_, sb, id, request, callbacks, trace).run();
}

// start_background() without the metrics.
ExecStatus ExecService::run_background(const std::string& id, const ExecRequest& given) {
  auto sb = table_.running(id);
  ActivityGuard active(*sb);
  ExecRequest with_image;
  const ExecRequest& request = checked_request(*sb, given, with_image);
  if (request.stdin_data)
    throw Error(Errc::invalid_argument, "a background exec takes no stdin", "stdin");
  channel::ExecParams params = exec_params(*sb, request);
  params.stdin_stream = request.stdin_stream;  // a pipe fed by write_stdin() (job_stdin)
  const std::string exec_id = random_id("ex-");
  params.exec_id = exec_id;
  // (null: a pty exec without a command, which has neither.)
  nlohmann::json audit{
      {"exec_id", exec_id},
      {"argv", params.argv.empty() ? nlohmann::json() : nlohmann::json(params.argv)},
      {"cwd", params.cwd ? nlohmann::json(*params.cwd) : nlohmann::json()},
      {"user", request.user.empty() ? "root" : request.user},
      {"env_keys", env_keys(request)},
      {"background", true}};
  ExecStatus s;
  try {
    s = status_of(channel::start_background(*sb->channel, params, Clock::now() + kJsonOpTimeout));
  } catch (const channel::GuestReplyError&) {
    throw;  // not a job this sandbox can name: nothing on record
  } catch (const Error& e) {
    audit["error"] = e.what();
    journal_.append(id, "exec", audit);
    rethrow_guest_failure(*sb, e);
  }
  audit["pid"] = s.pid;
  journal_.append(id, "exec", audit);
  return s;
}

// run() and start_background() are counted by outcome and timed for GET
// /metrics; run_foreground and run_background do the work. `outcome` names
// a success; an Error counts as its code, anything else as "internal".
template <class Run, class Outcome>
auto ExecService::counted(const char* kind, Run&& run, Outcome&& outcome) {
  auto t0 = std::chrono::steady_clock::now();
  try {
    auto r = run();
    metrics_.exec_done(kind, outcome(r), seconds_since(t0));
    return r;
  } catch (const Error& e) {
    metrics_.exec_done(kind, std::string(to_string(e.code())), seconds_since(t0));
    throw;
  } catch (...) {
    metrics_.exec_done(kind, "internal", seconds_since(t0));
    throw;
  }
}

ExecResult ExecService::run(const std::string& id, const ExecRequest& request,
                            const ExecCallbacks& callbacks) {
  return counted(
      "foreground", [&] { return run_foreground(id, request, callbacks); },
      [](const ExecResult& r) { return r.reason.empty() ? std::string("exited") : r.reason; });
}

ExecStatus ExecService::start_background(const std::string& id, const ExecRequest& request) {
  return counted(
      "background", [&] { return run_background(id, request); },
      [](const ExecStatus&) { return std::string("started"); });
}

void ExecService::kill(const std::string& id, const std::string& exec_id, int signal) {
  auto sb = table_.running(id);
  if (signal < 1 || signal > 64)
    throw Error(Errc::invalid_argument, "signal must be between 1 and 64", "signal");
  uint32_t stream = 0;
  bool it_found;
  {
    std::lock_guard lock(sb->mu);
    auto it = sb->execs.find(exec_id);
    it_found = it != sb->execs.end();
    if (it != sb->execs.end()) stream = it->second;
  }
  if (it_found) {
    sb->channel->signal(stream, signal);
    return;
  }
  // Not streaming to this daemon: a background exec, or a foreground one a
  // previous daemon started (detached in the guest, or re-attached).
  const nlohmann::json record{{"exec_id", exec_id}, {"signal", signal}};
  channel::KillReply r;
  try {
    r = channel::kill_job(*sb->channel, exec_id, signal, Clock::now() + kJsonOpTimeout);
  } catch (const channel::GuestReplyError&) {
    journal_.append(id, "exec_kill", record);  // the guest took the signal
    throw;
  } catch (const Error& e) {
    if (e.code() == Errc::not_found)
      throw Error(Errc::not_found, "no exec " + exec_id + " in sandbox " + id, "exec_id");
    rethrow_guest_failure(*sb, e);
  }
  journal_.append(id, "exec_kill", record);
  // Nobody attached: collect its end here, so the journal records it as an
  // attach would (an attached client receives the end itself).
  if (r.collect) collect_detached_end(id, exec_id, r.end);
}

std::vector<ExecStatus> ExecService::list(const std::string& id) {
  auto sb = table_.running(id);
  ActivityGuard active(*sb);
  std::vector<channel::Job> jobs;
  try {
    jobs = channel::jobs(*sb->channel, Clock::now() + kJsonOpTimeout);
  } catch (const channel::GuestReplyError&) {
    throw;
  } catch (const Error& e) {
    rethrow_guest_failure(*sb, e);
  }
  std::vector<ExecStatus> out;
  for (const auto& j : jobs) out.push_back(status_of(j));
  return out;
}

ExecStatus ExecService::wait(const std::string& id, const std::string& exec_id, double timeout_s) {
  if (!(timeout_s >= 0) || timeout_s > 3600)
    throw Error(Errc::invalid_argument, "wait must be between 0 and 3600 seconds", "wait");
  auto sb = table_.running(id);
  ActivityGuard active(*sb);
  auto ms = static_cast<int64_t>(timeout_s * 1000);
  channel::Job job;
  try {
    job = channel::wait_job(*sb->channel, exec_id, ms,
                            Clock::now() + std::chrono::milliseconds(ms) + kJsonOpTimeout);
  } catch (const channel::GuestReplyError&) {
    throw;
  } catch (const Error& e) {
    if (e.code() == Errc::not_found)
      throw Error(Errc::not_found, "no background exec " + exec_id + " in sandbox " + id,
                  "exec_id");
    rethrow_guest_failure(*sb, e);
  }
  return status_of(job);
}

}  // namespace airlock::engine::exec

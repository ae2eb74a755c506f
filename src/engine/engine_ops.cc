// exec and file operations on a running sandbox. Each call is driven on the
// caller's thread through the typed guest client (channel/guest_client.h)
// over the sandbox's GuestChannel, and audited.
#include <spdlog/spdlog.h>

#include <chrono>
#include <csignal>

#include "common/error.h"
#include "engine/channel/guest_client.h"
#include "engine/engine.h"
#include "engine/engine_impl.h"
#include "engine/trace.h"
#include "engine/types_json.h"
#include "engine/validate.h"

namespace airlock::engine {

namespace {

using channel::Clock;
constexpr auto kJsonOpTimeout = std::chrono::seconds(60);
// Host-side slack after an exec's own timeout before the host gives up on
// the guest reporting it (the guest enforces the timeout itself).
constexpr auto kExecGrace = std::chrono::seconds(30);

// Streaming file transfers may legitimately take long under TCG; the
// sandbox's life bounds them (the reaper kills the VM at expiry).
channel::Deadline transfer_deadline(const Sandbox& sb) {
  int64_t left_ms = std::max<int64_t>(sb.expires_steady_ms.load() - steady_ms(), 1000);
  return Clock::now() + std::chrono::milliseconds(std::min<int64_t>(left_ms, 3600 * 1000));
}

// A pause ends foreground execs (engine_pause.cc, kill_foreground_execs):
// their callers get this, whether the kill's exit status or the channel's
// close reached the call first.
[[noreturn]] void throw_paused_during_call(Sandbox& sb) {
  throw Error(Errc::conflict, "sandbox " + sb.rec.info.id +
                                  " was paused during the call: a pause ends foreground execs "
                                  "(this one was killed); background execs survive it");
}

// A guest failure on a sandbox that was stopped meanwhile is reported as
// what it is: the action no longer fits the sandbox's state. If the guest
// went away under the call (QEMU died, agent lost), the reaper notices
// within about a second and classifies it; the call waits for that (5 s at
// most) so its error names the cause (vmm_died, guest_panic, ...).
[[noreturn]] void rethrow_for(Sandbox& sb, const Error& e) {
  // Paused under the call (pause closes the channel): typed.
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

// The exit fields of a guest outcome (decoded and bounded by the client)
// into `res`; the duration only if the guest reported one.
void take_exit(const channel::ExecOutcome& o, ExecResult& res) {
  res.exit_code = o.exit_code;
  res.signal = o.signal;
  res.timed_out = o.timed_out;
  res.reason = o.reason;
  if (o.duration_ms) res.duration_ms = *o.duration_ms;
}

// What the daemon's parser cannot see: the engine's own bounds.
void validate_exec_extras(const ExecRequest& r) {
  if (r.limits.pids < 0 || r.limits.pids > 1048576)
    throw Error(Errc::invalid_argument, "limits.pids must be between 1 and 1048576 (0 = none)",
                "limits.pids");
  if (r.limits.memory_mb < 0 || r.limits.memory_mb > 1048576)
    throw Error(Errc::invalid_argument, "limits.memory_mb must be between 1 and 1048576 (0 = none)",
                "limits.memory_mb");
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

}  // namespace

void take_outcome(const channel::ExecOutcome& o, ExecResult& res) {
  take_exit(o, res);
  res.stdout_dropped = o.stdout_dropped;
  res.stderr_dropped = o.stderr_dropped;
  res.truncated = res.stdout_dropped > 0 || res.stderr_dropped > 0;
}

[[noreturn]] void rethrow_exec_error(Sandbox& sb, const Error& e) { rethrow_for(sb, e); }

namespace {

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

}  // namespace

namespace {

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

}  // namespace

// exec() and exec_background() are counted by outcome and timed for GET
// /metrics; the *_counted bodies do the work.
ExecResult Engine::exec(const std::string& id, const ExecRequest& request,
                        const ExecCallbacks& callbacks) {
  auto t0 = std::chrono::steady_clock::now();
  try {
    ExecResult r = exec_counted(id, request, callbacks);
    impl_->metrics.exec_done("foreground", r.reason.empty() ? "exited" : r.reason,
                             seconds_since(t0));
    return r;
  } catch (const Error& e) {
    impl_->metrics.exec_done("foreground", std::string(to_string(e.code())), seconds_since(t0));
    throw;
  } catch (...) {
    impl_->metrics.exec_done("foreground", "internal", seconds_since(t0));
    throw;
  }
}

ExecStatus Engine::exec_background(const std::string& id, const ExecRequest& request) {
  auto t0 = std::chrono::steady_clock::now();
  try {
    ExecStatus st = exec_background_counted(id, request);
    impl_->metrics.exec_done("background", "started", seconds_since(t0));
    return st;
  } catch (const Error& e) {
    impl_->metrics.exec_done("background", std::string(to_string(e.code())), seconds_since(t0));
    throw;
  } catch (...) {
    impl_->metrics.exec_done("background", "internal", seconds_since(t0));
    throw;
  }
}

ExecResult Engine::exec_counted(const std::string& id, const ExecRequest& given,
                                const ExecCallbacks& callbacks) {
  auto& impl = *impl_;
  Trace trace("exec", id);
  auto sb = impl.table.running(id);
  ActivityGuard active(*sb);
  ExecRequest with_image;
  const ExecRequest& request = with_image_command(*sb, given, with_image);
  validate_exec(request);
  validate_exec_extras(request);
  if (request.background)
    throw Error(Errc::invalid_argument, "a background exec is started with exec_background()",
                "background");
  trace.mark("lookup");

  channel::ExecParams params = exec_params(*sb, request);
  std::optional<channel::Deadline> deadline;
  if (request.timeout_s > 0) {
    deadline = Clock::now() +
               std::chrono::milliseconds(static_cast<int64_t>(request.timeout_s * 1000)) +
               kExecGrace;
  }

  ExecResult result;
  result.exec_id = random_id("ex-");
  // Named in the guest too: if this daemon dies, the exec runs on there,
  // detached, keeping its last exec_buffer_bytes of output for attach_exec
  // (a pty exec too: its terminal output).
  params.exec_id = result.exec_id;
  params.output_buffer_bytes = impl.cfg.exec_buffer_bytes;
  uint32_t stream = sb->channel->open_stream();
  {
    std::lock_guard lock(sb->mu);
    sb->execs[result.exec_id] = stream;
  }
  std::shared_ptr<StdinPipe> pipe;
  if (request.stdin_stream) {
    params.stdin_stream = true;  // open, fed by write_stdin() (GuestChannel::exec)
    pipe = std::make_shared<StdinPipe>();
    pipe->stream = stream;
    std::lock_guard lock(sb->mu);
    sb->stdin_pipes[result.exec_id] = pipe;
  }
  channel::ChunkSource stdin_source;
  if (request.stdin_data) {
    auto sent = std::make_shared<size_t>(0);
    const std::string* data = &*request.stdin_data;
    stdin_source = [data, sent, &result]() -> std::optional<std::string> {
      if (*sent >= data->size()) return std::nullopt;
      std::string chunk = data->substr(*sent, 64 * 1024);
      *sent += chunk.size();
      result.stdin_bytes += chunk.size();
      return chunk;
    };
  }
  channel::ExecHandlers handlers;
  handlers.on_start = [&](int pid) {
    if (callbacks.on_start) callbacks.on_start(result.exec_id, pid);
  };
  // The journal records the SHA-256 of exactly the bytes handed to the
  // caller, hashed here on the host as they pass (never the guest's word).
  Sha256 out_hash, err_hash;
  handlers.on_output = [&](int ch, std::string_view bytes) {
    (ch == 1 ? result.stdout_bytes : result.stderr_bytes) += bytes.size();
    (ch == 1 ? out_hash : err_hash).update(bytes);
    return callbacks.on_output ? callbacks.on_output(ch, bytes) : true;
  };

  nlohmann::json audit{{"exec_id", result.exec_id},
                       {"argv", params.argv},
                       {"cwd", params.cwd.value_or("~")},
                       {"user", request.user.empty() ? "root" : request.user},
                       {"env_keys", env_keys(request)}};
  if (request.pty) audit["pty"] = true;
  auto t0 = std::chrono::steady_clock::now();
  auto finish = [&] {
    std::lock_guard lock(sb->mu);
    sb->execs.erase(result.exec_id);
    if (!pipe) return;
    pipe->ended = true;
    result.stdin_bytes = pipe->total;
    // Forget the oldest ended pipes beyond the cap (ids are random, so
    // "oldest" is approximate: any ended one will do).
    size_t ended = 0;
    for (auto& [k, p] : sb->stdin_pipes) ended += p->ended ? 1 : 0;
    for (auto it = sb->stdin_pipes.begin();
         ended > Sandbox::kMaxEndedStdinPipes && it != sb->stdin_pipes.end();) {
      if (it->second->ended && it->first != result.exec_id) {
        it = sb->stdin_pipes.erase(it);
        --ended;
      } else {
        ++it;
      }
    }
  };
  // The start is on record before the guest runs anything: a daemon killed
  // mid-exec leaves exec_start without an end; the next daemon's recover()
  // marks it detached (attach_exec writes the end) or, if the sandbox is
  // gone, closes it as `interrupted`.
  try {
    impl.journal.append(id, "exec_start", audit);  // write(2) survives a daemon kill
  } catch (...) {
    finish();
    throw;
  }
  trace.mark("journal_start");
  channel::ExecOutcome r;
  try {
    r = channel::run_exec(*sb->channel, stream, params, stdin_source, handlers, deadline);
  } catch (const Error& e) {
    finish();
    audit["error"] = e.what();
    audit["duration_ms"] =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    try {
      impl.journal.append(id, "exec", audit);
    } catch (const std::exception& a) {
      spdlog::error("sandbox {}: audit: {}", id, a.what());
    }
    rethrow_for(*sb, e);
  }
  finish();
  result.duration_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  // The guest's response is untrusted (the client took only well-typed
  // fields). The byte counts are what the host delivered plus what the
  // guest says it dropped beyond the cap; the duration is the host's.
  int64_t host_ms = result.duration_ms;
  take_outcome(r, result);
  result.duration_ms = host_ms;
  result.stdout_bytes += result.stdout_dropped;
  result.stderr_bytes += result.stderr_dropped;
  // The host's own deadline (the guest did not report in time) is a timeout too.
  if (result.timed_out && (result.reason == "killed" || result.reason == "signaled"))
    result.reason = "timeout";
  trace.mark("guest");
  // The guest's own account (integers or nothing: it is untrusted and only
  // logged): request to reply inside the agent, and the process's life.
  trace.note("agent_us", static_cast<int64_t>(r.agent_us));
  trace.note("run_us", static_cast<int64_t>(r.run_us));
  if (Trace::enabled()) {
    // ... and its phases (api/guest-protocol.md §5, spawn_us), the same way.
    for (const char* k : channel::kSpawnPhases)
      trace.note((std::string("agent_") + k).c_str(), static_cast<int64_t>(r.spawn_us[k]));
  }
  audit.update(to_json(result));
  audit["stdout_sha256"] = out_hash.hex();
  audit["stderr_sha256"] = err_hash.hex();
  // Killed by a pause (kill_foreground_execs): on record as such, typed.
  State now = sb->state();
  bool paused = result.signal == SIGKILL && (now == State::pausing || now == State::paused);
  if (paused) audit["ended_by"] = "pause";
  impl.journal.append(id, "exec", audit);
  trace.mark("journal_end");
  if (paused) throw_paused_during_call(*sb);
  return result;
}

void Engine::kill_exec(const std::string& id, const std::string& exec_id, int signal) {
  auto sb = impl_->table.running(id);
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
    impl_->journal.append(id, "exec_kill", record);  // the guest took the signal
    throw;
  } catch (const Error& e) {
    if (e.code() == Errc::not_found)
      throw Error(Errc::not_found, "no exec " + exec_id + " in sandbox " + id, "exec_id");
    rethrow_for(*sb, e);
  }
  impl_->journal.append(id, "exec_kill", record);
  // Nobody attached: collect its end here, so the journal records it as an
  // attach would (an attached client receives the end itself).
  if (r.collect) collect_detached_end(*this, id, exec_id, r.end);
}

ExecStatus Engine::exec_background_counted(const std::string& id, const ExecRequest& given) {
  auto& impl = *impl_;
  auto sb = impl.table.running(id);
  ActivityGuard active(*sb);
  ExecRequest with_image;
  const ExecRequest& request = with_image_command(*sb, given, with_image);
  validate_exec(request);
  validate_exec_extras(request);
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
    impl.journal.append(id, "exec", audit);
    rethrow_for(*sb, e);
  }
  audit["pid"] = s.pid;
  impl.journal.append(id, "exec", audit);
  return s;
}

std::vector<ExecStatus> Engine::list_execs(const std::string& id) {
  std::vector<channel::Job> jobs;
  impl_->guest_op(id, {}, nullptr, [&](channel::GuestChannel& ch, channel::Deadline d) {
    jobs = channel::jobs(ch, d);
  });
  std::vector<ExecStatus> out;
  for (const auto& j : jobs) out.push_back(status_of(j));
  return out;
}

ExecStatus Engine::wait_exec(const std::string& id, const std::string& exec_id, double timeout_s) {
  if (!(timeout_s >= 0) || timeout_s > 3600)
    throw Error(Errc::invalid_argument, "wait must be between 0 and 3600 seconds", "wait");
  auto sb = impl_->table.running(id);
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
    rethrow_for(*sb, e);
  }
  return status_of(job);
}

uint64_t Engine::write_file(const std::string& id, const std::string& path, uint32_t mode,
                            const ChunkSource& source) {
  return write_file_as(id, path, mode, source, {});
}

uint64_t Engine::write_file_as(const std::string& id, const std::string& path, uint32_t mode,
                               const ChunkSource& source, const std::string& owner) {
  auto sb = impl_->table.running(id);
  ActivityGuard active(*sb);
  validate_guest_path(path);
  if (mode > 07777) throw Error(Errc::invalid_argument, "mode must be at most 07777", "mode");
  if (owner.size() > 64 || owner.find('\0') != std::string::npos)
    throw Error(Errc::invalid_argument, "user must be a name or uid of at most 64 bytes", "user");
  uint64_t n;
  // Hashed as the bytes go to the guest: the journal names what was written.
  Sha256 hash;
  ChunkSource hashed = [&]() -> std::optional<std::string> {
    auto chunk = source();
    if (chunk) hash.update(*chunk);
    return chunk;
  };
  try {
    n = sb->channel->write_file(path, mode, /*parents=*/true, hashed, transfer_deadline(*sb),
                                owner);
  } catch (const Error& e) {
    impl_->journal.append(id, "file", {{"op", "write"}, {"path", path}, {"error", e.what()}});
    rethrow_for(*sb, e);
  }
  impl_->journal.append(id, "file",
                        {{"op", "write"},
                         {"path", path},
                         {"bytes", n},
                         {"size", n},
                         {"mode", mode},
                         {"sha256", hash.hex()}});
  return n;
}

uint64_t Engine::read_file(const std::string& id, const std::string& path, const ChunkSink& sink) {
  auto sb = impl_->table.running(id);
  ActivityGuard active(*sb);
  validate_guest_path(path);
  uint64_t n;
  try {
    n = sb->channel->read_file(path, sink, transfer_deadline(*sb));
  } catch (const Error& e) {
    impl_->journal.append(id, "file", {{"op", "read"}, {"path", path}, {"error", e.what()}});
    rethrow_for(*sb, e);
  }
  impl_->journal.append(id, "file", {{"op", "read"}, {"path", path}, {"bytes", n}});
  return n;
}

void Engine::Impl::guest_op(const std::string& id, const std::optional<std::string>& path,
                            const nlohmann::json* audit, const GuestOp& op) {
  auto sb = table.running(id);
  ActivityGuard active(*sb);
  if (path) validate_guest_path(*path);
  try {
    op(*sb->channel, Clock::now() + kJsonOpTimeout);
  } catch (const channel::GuestReplyError&) {
    // The guest did it; only its answer is unusable.
    if (audit) journal.append(id, "file", *audit);
    throw;
  } catch (const Error& e) {
    if (audit) {
      nlohmann::json failed = *audit;
      failed["error"] = e.what();
      journal.append(id, "file", failed);
    }
    rethrow_for(*sb, e);
  }
  if (audit) journal.append(id, "file", *audit);
}

nlohmann::json Engine::list_files(const std::string& id, const std::string& path) {
  return list_files(id, path, 1);
}

// The journal records these as "file" events: {"op": "mkdir"|"remove",
// "path", "parents"|"recursive"}, with "error" if the guest refused.
void Engine::make_dir(const std::string& id, const std::string& path, bool parents) {
  const nlohmann::json audit{{"op", "mkdir"}, {"path", path}, {"parents", parents}};
  impl_->guest_op(id, path, &audit, [&](channel::GuestChannel& ch, channel::Deadline d) {
    channel::mkdir(ch, path, parents, /*owner=*/"", d);
  });
}

void Engine::remove_file(const std::string& id, const std::string& path, bool recursive) {
  const nlohmann::json audit{{"op", "remove"}, {"path", path}, {"recursive", recursive}};
  impl_->guest_op(id, path, &audit, [&](channel::GuestChannel& ch, channel::Deadline d) {
    channel::remove(ch, path, recursive, d);
  });
}

nlohmann::json Engine::guest_info(const std::string& id) {
  // The guest's facts go to the API as the guest sent them (GuestInfo in
  // api/openapi.yaml takes any properties): the engine reads none of them.
  nlohmann::json info;
  impl_->guest_op(id, {}, nullptr, [&](channel::GuestChannel& ch, channel::Deadline d) {
    info = channel::info(ch, d);
  });
  return info;
}

}  // namespace airlock::engine

// exec and file operations on a running sandbox. Each call is driven on the
// caller's thread over the sandbox's GuestChannel and audited.
#include <spdlog/spdlog.h>

#include <chrono>
#include <csignal>

#include "common/error.h"
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
channel::Deadline transfer_deadline(const Live& sb) {
  int64_t left_ms = std::max<int64_t>(sb.expires_steady_ms.load() - steady_ms(), 1000);
  return Clock::now() + std::chrono::milliseconds(std::min<int64_t>(left_ms, 3600 * 1000));
}

// A pause ends foreground execs (engine_pause.cc, kill_foreground_execs):
// their callers get this, whether the kill's exit status or the channel's
// close reached the call first.
[[noreturn]] void throw_paused_during_call(Live& sb) {
  throw Error(Errc::conflict, "sandbox " + sb.rec.info.id +
                                  " was paused during the call: a pause ends foreground execs "
                                  "(this one was killed); background execs survive it");
}

// A guest failure on a sandbox that was stopped meanwhile is reported as
// what it is: the action no longer fits the sandbox's state. If the guest
// went away under the call (QEMU died, agent lost), the reaper notices
// within about a second and classifies it; the call waits for that (5 s at
// most) so its error names the cause (vmm_died, guest_panic, ...).
[[noreturn]] void rethrow_for(Live& sb, const Error& e) {
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

template <typename T>
std::optional<T> int_field(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) return std::nullopt;
  return it->get<T>();
}

uint64_t count_field(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number_unsigned() ? it->get<uint64_t>() : 0;
}

// The typed outcomes an exec can have (engine.h ExecResult::reason).
constexpr const char* kReasons[] = {"exited",     "signaled",   "timeout",   "killed",
                                    "pids_limit", "oom_killed", "cpu_limit", "no_space"};

// The guest's reason, if it is one of ours; otherwise derived from the
// exit fields (the guest is untrusted, and an older agent sends none).
std::string reason_of(const nlohmann::json& r, const ExecResult& res) {
  auto it = r.find("reason");
  if (it != r.end() && it->is_string())
    for (const char* k : kReasons)
      if (*it == k) return k;
  if (res.timed_out) return "timeout";
  return res.signal ? "signaled" : "exited";
}

// Exit fields of a guest exec/job response into `res`.
void read_outcome(const nlohmann::json& r, ExecResult& res) {
  res.exit_code = int_field<int>(r, "exit_code");
  res.signal = int_field<int>(r, "signal");
  res.timed_out = r.value("timed_out", nlohmann::json(false)) == true;
  res.reason = reason_of(r, res);
  if (auto d = int_field<int64_t>(r, "duration_ms")) res.duration_ms = std::max<int64_t>(*d, 0);
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

void read_exec_outcome(const nlohmann::json& r, ExecResult& res) {
  read_outcome(r, res);
  res.stdout_dropped = count_field(r, "stdout_dropped");
  res.stderr_dropped = count_field(r, "stderr_dropped");
  res.truncated = res.stdout_dropped > 0 || res.stderr_dropped > 0;
}

[[noreturn]] void rethrow_exec_error(Live& sb, const Error& e) { rethrow_for(sb, e); }

namespace {

// The guest exec request for `request` (argv, env, cwd, user, timeout, limits).
// An exec giving neither argv nor cmd (and no pty) runs the image's
// Entrypoint + Cmd, as `docker run IMAGE` does; `copy` holds the result.
const ExecRequest& with_image_command(const Live& sb, const ExecRequest& r, ExecRequest& copy) {
  if (r.pty || !r.argv.empty() || !r.cmd.empty() || sb.image_argv.empty()) return r;
  copy = r;
  copy.argv = sb.image_argv;
  return copy;
}

nlohmann::json guest_exec_request(const Live& sb, const ExecRequest& request) {
  std::vector<std::string> argv =
      request.cmd.empty() ? request.argv : std::vector<std::string>{"/bin/sh", "-c", request.cmd};
  // The image's env, then the sandbox's, then the request's own entries win.
  std::map<std::string, std::string> env = sb.image_env;
  for (const auto& [k, v] : sb.rec.info.spec.env) env[k] = v;
  for (const auto& [k, v] : request.env) env[k] = v;
  nlohmann::json req{{"env", env}};
  // A pty exec without a command gets the user's login shell, in the
  // user's home (the guest's defaults).
  if (!argv.empty()) req["argv"] = argv;
  std::string cwd = request.cwd.empty() ? sb.image_workdir : request.cwd;
  if (!cwd.empty() || !request.pty) req["cwd"] = cwd.empty() ? "/" : cwd;
  if (request.pty) req["pty"] = {{"cols", request.pty->cols}, {"rows", request.pty->rows}};
  std::string user = request.user.empty() ? sb.image_user : request.user;
  if (!user.empty()) req["user"] = user;
  if (request.timeout_s > 0) req["timeout_ms"] = static_cast<int64_t>(request.timeout_s * 1000);
  nlohmann::json limits = nlohmann::json::object();
  if (request.limits.pids) limits["pids"] = request.limits.pids;
  if (request.limits.memory_mb) limits["memory_mb"] = request.limits.memory_mb;
  if (request.limits.cpu_seconds > 0) limits["cpu_seconds"] = request.limits.cpu_seconds;
  if (!limits.empty()) req["limits"] = limits;
  req["output_limit_bytes"] = request.output_limit_bytes;
  return req;
}

// A background exec from the guest's (untrusted) job JSON.
ExecStatus status_from_guest(const nlohmann::json& j) {
  ExecStatus s;
  auto id = j.find("exec_id");
  if (id == j.end() || !id->is_string() || id->get<std::string>().empty() ||
      id->get<std::string>().size() > 64)
    throw Error(Errc::guest_error, "guest job has no valid exec_id");
  s.exec_id = *id;
  auto argv = j.find("argv");
  if (argv != j.end() && argv->is_array() && argv->size() <= 4096)
    for (const auto& a : *argv)
      if (a.is_string()) s.argv.push_back(a);
  s.pid = int_field<int>(j, "pid").value_or(0);
  s.started_at_ms = int_field<int64_t>(j, "started_at_ms").value_or(0);
  s.running = j.value("running", nlohmann::json(false)) == true;
  s.result.exec_id = s.exec_id;
  if (!s.running) read_outcome(j, s.result);
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
  auto sb = impl.running(id);
  ActivityGuard active(*sb);
  ExecRequest with_image;
  const ExecRequest& request = with_image_command(*sb, given, with_image);
  validate_exec(request);
  validate_exec_extras(request);
  if (request.background)
    throw Error(Errc::invalid_argument, "a background exec is started with exec_background()",
                "background");
  trace.mark("lookup");

  nlohmann::json req = guest_exec_request(*sb, request);
  const std::vector<std::string> argv = req.contains("argv")
                                            ? req["argv"].get<std::vector<std::string>>()
                                            : std::vector<std::string>{};
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
  req["exec_id"] = result.exec_id;
  req["output_buffer_bytes"] = impl.cfg.exec_buffer_bytes;
  uint32_t stream = sb->channel->open_stream();
  {
    std::lock_guard lock(sb->mu);
    sb->execs[result.exec_id] = stream;
  }
  std::shared_ptr<StdinPipe> pipe;
  if (request.stdin_stream) {
    req["stdin"] = true;  // open, fed by write_stdin() (GuestChannel::exec)
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
                       {"argv", argv},
                       {"cwd", req.value("cwd", nlohmann::json("~"))},
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
  nlohmann::json r;
  try {
    r = sb->channel->exec(stream, req, stdin_source, handlers, deadline);
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
  // The guest's response is untrusted: take only well-typed fields. The
  // byte counts are what the host delivered plus what the guest says it
  // dropped beyond the cap.
  int64_t host_ms = result.duration_ms;
  read_outcome(r, result);
  result.duration_ms = host_ms;
  result.stdout_dropped = count_field(r, "stdout_dropped");
  result.stderr_dropped = count_field(r, "stderr_dropped");
  result.stdout_bytes += result.stdout_dropped;
  result.stderr_bytes += result.stderr_dropped;
  result.truncated = result.stdout_dropped > 0 || result.stderr_dropped > 0;
  // The host's own deadline (the guest did not report in time) is a timeout too.
  if (result.timed_out && (result.reason == "killed" || result.reason == "signaled"))
    result.reason = "timeout";
  trace.mark("guest");
  // The guest's own account (integers or nothing: it is untrusted and only
  // logged): request to reply inside the agent, and the process's life.
  trace.note("agent_us", static_cast<int64_t>(count_field(r, "agent_us")));
  trace.note("run_us", static_cast<int64_t>(count_field(r, "run_us")));
  if (Trace::enabled()) {
    // ... and its phases (api/guest-protocol.md §5, spawn_us), the same way.
    auto s = r.find("spawn_us");
    nlohmann::json none = nlohmann::json::object();
    const nlohmann::json& phases = s != r.end() && s->is_object() ? *s : none;
    for (const char* k : {"prepare", "clone", "setup", "exec", "run", "finish"})
      trace.note((std::string("agent_") + k).c_str(), static_cast<int64_t>(count_field(phases, k)));
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
  auto sb = impl_->running(id);
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
  nlohmann::json r;
  try {
    r = sb->channel->call({{"op", "kill_job"}, {"exec_id", exec_id}, {"signal", signal}},
                          Clock::now() + kJsonOpTimeout);
  } catch (const Error& e) {
    if (e.code() == Errc::not_found)
      throw Error(Errc::not_found, "no exec " + exec_id + " in sandbox " + id, "exec_id");
    rethrow_for(*sb, e);
  }
  impl_->journal.append(id, "exec_kill", {{"exec_id", exec_id}, {"signal", signal}});
  // Nobody attached: collect its end here, so the journal records it as an
  // attach would (an attached client receives the end itself).
  if (r.is_object() && r.value("background", true) == false && r.value("attached", true) == false)
    collect_detached_end(*this, id, exec_id, r.value("end", uint64_t{0}));
}

ExecStatus Engine::exec_background_counted(const std::string& id, const ExecRequest& given) {
  auto& impl = *impl_;
  auto sb = impl.running(id);
  ActivityGuard active(*sb);
  ExecRequest with_image;
  const ExecRequest& request = with_image_command(*sb, given, with_image);
  validate_exec(request);
  validate_exec_extras(request);
  if (request.stdin_data)
    throw Error(Errc::invalid_argument, "a background exec takes no stdin", "stdin");
  nlohmann::json req = guest_exec_request(*sb, request);
  req["op"] = "exec";
  if (request.stdin_stream) req["stdin"] = true;  // a pipe fed by write_stdin() (job_stdin)
  req["background"] = true;
  const std::string exec_id = random_id("ex-");
  req["exec_id"] = exec_id;
  nlohmann::json audit{{"exec_id", exec_id},
                       {"argv", req["argv"]},
                       {"cwd", req["cwd"]},
                       {"user", request.user.empty() ? "root" : request.user},
                       {"env_keys", env_keys(request)},
                       {"background", true}};
  nlohmann::json r;
  try {
    r = sb->channel->call(req, Clock::now() + kJsonOpTimeout);
  } catch (const Error& e) {
    audit["error"] = e.what();
    impl.journal.append(id, "exec", audit);
    rethrow_for(*sb, e);
  }
  ExecStatus s = status_from_guest(r);
  if (s.exec_id != exec_id)
    throw Error(Errc::guest_error,
                "guest started background exec " + s.exec_id + ", asked for " + exec_id);
  audit["pid"] = s.pid;
  impl.journal.append(id, "exec", audit);
  return s;
}

std::vector<ExecStatus> Engine::list_execs(const std::string& id) {
  nlohmann::json r = impl_->json_op(id, {{"op", "jobs"}}, false);
  auto jobs = r.find("jobs");
  if (jobs == r.end() || !jobs->is_array())
    throw Error(Errc::guest_error, "guest jobs response has no jobs array");
  std::vector<ExecStatus> out;
  for (const auto& j : *jobs)
    if (j.is_object() && out.size() < 1024) out.push_back(status_from_guest(j));
  return out;
}

ExecStatus Engine::wait_exec(const std::string& id, const std::string& exec_id, double timeout_s) {
  if (!(timeout_s >= 0) || timeout_s > 3600)
    throw Error(Errc::invalid_argument, "wait must be between 0 and 3600 seconds", "wait");
  auto sb = impl_->running(id);
  ActivityGuard active(*sb);
  auto ms = static_cast<int64_t>(timeout_s * 1000);
  nlohmann::json r;
  try {
    r = sb->channel->call({{"op", "wait_job"}, {"exec_id", exec_id}, {"timeout_ms", ms}},
                          Clock::now() + std::chrono::milliseconds(ms) + kJsonOpTimeout);
  } catch (const Error& e) {
    if (e.code() == Errc::not_found)
      throw Error(Errc::not_found, "no background exec " + exec_id + " in sandbox " + id,
                  "exec_id");
    rethrow_for(*sb, e);
  }
  return status_from_guest(r);
}

uint64_t Engine::write_file(const std::string& id, const std::string& path, uint32_t mode,
                            const ChunkSource& source) {
  return write_file_as(id, path, mode, source, {});
}

uint64_t Engine::write_file_as(const std::string& id, const std::string& path, uint32_t mode,
                               const ChunkSource& source, const std::string& owner) {
  auto sb = impl_->running(id);
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
  auto sb = impl_->running(id);
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

nlohmann::json Engine::Impl::json_op(const std::string& id, nlohmann::json req, bool audited) {
  auto& impl = *this;
  auto sb = impl.running(id);
  ActivityGuard active(*sb);
  std::string op = req["op"];
  if (req.contains("path")) validate_guest_path(req["path"]);
  nlohmann::json r;
  try {
    r = sb->channel->call(req, Clock::now() + kJsonOpTimeout);
  } catch (const Error& e) {
    if (audited) {
      req["error"] = e.what();
      impl.journal.append(id, "file", req);
    }
    rethrow_for(*sb, e);
  }
  if (audited) impl.journal.append(id, "file", req);
  return r;
}

nlohmann::json Engine::list_files(const std::string& id, const std::string& path) {
  return list_files(id, path, 1);
}

void Engine::make_dir(const std::string& id, const std::string& path, bool parents) {
  impl_->json_op(id, {{"op", "mkdir"}, {"path", path}, {"parents", parents}}, true);
}

void Engine::remove_file(const std::string& id, const std::string& path, bool recursive) {
  impl_->json_op(id, {{"op", "remove"}, {"path", path}, {"recursive", recursive}}, true);
}

nlohmann::json Engine::guest_info(const std::string& id) {
  return impl_->json_op(id, {{"op", "info"}}, false);
}

}  // namespace airlock::engine

// exec and file operations on a running sandbox. Each call is driven on the
// caller's thread over the sandbox's GuestChannel and audited.
#include <spdlog/spdlog.h>

#include <chrono>

#include "common/error.h"
#include "engine/engine.h"
#include "engine/engine_impl.h"
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
  int64_t left_ms = std::max<int64_t>(sb.rec.info.expires_at_ms - now_ms(), 1000);
  return Clock::now() + std::chrono::milliseconds(std::min<int64_t>(left_ms, 3600 * 1000));
}

// A guest failure on a sandbox that was stopped meanwhile is reported as
// what it is: the action no longer fits the sandbox's state.
[[noreturn]] void rethrow_for(Live& sb, const Error& e) {
  State st;
  {
    std::lock_guard lock(sb.mu);
    st = sb.state;
  }
  if (e.code() == Errc::guest_error && st != State::running)
    throw Error(Errc::conflict, "sandbox " + sb.rec.info.id + " was stopped (" + to_string(st) +
                                    ") during the call");
  throw e;
}

template <typename T>
std::optional<T> int_field(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) return std::nullopt;
  return it->get<T>();
}

}  // namespace

ExecResult Engine::exec(const std::string& id, const ExecRequest& request,
                        const ExecCallbacks& callbacks) {
  auto& impl = *impl_;
  auto sb = impl.running(id);
  validate_exec(request);

  std::vector<std::string> argv =
      request.cmd.empty() ? request.argv : std::vector<std::string>{"/bin/sh", "-c", request.cmd};
  // The sandbox's env is the default; the request's own entries win.
  std::map<std::string, std::string> env = sb->rec.info.spec.env;
  for (const auto& [k, v] : request.env) env[k] = v;
  nlohmann::json req{
      {"argv", argv}, {"env", env}, {"cwd", request.cwd.empty() ? "/" : request.cwd}};
  if (!request.user.empty()) req["user"] = request.user;
  std::optional<channel::Deadline> deadline;
  if (request.timeout_s > 0) {
    req["timeout_ms"] = static_cast<int64_t>(request.timeout_s * 1000);
    deadline = Clock::now() +
               std::chrono::milliseconds(static_cast<int64_t>(request.timeout_s * 1000)) +
               kExecGrace;
  }

  ExecResult result;
  result.exec_id = random_id("ex-");
  uint32_t stream = sb->channel->open_stream();
  {
    std::lock_guard lock(sb->mu);
    sb->execs[result.exec_id] = stream;
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
  handlers.on_output = [&](int ch, std::string_view bytes) {
    (ch == 1 ? result.stdout_bytes : result.stderr_bytes) += bytes.size();
    return callbacks.on_output ? callbacks.on_output(ch, bytes) : true;
  };

  nlohmann::json audit{{"exec_id", result.exec_id},
                       {"argv", argv},
                       {"cwd", req["cwd"]},
                       {"user", request.user.empty() ? "root" : request.user}};
  auto t0 = std::chrono::steady_clock::now();
  auto finish = [&] {
    std::lock_guard lock(sb->mu);
    sb->execs.erase(result.exec_id);
  };
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
  // The guest's response is untrusted: take only well-typed fields.
  result.exit_code = int_field<int>(r, "exit_code");
  result.signal = int_field<int>(r, "signal");
  result.timed_out = r.value("timed_out", nlohmann::json(false)) == true;
  audit.update(to_json(result));
  impl.journal.append(id, "exec", audit);
  return result;
}

void Engine::kill_exec(const std::string& id, const std::string& exec_id, int signal) {
  auto sb = impl_->running(id);
  if (signal < 1 || signal > 64)
    throw Error(Errc::invalid_argument, "signal must be between 1 and 64", "signal");
  uint32_t stream;
  {
    std::lock_guard lock(sb->mu);
    auto it = sb->execs.find(exec_id);
    if (it == sb->execs.end())
      throw Error(Errc::not_found, "no running exec " + exec_id + " in sandbox " + id, "exec_id");
    stream = it->second;
  }
  sb->channel->signal(stream, signal);
}

uint64_t Engine::write_file(const std::string& id, const std::string& path, uint32_t mode,
                            const ChunkSource& source) {
  auto sb = impl_->running(id);
  validate_guest_path(path);
  if (mode > 07777) throw Error(Errc::invalid_argument, "mode must be at most 07777", "mode");
  uint64_t n;
  try {
    n = sb->channel->write_file(path, mode, /*parents=*/true, source, transfer_deadline(*sb));
  } catch (const Error& e) {
    impl_->journal.append(id, "file", {{"op", "write"}, {"path", path}, {"error", e.what()}});
    rethrow_for(*sb, e);
  }
  impl_->journal.append(id, "file", {{"op", "write"}, {"path", path}, {"bytes", n}});
  return n;
}

uint64_t Engine::read_file(const std::string& id, const std::string& path, const ChunkSink& sink) {
  auto sb = impl_->running(id);
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
  auto r = impl_->json_op(id, {{"op", "list"}, {"path", path}}, false);
  if (!r.contains("entries") || !r["entries"].is_array())
    throw Error(Errc::guest_error, "guest list response has no entries array");
  return {{"entries", r["entries"]}};
}

nlohmann::json Engine::stat_file(const std::string& id, const std::string& path) {
  return impl_->json_op(id, {{"op", "stat"}, {"path", path}}, false);
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

#include "engine/channel/guest_client.h"

#include <algorithm>
#include <climits>

#include "common/error.h"
#include "engine/channel/file_entry.h"

namespace airlock::channel {
namespace {

using nlohmann::json;

constexpr size_t kMaxExecId = 64, kMaxArgv = 4096, kMaxPath = 4096;

[[noreturn]] void bad(const char* op, const std::string& field, const std::string& why) {
  throw GuestReplyError(std::string("guest ") + op + " reply: " + field + " " + why);
}

// The optional-field readers: missing, ill-typed or out of range is absent.
const json* field(const json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

std::optional<int64_t> integer(const json& j, const char* key, int64_t lo, int64_t hi) {
  const json* v = field(j, key);
  if (!v || !v->is_number_integer()) return std::nullopt;
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    return std::nullopt;
  int64_t n = v->get<int64_t>();
  if (n < lo || n > hi) return std::nullopt;
  return n;
}

uint64_t count(const json& j, const char* key) {
  const json* v = field(j, key);
  return v && v->is_number_unsigned() ? v->get<uint64_t>() : 0;
}

// The JSON value true (anything else, of any type, is not).
bool is_true(const json& j, const char* key) {
  const json* v = field(j, key);
  return v && *v == true;
}

// The JSON value false (absent or any other value is not).
bool is_false(const json& j, const char* key) {
  const json* v = field(j, key);
  return v && *v == false;
}

std::optional<std::string> text(const json& j, const char* key, size_t max) {
  const json* v = field(j, key);
  if (!v || !v->is_string() || v->get_ref<const std::string&>().size() > max) return std::nullopt;
  return v->get<std::string>();
}

json call(GuestChannel& ch, const char* op, json request, Deadline deadline) {
  request["op"] = op;
  return ch.call(request, deadline);
}

}  // namespace

// ---- exec ------------------------------------------------------------------

json exec_request(const ExecParams& p) {
  json req = json::object();
  if (!p.argv.empty()) req["argv"] = p.argv;
  if (!p.env.empty()) req["env"] = p.env;
  if (p.cwd) req["cwd"] = *p.cwd;
  if (p.pty) req["pty"] = {{"cols", p.pty->cols}, {"rows", p.pty->rows}};
  if (!p.user.empty()) req["user"] = p.user;
  if (p.timeout_ms > 0) req["timeout_ms"] = p.timeout_ms;
  json limits = json::object();
  if (p.limit_pids) limits["pids"] = p.limit_pids;
  if (p.limit_memory_mb) limits["memory_mb"] = p.limit_memory_mb;
  if (p.limit_cpu_seconds > 0) limits["cpu_seconds"] = p.limit_cpu_seconds;
  if (!limits.empty()) req["limits"] = limits;
  if (p.output_limit_bytes) req["output_limit_bytes"] = *p.output_limit_bytes;
  if (!p.exec_id.empty()) req["exec_id"] = p.exec_id;
  if (p.output_buffer_bytes) req["output_buffer_bytes"] = *p.output_buffer_bytes;
  if (p.stdin_stream) req["stdin"] = true;
  return req;
}

ExecOutcome decode_outcome(const json& r) {
  ExecOutcome o;
  if (auto c = integer(r, "exit_code", INT_MIN, INT_MAX)) o.exit_code = static_cast<int>(*c);
  if (auto s = integer(r, "signal", INT_MIN, INT_MAX)) o.signal = static_cast<int>(*s);
  o.timed_out = is_true(r, "timed_out");
  // The guest's reason, if it is one of ours; otherwise derived from the
  // exit fields (the guest is untrusted, and an older agent sends none).
  o.reason = o.timed_out ? "timeout" : o.signal ? "signaled" : "exited";
  if (const json* why = field(r, "reason"); why && why->is_string())
    for (const char* k : kExecReasons)
      if (*why == k) o.reason = k;
  if (auto d = integer(r, "duration_ms", INT64_MIN, INT64_MAX))
    o.duration_ms = std::max<int64_t>(*d, 0);
  o.stdout_bytes = count(r, "stdout_bytes");
  o.stderr_bytes = count(r, "stderr_bytes");
  o.stdin_bytes = count(r, "stdin_bytes");
  o.stdout_dropped = count(r, "stdout_dropped");
  o.stderr_dropped = count(r, "stderr_dropped");
  o.output_end = count(r, "output_end");
  o.output_lost = count(r, "output_lost");
  o.agent_us = count(r, "agent_us");
  o.run_us = count(r, "run_us");
  const json* s = field(r, "spawn_us");
  for (const char* k : kSpawnPhases) o.spawn_us[k] = s && s->is_object() ? count(*s, k) : 0;
  return o;
}

ExecOutcome run_exec(GuestChannel& ch, uint32_t stream, const ExecParams& params,
                     const ChunkSource& stdin_source, const ExecHandlers& handlers,
                     std::optional<Deadline> deadline) {
  return decode_outcome(ch.exec(stream, exec_request(params), stdin_source, handlers, deadline));
}

Job decode_job(const json& j) {
  Job s;
  auto id = text(j, "exec_id", kMaxExecId);
  if (!id || id->empty()) throw GuestReplyError("guest job has no valid exec_id");
  s.exec_id = *id;
  if (const json* argv = field(j, "argv"); argv && argv->is_array() && argv->size() <= kMaxArgv)
    for (const auto& a : *argv)
      if (a.is_string()) s.argv.push_back(a);
  s.pid = static_cast<int>(integer(j, "pid", INT_MIN, INT_MAX).value_or(0));
  s.started_at_ms = integer(j, "started_at_ms", INT64_MIN, INT64_MAX).value_or(0);
  s.running = is_true(j, "running");
  if (!s.running) s.outcome = decode_outcome(j);
  return s;
}

Job start_background(GuestChannel& ch, const ExecParams& params, Deadline deadline) {
  json req = exec_request(params);
  req["background"] = true;
  Job job = decode_job(call(ch, "exec", std::move(req), deadline));
  if (!params.exec_id.empty() && job.exec_id != params.exec_id)
    throw GuestReplyError("guest started background exec " + job.exec_id + ", asked for " +
                          params.exec_id);
  return job;
}

std::vector<Job> jobs(GuestChannel& ch, Deadline deadline) {
  json r = call(ch, "jobs", json::object(), deadline);
  const json* list = field(r, "jobs");
  if (!list || !list->is_array()) throw GuestReplyError("guest jobs response has no jobs array");
  std::vector<Job> out;
  for (const auto& j : *list)
    if (j.is_object() && out.size() < kMaxJobs) out.push_back(decode_job(j));
  return out;
}

Job wait_job(GuestChannel& ch, const std::string& exec_id, int64_t timeout_ms, Deadline deadline) {
  return decode_job(
      call(ch, "wait_job", {{"exec_id", exec_id}, {"timeout_ms", timeout_ms}}, deadline));
}

KillReply kill_job(GuestChannel& ch, const std::string& exec_id, int signal, Deadline deadline) {
  json r = call(ch, "kill_job", {{"exec_id", exec_id}, {"signal", signal}}, deadline);
  KillReply k;
  // A foreground exec that is detached and has nobody attached: its end
  // is collected by the host (an attached client receives it itself).
  k.collect = is_false(r, "background") && is_false(r, "attached");
  if (k.collect) {
    const json* end = field(r, "end");
    if (end && !end->is_number_unsigned()) bad("kill_job", "end", "is not a byte offset");
    k.end = count(r, "end");
  }
  return k;
}

JobStdinReply job_stdin(GuestChannel& ch, const std::string& exec_id, const ChunkSource& source,
                        bool close, Deadline deadline) {
  json r = ch.job_stdin(exec_id, source, close, deadline);
  JobStdinReply w;
  w.bytes = count(r, "stdin_bytes");
  w.total = count(r, "stdin_total");
  const json* closed = field(r, "stdin_closed");
  w.closed = closed && closed->is_boolean() && closed->get<bool>();
  return w;
}

// ---- attach ----------------------------------------------------------------

AttachReply attach(GuestChannel& ch, const std::string& exec_id, uint64_t offset,
                   const AttachClientHandlers& handlers, Deadline start_deadline) {
  AttachHandlers h;
  h.on_attached = [&](const json& ev) {
    Attached a;
    a.offset = field(ev, "offset") ? count(ev, "offset") : offset;
    a.dropped = count(ev, "dropped");
    a.end = field(ev, "end") ? std::max(count(ev, "end"), a.offset) : a.offset;
    a.event = ev;
    if (handlers.on_attached) handlers.on_attached(a);
  };
  h.on_output = handlers.on_output;
  h.cancelled = handlers.cancelled;
  h.on_stream = handlers.on_stream;
  json r = ch.attach(exec_id, offset, h, start_deadline);
  AttachReply out;
  out.detached = is_true(r, "detached");
  if (!out.detached) out.outcome = decode_outcome(r);
  return out;
}

// ---- files -----------------------------------------------------------------

ListReply list(GuestChannel& ch, const std::string& path, int depth, uint64_t offset,
               Deadline deadline) {
  json r = call(ch, "list", {{"path", path}, {"depth", depth}, {"offset", offset}}, deadline);
  const json* entries = field(r, "entries");
  if (!entries || !entries->is_array())
    throw GuestReplyError("guest list response has no entries array");
  ListReply out;
  for (const json& e : *entries) out.entries.push_back(file_entry_from_guest(e));
  out.truncated = is_true(r, "truncated");
  return out;
}

json stat(GuestChannel& ch, const std::string& path, Deadline deadline) {
  return file_entry_from_guest(call(ch, "stat", {{"path", path}}, deadline));
}

json move(GuestChannel& ch, const std::string& path, const std::string& dest, bool parents,
          const std::string& owner, Deadline deadline) {
  json req = {{"path", path}, {"dest", dest}, {"parents", parents}};
  if (!owner.empty()) req["owner"] = owner;
  return file_entry_from_guest(call(ch, "move", std::move(req), deadline));
}

void mkdir(GuestChannel& ch, const std::string& path, bool parents, const std::string& owner,
           Deadline deadline) {
  json req = {{"path", path}, {"parents", parents}};
  if (!owner.empty()) req["owner"] = owner;
  call(ch, "mkdir", std::move(req), deadline);
}

void remove(GuestChannel& ch, const std::string& path, bool recursive, Deadline deadline) {
  call(ch, "remove", {{"path", path}, {"recursive", recursive}}, deadline);
}

std::string user_home(GuestChannel& ch, const std::string& user, Deadline deadline) {
  json req = json::object();
  if (!user.empty()) req["user"] = user;
  json r = call(ch, "user", std::move(req), deadline);
  // Guest-written: only an absolute, bounded path is taken.
  auto home = text(r, "home", kMaxPath);
  if (!home || home->empty() || (*home)[0] != '/' || home->find('\0') != std::string::npos)
    throw GuestReplyError("the guest named no usable home directory for " +
                          (user.empty() ? std::string("root") : user));
  return *home;
}

// ---- watch -----------------------------------------------------------------

WatchReply watch(GuestChannel& ch, const std::string& path, bool recursive,
                 const WatchHandlers& handlers, Deadline start_deadline) {
  // The channel rebuilt the response from its checked fields.
  json r = ch.watch(path, recursive, handlers, start_deadline);
  WatchReply w;
  w.reason = text(r, "reason", 64).value_or("ended");
  w.message = text(r, "message", 4096).value_or("");
  w.events = count(r, "events");
  w.dropped = count(r, "dropped");
  return w;
}

// ---- the machine -----------------------------------------------------------

json info(GuestChannel& ch, Deadline deadline) {
  return call(ch, "info", json::object(), deadline);
}

void sync(GuestChannel& ch, Deadline deadline) { call(ch, "sync", json::object(), deadline); }

void ping(GuestChannel& ch, Deadline deadline) { call(ch, "ping", json::object(), deadline); }

json hello_network_json(const HelloNetwork& n) {
  return {{"address", n.address},   {"gateway", n.gateway},   {"dns", n.dns},
          {"address6", n.address6}, {"gateway6", n.gateway6}, {"mac", n.mac}};
}

}  // namespace airlock::channel

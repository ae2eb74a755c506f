#include "e2b/process.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

namespace airlock::e2b {
namespace {

using connect::Code;
using connect::RpcError;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

// Events a process produces, queued for each attached stream.
struct Event {
  enum Kind { start, data, end, fail } kind = data;
  explicit Event(Kind k, int ch = 1, std::string b = {})
      : kind(k), channel(ch), bytes(std::move(b)) {}
  int channel = 1;  // data: 1 stdout (or the terminal), 2 stderr
  std::string bytes;
  json end_event;                 // end: envd's EndEvent
  std::optional<RpcError> error;  // fail: the call's error (never started, timed out)
};

// One attached stream (Start's own, or a Connect).
struct Sub {
  std::deque<Event> queue;
  bool gone = false;  // its client left: skip it
};

// Bounds what a stream that does not read can hold: data chunks are at most
// the guest channel's chunk size (64 KiB), so <= 4 MiB per stream.
constexpr size_t kQueueCap = 64;
// Processes one sandbox may run at once through envd.
constexpr int kMaxProcesses = 64;

struct Proc {
  std::string sandbox;
  json config;  // ProcessConfig as the caller gave it (List returns it)
  std::optional<std::string> tag;
  bool pty = false;
  bool stdin_open = false;
  // Guarded by Table::mu.
  std::string exec_id;
  uint32_t pid = 0;
  bool ended = false;
  std::vector<std::shared_ptr<Sub>> subs;
};

struct Table {
  std::mutex mu;
  std::condition_variable cv;  // anything changed: queued, drained, ended
  // Started, not ended processes per sandbox, by pid.
  std::map<std::string, std::map<uint32_t, std::shared_ptr<Proc>>> running;
  std::map<std::string, int> count;  // per sandbox, starting ones included
  int threads = 0;
  bool stopping = false;
  engine::SandboxService* engine = nullptr;  // the daemon's one engine, seen at the first Start

  // Queues `e` for every attached stream; waits (with `lock` held on mu)
  // while a stream's queue is full, so a slow reader slows the process
  // instead of growing memory. The last event of a process never waits.
  void deliver(std::unique_lock<std::mutex>& lock, Proc& p, const Event& e) {
    bool last = e.kind == Event::end || e.kind == Event::fail;
    for (auto& sub : p.subs) {
      if (!last)
        cv.wait(lock, [&] { return sub->gone || stopping || sub->queue.size() < kQueueCap; });
      if (!sub->gone) sub->queue.push_back(e);
    }
    cv.notify_all();
  }

  std::shared_ptr<Proc> find(const std::string& sandbox, const json& selector) {
    if (!selector.is_object())
      throw RpcError(Code::invalid_argument, "process selector (pid or tag) is missing");
    std::lock_guard lock(mu);
    auto& procs = running[sandbox];
    if (selector.contains("pid")) {
      uint32_t pid = connect::get_uint32(selector, "pid");
      auto it = procs.find(pid);
      if (it == procs.end())
        throw RpcError(Code::not_found, "process with pid " + std::to_string(pid) + " not found");
      return it->second;
    }
    if (selector.contains("tag") && selector["tag"].is_string()) {
      std::string tag = selector["tag"];
      for (auto& [pid, p] : procs)
        if (p->tag == tag) return p;
      throw RpcError(Code::not_found, "process with tag " + tag + " not found");
    }
    throw RpcError(Code::invalid_argument, "process selector needs a pid or a tag");
  }
};

json event_json(const Event& e, bool pty) {
  json ev;
  switch (e.kind) {
    case Event::start:
      ev["start"] = json::object();
      break;
    case Event::data:
      ev["data"] = {
          {pty ? "pty" : (e.channel == 2 ? "stderr" : "stdout"), connect::encode_bytes(e.bytes)}};
      break;
    case Event::end:
      ev["end"] = e.end_event;
      break;
    case Event::fail:
      break;
  }
  return {{"event", ev}};
}

// envd's EndEvent of an exec result: exitCode (-1 when a signal ended it),
// exited, status ("exit status N" / "signal: killed"), error.
json end_of(const engine::ExecResult& r) {
  json end;
  if (r.exit_code) {
    end = {{"exitCode", *r.exit_code},
           {"exited", true},
           {"status", "exit status " + std::to_string(*r.exit_code)}};
  } else {
    int sig = r.signal.value_or(9);
    std::string name = sig == 9 ? "killed" : sig == 15 ? "terminated" : std::to_string(sig);
    end = {{"exitCode", -1}, {"exited", false}, {"status", "signal: " + name}};
  }
  if (!r.reason.empty() && r.reason != "exited" && r.reason != "signaled" && r.reason != "killed")
    end["error"] = r.reason;
  return end;
}

// Streams `p`'s events to `out` until the process ends, the client leaves,
// `deadline` passes (Connect's timeout), or the daemon stops.
void pump(Table& t, const std::shared_ptr<Proc>& p, const std::shared_ptr<Sub>& sub,
          StreamWriter& out, int keepalive_s, std::optional<Clock::time_point> deadline) {
  auto detach = [&] {
    sub->gone = true;
    std::erase(p->subs, sub);
    t.cv.notify_all();
  };
  std::unique_lock lock(t.mu);
  auto next_keepalive = Clock::now() + std::chrono::seconds(keepalive_s);
  for (;;) {
    auto wake = deadline ? std::min(*deadline, next_keepalive) : next_keepalive;
    t.cv.wait_until(lock, wake, [&] { return !sub->queue.empty() || t.stopping; });
    if (sub->queue.empty()) {
      if (t.stopping) {
        detach();
        lock.unlock();
        RpcError e(Code::unavailable, "airlockd is stopping");
        out.finish(&e);
        return;
      }
      if (deadline && Clock::now() >= *deadline) {
        detach();
        lock.unlock();
        RpcError e(Code::deadline_exceeded, "the stream's timeout passed; the process still runs");
        out.finish(&e);
        return;
      }
      lock.unlock();
      bool ok = out.send({{"event", {{"keepalive", json::object()}}}});
      lock.lock();
      if (!ok) return detach();
      next_keepalive = Clock::now() + std::chrono::seconds(keepalive_s);
      continue;
    }
    Event e = std::move(sub->queue.front());
    sub->queue.pop_front();
    t.cv.notify_all();
    bool pty = p->pty;
    uint32_t pid = p->pid;
    lock.unlock();
    if (e.kind == Event::fail) {
      out.finish(&*e.error);
      return;
    }
    json msg = event_json(e, pty);
    if (e.kind == Event::start) msg["event"]["start"]["pid"] = pid;
    bool ok = out.send(msg);
    if (e.kind == Event::end) {
      out.finish();
      return;
    }
    lock.lock();
    if (!ok) return detach();
  }
}

// The engine exec of a started process, on its own thread: it outlives the
// stream that started it.
void run(Table& t, engine::SandboxService& engine, std::shared_ptr<Proc> p, engine::ExecRequest req) {
  engine::ExecCallbacks cb;
  cb.on_start = [&](const std::string& exec_id, int pid) {
    std::unique_lock lock(t.mu);
    p->exec_id = exec_id;
    p->pid = static_cast<uint32_t>(pid);
    t.running[p->sandbox][p->pid] = p;
    t.deliver(lock, *p, Event(Event::start));
  };
  cb.on_output = [&](int channel, std::string_view bytes) {
    std::unique_lock lock(t.mu);
    Event e(Event::data, channel, std::string(bytes));
    t.deliver(lock, *p, e);
    return !t.stopping;
  };
  Event last(Event::fail);
  try {
    engine::ExecResult r = engine.exec(p->sandbox, req, cb);
    if (r.reason == "timeout") {
      last.error =
          RpcError(Code::deadline_exceeded, "the command's timeout (" +
                                                std::to_string(int64_t(req.timeout_s * 1000)) +
                                                " ms) passed and it was killed");
    } else {
      last = Event(Event::end);
      last.end_event = end_of(r);
    }
  } catch (const Error& e) {
    last.error = connect::from_error(e);
  } catch (const std::exception& e) {
    last.error = RpcError(Code::internal, e.what());
  }
  std::unique_lock lock(t.mu);
  p->ended = true;
  if (auto it = t.running.find(p->sandbox); it != t.running.end()) {
    if (auto pit = it->second.find(p->pid); pit != it->second.end() && pit->second == p)
      it->second.erase(pit);
    if (it->second.empty()) t.running.erase(it);
  }
  t.deliver(lock, *p, last);
  if (--t.count[p->sandbox] <= 0) t.count.erase(p->sandbox);
  --t.threads;
  t.cv.notify_all();
}

std::map<std::string, std::string> string_map(const json& j, std::string_view field) {
  std::map<std::string, std::string> out;
  if (j.is_null()) return out;
  if (!j.is_object()) throw RpcError(Code::invalid_argument, std::string(field) + " must be a map");
  for (const auto& [k, v] : j.items()) {
    if (!v.is_string())
      throw RpcError(Code::invalid_argument, std::string(field) + "." + k + " must be a string");
    out[k] = v.get<std::string>();
  }
  return out;
}

void start(Table& t, Call& c, const json& req, StreamWriter& out) {
  const json& cfg = req.contains("process") ? req["process"] : json();
  if (!cfg.is_object() || !cfg.contains("cmd") || !cfg["cmd"].is_string() ||
      cfg["cmd"].get<std::string>().empty())
    throw RpcError(Code::invalid_argument, "process.cmd is required");
  auto p = std::make_shared<Proc>();
  p->sandbox = c.sandbox.id;
  engine::ExecRequest er;
  std::vector<std::string> argv = {cfg["cmd"].get<std::string>()};
  json args = json::array();
  if (cfg.contains("args") && !cfg["args"].is_null()) {
    if (!cfg["args"].is_array())
      throw RpcError(Code::invalid_argument, "process.args must be a list");
    for (const auto& a : cfg["args"]) {
      if (!a.is_string()) throw RpcError(Code::invalid_argument, "process.args must be strings");
      argv.push_back(a.get<std::string>());
      args.push_back(a);
    }
  }
  er.env = string_map(cfg.value("envs", json()), "process.envs");
  p->config = {{"cmd", argv[0]}, {"args", args}, {"envs", er.env}};
  if (cfg.contains("cwd") && cfg["cwd"].is_string() && !cfg["cwd"].get<std::string>().empty()) {
    er.cwd = cfg["cwd"];
    p->config["cwd"] = er.cwd;
  }
  if (req.contains("tag") && req["tag"].is_string()) p->tag = req["tag"].get<std::string>();
  if (req.contains("pty") && req["pty"].is_object()) {
    const json& size = req["pty"].value("size", json::object());
    engine::ExecRequest::Pty pty;
    pty.cols = static_cast<int>(connect::get_uint32(size, "cols", 80));
    pty.rows = static_cast<int>(connect::get_uint32(size, "rows", 24));
    er.pty = pty;
    p->pty = true;
  }
  // envd < 0.3 always opened stdin; the SDK sends stdin: false unless asked.
  bool want_stdin = !req.contains("stdin") || req["stdin"].is_null() || req["stdin"] == true;
  p->stdin_open = want_stdin && !p->pty;
  er.stdin_stream = p->stdin_open;
  er.user = c.user;
  if (c.timeout_ms && *c.timeout_ms > 0) er.timeout_s = double(*c.timeout_ms) / 1000.0;
  if (er.cwd.empty() && !p->pty) {
    // envd starts in the user's home; the engine's default is "/". The shell
    // execs the command, so the pid the caller sees is the command's.
    argv.insert(argv.begin(),
                {"/bin/sh", "-c", "cd \"$HOME\" 2>/dev/null || cd /; exec \"$@\"", "envd"});
  }
  er.argv = std::move(argv);

  auto sub = std::make_shared<Sub>();
  {
    std::lock_guard lock(t.mu);
    if (t.stopping) throw RpcError(Code::unavailable, "airlockd is stopping");
    if (t.count[p->sandbox] >= kMaxProcesses)
      throw RpcError(Code::resource_exhausted, "this sandbox already runs " +
                                                   std::to_string(kMaxProcesses) +
                                                   " processes started through envd");
    ++t.count[p->sandbox];
    ++t.threads;
    t.engine = &c.engine;
    p->subs.push_back(sub);
  }
  try {
    std::thread(run, std::ref(t), std::ref(c.engine), p, std::move(er)).detach();
  } catch (...) {
    std::lock_guard lock(t.mu);
    --t.count[p->sandbox];
    --t.threads;
    throw RpcError(Code::resource_exhausted, "cannot start a thread for the process");
  }
  pump(t, p, sub, out, c.keepalive_s, std::nullopt);
}

void attach(Table& t, Call& c, const json& req, StreamWriter& out) {
  auto p = t.find(c.sandbox.id, req.value("process", json()));
  auto sub = std::make_shared<Sub>();
  {
    std::lock_guard lock(t.mu);
    if (p->ended) throw RpcError(Code::not_found, "process has ended");
    sub->queue.push_back(Event(Event::start));
    p->subs.push_back(sub);
  }
  std::optional<Clock::time_point> deadline;
  if (c.timeout_ms && *c.timeout_ms > 0)
    deadline = Clock::now() + std::chrono::milliseconds(*c.timeout_ms);
  pump(t, p, sub, out, c.keepalive_s, deadline);
}

json list(Table& t, Call& c) {
  json procs = json::array();
  std::lock_guard lock(t.mu);
  if (auto it = t.running.find(c.sandbox.id); it != t.running.end())
    for (const auto& [pid, p] : it->second) {
      json info = {{"config", p->config}, {"pid", pid}};
      if (p->tag) info["tag"] = *p->tag;
      procs.push_back(std::move(info));
    }
  return {{"processes", procs}};
}

std::string exec_of(const std::shared_ptr<Proc>& p, Table& t) {
  std::lock_guard lock(t.mu);
  return p->exec_id;
}

void send_input(Table& t, Call& c, const json& req) {
  auto p = t.find(c.sandbox.id, req.value("process", json()));
  const json& input = req.value("input", json::object());
  std::string bytes;
  bool to_pty = false;
  if (input.contains("pty")) {
    bytes = connect::decode_bytes(input["pty"], "input.pty");
    to_pty = true;
  } else if (input.contains("stdin")) {
    bytes = connect::decode_bytes(input["stdin"], "input.stdin");
  } else {
    throw RpcError(Code::invalid_argument, "input needs stdin or pty bytes");
  }
  if (p->pty) {
    c.engine.pty_input(c.sandbox.id, exec_of(p, t), bytes);
    return;
  }
  if (to_pty) throw RpcError(Code::failed_precondition, "the process has no terminal (pty)");
  if (!p->stdin_open)
    throw RpcError(Code::failed_precondition,
                   "the process was started without stdin (start it with stdin: true)");
  bool sent = false;
  c.engine.write_stdin(
      c.sandbox.id, exec_of(p, t),
      [&]() -> std::optional<std::string> {
        if (sent) return std::nullopt;
        sent = true;
        return bytes;
      },
      false);
}

int signal_of(const json& s) {
  if (s == "SIGNAL_SIGKILL" || s == 9) return 9;
  if (s == "SIGNAL_SIGTERM" || s == 15) return 15;
  throw RpcError(Code::invalid_argument, "signal must be SIGNAL_SIGKILL or SIGNAL_SIGTERM");
}

}  // namespace

void register_process(Envd& envd) {
  auto t = std::make_shared<Table>();
  envd.stream("/process.Process/Start",
              [t](Call& c, const json& req, StreamWriter& out) { start(*t, c, req, out); });
  envd.stream("/process.Process/Connect",
              [t](Call& c, const json& req, StreamWriter& out) { attach(*t, c, req, out); });
  envd.unary("/process.Process/List", [t](Call& c, const json&) { return list(*t, c); });
  envd.unary("/process.Process/SendInput", [t](Call& c, const json& req) {
    send_input(*t, c, req);
    return json::object();
  });
  envd.unary("/process.Process/SendSignal", [t](Call& c, const json& req) {
    auto p = t->find(c.sandbox.id, req.value("process", json()));
    c.engine.kill_exec(c.sandbox.id, exec_of(p, *t), signal_of(req.value("signal", json())));
    return json::object();
  });
  envd.unary("/process.Process/CloseStdin", [t](Call& c, const json& req) {
    auto p = t->find(c.sandbox.id, req.value("process", json()));
    if (p->pty) throw RpcError(Code::failed_precondition, "a pty has no separate stdin to close");
    if (!p->stdin_open)
      throw RpcError(Code::failed_precondition, "the process was started without stdin");
    c.engine.write_stdin(
        c.sandbox.id, exec_of(p, *t), [] { return std::optional<std::string>(); }, true);
    return json::object();
  });
  envd.unary("/process.Process/Update", [t](Call& c, const json& req) {
    auto p = t->find(c.sandbox.id, req.value("process", json()));
    if (!req.contains("pty") || !req["pty"].is_object()) return json::object();
    if (!p->pty) throw RpcError(Code::failed_precondition, "the process has no terminal (pty)");
    const json& size = req["pty"].value("size", json::object());
    c.engine.pty_resize(c.sandbox.id, exec_of(p, *t),
                        static_cast<int>(connect::get_uint32(size, "cols", 80)),
                        static_cast<int>(connect::get_uint32(size, "rows", 24)));
    return json::object();
  });
  // The daemon stops: kill what runs, wait (bounded) for the exec threads,
  // which are inside the engine.
  envd.on_shutdown([t] {
    std::unique_lock lock(t->mu);
    t->stopping = true;
    t->cv.notify_all();
    std::vector<std::pair<std::string, std::string>> execs;
    for (const auto& [sandbox, procs] : t->running)
      for (const auto& [pid, p] : procs) execs.emplace_back(sandbox, p->exec_id);
    lock.unlock();
    for (const auto& [sandbox, exec_id] : execs) try {
        t->engine->kill_exec(sandbox, exec_id, 9);
      } catch (const Error&) {
        // ended meanwhile
      }
    lock.lock();
    t->cv.wait_for(lock, std::chrono::seconds(10), [&] { return t->threads == 0; });
    if (t->threads) spdlog::warn("envd: {} process(es) still inside the engine", t->threads);
  });
}

}  // namespace airlock::e2b

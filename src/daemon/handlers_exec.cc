// Execs: POST /v1/sandboxes/{id}/exec (NDJSON stream, or a background exec),
// GET .../exec, GET|DELETE .../exec/{exec_id}, POST .../exec/{exec_id}/stdin,
// GET .../pty (WebSocket, pty.h). Attaching to an exec that outlived its
// client is handlers_attach.cc.
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <thread>

#include "daemon/base64.h"
#include "daemon/handlers.h"
#include "daemon/pty.h"
#include "daemon/request.h"

namespace airlock::daemon {
namespace {

using nlohmann::json;

// Kills an exec whose client hung up even while the process is silent (a
// failed write catches it only when output arrives).
class HangupWatch {
 public:
  HangupWatch(engine::SandboxService& engine, std::string id, std::string exec_id, int fd)
      : wake_(::eventfd(0, EFD_CLOEXEC)),
        thread_([this, &engine, id = std::move(id), exec_id = std::move(exec_id), fd] {
          while (true) {
            // POLLHUP/POLLERR are always reported; wake_ ends the watch at
            // once when the exec finishes (no poll-period delay per exec).
            pollfd p[2] = {{fd, 0, 0}, {wake_, POLLIN, 0}};
            if (::poll(p, wake_ >= 0 ? 2 : 1, 200) < 0 && errno != EINTR) return;
            if (done_) return;
            if (p[0].revents & (POLLHUP | POLLERR)) {
              spdlog::info("client of exec {} in {} hung up; killing it", exec_id, id);
              try {
                engine.kill_exec(id, exec_id, 9);
              } catch (const std::exception& e) {
                spdlog::debug("kill after hangup: {}", e.what());
              }
              return;
            }
          }
        }) {}
  ~HangupWatch() {
    done_ = true;
    if (wake_ >= 0) {
      uint64_t one = 1;
      [[maybe_unused]] ssize_t n = ::write(wake_, &one, sizeof one);
    }
    thread_.join();
    if (wake_ >= 0) ::close(wake_);
  }

 private:
  std::atomic<bool> done_{false};
  int wake_;
  std::thread thread_;
};

// Refused (400, 404, 409) before or while reading a streamed stdin: take in
// what is left of a small body, so the client reads the answer instead of a
// reset connection (closing on unread bytes sends RST). A big rest is not
// waited for: the connection closes after the answer.
void drain_small_body(Exchange& ex) {
  try {
    size_t drained = 0;
    while (drained < (1u << 20)) {
      auto piece = ex.read_some(64 * 1024);
      if (!piece) break;
      drained += piece->size();
    }
  } catch (const Error&) {
    // A broken body: the refusal is still the answer.
  }
}

}  // namespace

namespace serve {

void exec(const RouteContext& c) {
  check_query_keys(c.query, {});
  Exchange& ex = c.ex;
  const std::string& id = c.id;
  engine::ExecRequest req = parse_exec(ex.read_body(kMaxJsonBody));
  if (req.background) {
    // Nothing to stream: the exec runs on in the guest (GET .../exec lists it).
    ex.send_json(201, engine::to_json(c.engine.exec_background(id, req)));
    return;
  }
  std::unique_ptr<HangupWatch> watch;
  auto line = [&](const json& j) { return ex.write_chunk(j.dump() + "\n"); };
  engine::ExecCallbacks cb;
  std::string started;  // exec id of the first start
  cb.on_start = [&](const std::string& exec_id, int pid) {
    // A forged or repeated `started` from the guest must not write a second
    // response head into the stream (nor start a second hangup watch).
    if (!started.empty()) {
      c.caller.counters.duplicate_exec_starts++;
      spdlog::warn("exec {} in {}: ignoring a repeated start (exec id {}, pid {})", started, id,
                   exec_id, pid);
      return;
    }
    started = exec_id.empty() ? "?" : exec_id;
    if (!ex.streaming()) ex.begin_stream("application/x-ndjson");
    line({{"type", "start"}, {"exec_id", exec_id}, {"pid", pid}});
    watch = std::make_unique<HangupWatch>(c.engine, id, exec_id, ex.native_handle());
  };
  cb.on_output = [&](int channel, std::string_view bytes) {
    if (!ex.streaming()) ex.begin_stream("application/x-ndjson");
    return line({{"type", channel == 2 ? "stderr" : "stdout"}, {"data", base64_encode(bytes)}});
  };
  try {
    engine::ExecResult result = c.engine.exec(id, req, cb);
    watch.reset();
    if (!ex.streaming()) ex.begin_stream("application/x-ndjson");
    json exit = engine::to_json(result);
    exit["type"] = "exit";
    line(exit);
    ex.end_stream();
  } catch (const Error& e) {
    watch.reset();
    if (!ex.streaming()) throw;
    end_stream_with_error(ex, error_body(to_string(e.code()), e.what(), e.field()));
  } catch (const std::exception& e) {
    watch.reset();
    if (!ex.streaming()) throw;
    end_stream_with_error(ex, error_body("internal", e.what()));
  }
}

void list_execs(const RouteContext& c) {
  check_query_keys(c.query, {});
  expect_no_body(c.ex);
  json arr = json::array();
  for (const auto& e : c.engine.list_execs(c.id)) arr.push_back(engine::to_json(e));
  c.ex.send_json(200, arr);
}

void get_exec(const RouteContext& c) {
  const Query& q = c.query;
  if (auto off = q.find("offset"); off != q.end()) {
    check_query_keys(q, {"offset"});
    expect_no_body(c.ex);
    handle_attach_exec(c.engine, c.ex, c.id, c.exec_id, off->second);
    return;
  }
  check_query_keys(q, {"wait"});
  double wait = 0;
  if (auto it = q.find("wait"); it != q.end()) {
    char* end = nullptr;
    wait = std::strtod(it->second.c_str(), &end);
    if (it->second.empty() || *end != '\0' || !(wait >= 0) || wait > 3600)
      throw Error(Errc::invalid_argument, "wait must be 0..3600 seconds", "wait");
  }
  expect_no_body(c.ex);
  c.ex.send_json(200, engine::to_json(c.engine.wait_exec(c.id, c.exec_id, wait)));
}

// POST .../exec/{exec_id}/stdin[?eof=true]: the raw body (any size, chunked
// or not) goes to the exec's stdin as it arrives. Each piece is what one
// socket read brought (a typed line is forwarded at once), at most 64 KiB,
// and the next is read only once the guest took the last: a process that
// does not read stalls the body, and TCP pushes back on the client.
void exec_stdin(const RouteContext& c) {
  Exchange& ex = c.ex;
  engine::StdinWrite w;
  try {
    check_query_keys(c.query, {"eof"});
    bool eof = query_bool(c.query, "eof", false);
    // A client that hangs up (or a daemon shutting down, which shuts its
    // sockets) ends a write blocked on a process that does not read.
    int fd = ex.native_handle();
    auto gone = [fd] {
      pollfd p{fd, 0, 0};
      return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLERR)) != 0;
    };
    w = c.engine.write_stdin(
        c.id, c.exec_id, [&] { return ex.read_some(64 * 1024); }, eof, gone);
  } catch (const Error&) {
    drain_small_body(ex);
    throw;
  }
  ex.send_json(200, {{"exec_id", c.exec_id},
                     {"stdin_bytes", w.bytes},
                     {"stdin_total", w.total},
                     {"stdin_closed", w.closed}});
}

void kill_exec(const RouteContext& c) {
  check_query_keys(c.query, {"signal"});
  int sig = query_signal(c.query, 9);
  expect_no_body(c.ex);
  c.engine.kill_exec(c.id, c.exec_id, sig);
  c.ex.send_empty(204);
}

void pty(const RouteContext& c) {
  check_query_keys(c.query, {});
  handle_pty(c.engine, c.ex, c.id);
}

}  // namespace serve
}  // namespace airlock::daemon

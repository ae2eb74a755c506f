#include "daemon/handlers.h"

#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <thread>

#include "auth/auth.h"
#include "common/metrics/metrics.h"
#include "daemon/base64.h"
#include "daemon/pty.h"
#include "daemon/request.h"
#include "daemon/router.h"
#include "daemon/tenancy.h"
#include "engine/api/limits.h"
#include "engine/net/policy.h"

namespace airlock::daemon {
namespace {

using nlohmann::json;

// Request bodies of routes that take none must be empty: a stray body is
// more likely a client bug than something to ignore.
void expect_no_body(Exchange& ex) {
  if (!ex.read_body(kMaxJsonBody).empty())
    throw Error(Errc::invalid_argument, "this request takes no body", "body");
}

// Kills an exec whose client hung up even while the process is silent (a
// failed write catches it only when output arrives).
class HangupWatch {
 public:
  HangupWatch(engine::Engine& engine, std::string id, std::string exec_id, int fd)
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

void handle_exec(engine::Engine& engine, Exchange& ex, const std::string& id,
                 ServerCounters& counters) {
  engine::ExecRequest req = parse_exec(ex.read_body(kMaxJsonBody));
  if (req.background) {
    // Nothing to stream: the exec runs on in the guest (GET .../exec lists it).
    ex.send_json(201, engine::to_json(engine.exec_background(id, req)));
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
      counters.duplicate_exec_starts++;
      spdlog::warn("exec {} in {}: ignoring a repeated start (exec id {}, pid {})", started, id,
                   exec_id, pid);
      return;
    }
    started = exec_id.empty() ? "?" : exec_id;
    if (!ex.streaming()) ex.begin_stream("application/x-ndjson");
    line({{"type", "start"}, {"exec_id", exec_id}, {"pid", pid}});
    watch = std::make_unique<HangupWatch>(engine, id, exec_id, ex.native_handle());
  };
  cb.on_output = [&](int channel, std::string_view bytes) {
    if (!ex.streaming()) ex.begin_stream("application/x-ndjson");
    return line({{"type", channel == 2 ? "stderr" : "stdout"}, {"data", base64_encode(bytes)}});
  };
  try {
    engine::ExecResult result = engine.exec(id, req, cb);
    watch.reset();
    if (!ex.streaming()) ex.begin_stream("application/x-ndjson");
    json exit = engine::to_json(result);
    exit["type"] = "exit";
    line(exit);
    ex.end_stream();
  } catch (const Error& e) {
    watch.reset();
    if (!ex.streaming()) throw;
    json j = error_body(to_string(e.code()), e.what(), e.field());
    j["type"] = "error";
    line(j);
    ex.end_stream();
  } catch (const std::exception& e) {
    watch.reset();
    if (!ex.streaming()) throw;
    json j = error_body("internal", e.what());
    j["type"] = "error";
    line(j);
    ex.end_stream();
  }
}

// POST .../exec/{exec_id}/stdin[?eof=true]: the raw body (any size, chunked
// or not) goes to the exec's stdin as it arrives. Each piece is what one
// socket read brought (a typed line is forwarded at once), at most 64 KiB,
// and the next is read only once the guest took the last: a process that
// does not read stalls the body, and TCP pushes back on the client.
void handle_exec_stdin(engine::Engine& engine, Exchange& ex, const std::string& id,
                       const std::string& exec_id, const Query& q) {
  engine::StdinWrite w;
  try {
    check_query_keys(q, {"eof"});
    bool eof = query_bool(q, "eof", false);
    // A client that hangs up (or a daemon shutting down, which shuts its
    // sockets) ends a write blocked on a process that does not read.
    int fd = ex.native_handle();
    auto gone = [fd] {
      pollfd p{fd, 0, 0};
      return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLERR)) != 0;
    };
    w = engine.write_stdin(
        id, exec_id, [&] { return ex.read_some(64 * 1024); }, eof, gone);
  } catch (const Error&) {
    // Refused (400, 404, 409) before or while reading the body: take in what is
    // left of a small one, so the client reads the answer instead of a
    // reset connection (closing on unread bytes sends RST). A big rest is
    // not waited for: the connection closes after the answer.
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
    throw;
  }
  ex.send_json(200, {{"exec_id", exec_id},
                     {"stdin_bytes", w.bytes},
                     {"stdin_total", w.total},
                     {"stdin_closed", w.closed}});
}

// A sandbox as the API shows it. The policy is always included, also by an
// engine whose JSON form predates the network field.
json sandbox_json(const engine::SandboxInfo& info) {
  json j = engine::to_json(info);
  if (!j.contains("network")) j["network"] = info.spec.network;
  return j;
}

// The meaning of a policy's entries (CIDRs, names, the always-deny set), so
// a bad policy is a 400 naming the entry before the engine does anything.
void check_policy(const json& policy) { net::NetworkPolicy::parse(policy); }

// GET .../network/events: a JSON array, or with follow=true an NDJSON stream
// until the sandbox ends or the client hangs up. The follower reads only what
// was appended since its last read and sleeps until the journal grows, the
// socket hangs up, or 500 ms pass (to see the sandbox end).
void handle_network_events(engine::Engine& engine, Exchange& ex, const std::string& id,
                           bool follow) {
  // State first, events second: whatever the sandbox recorded before it
  // ended is in the batch fetched after seeing it ended. Both calls come
  // before the stream starts, so an unknown id is a plain 404.
  bool live = engine::holds_resources(engine.get(id).state);
  std::unique_ptr<engine::RecordFollower> follower = engine.follow_network_events(id);
  std::vector<json> events = follower->next();
  if (!follow) {
    json arr = json::array();
    for (auto& e : events) arr.push_back(std::move(e));
    ex.send_json(200, arr);
    return;
  }
  ex.begin_stream("application/x-ndjson");
  try {
    while (true) {
      for (const auto& e : events) {
        if (!ex.write_chunk(e.dump() + "\n")) {
          ex.abort_stream();
          return;
        }
      }
      if (!live) break;
      using Wake = engine::RecordFollower::Wake;
      if (follower->wait(std::chrono::milliseconds(500), ex.native_handle()) == Wake::hangup) {
        ex.abort_stream();
        return;
      }
      live = engine::holds_resources(engine.get(id).state);
      events = follower->next();
    }
  } catch (const Error& e) {
    ex.write_chunk(error_body(to_string(e.code()), e.what(), e.field()).dump() + "\n");
  } catch (const std::exception& e) {
    ex.write_chunk(error_body("internal", e.what()).dump() + "\n");
  }
  ex.end_stream();
}

void handle_get_file(engine::Engine& engine, Exchange& ex, const std::string& id,
                     const std::string& path) {
  try {
    engine.read_file(id, path, [&](std::string_view chunk) {
      if (!ex.streaming()) ex.begin_stream("application/octet-stream");
      return ex.write_chunk(chunk);
    });
  } catch (...) {
    if (!ex.streaming()) throw;
    ex.abort_stream();  // see server.h: truncation must be visible to the client
    throw;
  }
  if (!ex.streaming()) ex.begin_stream("application/octet-stream");
  ex.end_stream();
}

// GET .../files/watch: an NDJSON stream of the guest's file changes. Path
// errors come before the stream (plain 4xx); then {"type":"watching"}, the
// events, and {"type":"end","reason"} when the watch ends in the guest or
// the sandbox stops. A client that hangs up stops the watch in the guest:
// a failed write notices it, and while no event comes the engine's idle
// tick polls the socket for the hangup.
void handle_watch(engine::Engine& engine, Exchange& ex, const std::string& id,
                  const std::string& path, bool recursive) {
  auto line = [&](const json& j) { return ex.write_chunk(j.dump() + "\n"); };
  bool gone = false;
  engine::WatchCallbacks cb;
  cb.on_start = [&](const json& w) {
    ex.begin_stream("application/x-ndjson");
    if (!line({{"type", "watching"},
               {"path", path},
               {"recursive", recursive},
               {"dirs", w.value("dirs", 0)}}))
      gone = true;
  };
  cb.on_event = [&](const json& e) {
    if (!gone && !line(e)) gone = true;
    return !gone;
  };
  cb.on_idle = [&] {
    pollfd p{ex.native_handle(), POLLRDHUP, 0};
    if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLERR | POLLRDHUP))) gone = true;
    return !gone;
  };
  engine::WatchEnd end;
  try {
    end = engine.watch_files(id, path, recursive, cb);
  } catch (const Error& e) {
    if (!ex.streaming()) throw;
    json j = error_body(to_string(e.code()), e.what(), e.field());
    j["type"] = "error";
    line(j);
    ex.end_stream();
    return;
  }
  if (gone) {
    ex.abort_stream();
    return;
  }
  json j = {
      {"type", "end"}, {"reason", end.reason}, {"events", end.events}, {"dropped", end.dropped}};
  if (!end.message.empty()) j["message"] = end.message;
  line(j);
  ex.end_stream();
}

void dispatch(engine::Engine& engine, Exchange& ex, const Caller& caller) {
  ServerCounters& counters = caller.counters;
  RouteMatch m = match_route(ex.method(), ex.path());
  if (m.status == RouteStatus::not_found) {
    ex.send_error(404, "not_found",
                  "no route for " + std::string(ex.method()) + " " + std::string(ex.path()));
    return;
  }
  if (m.status == RouteStatus::method_not_allowed) {
    ex.send_error(405, "method_not_allowed",
                  std::string(ex.method()) + " is not allowed on " + std::string(ex.path()) +
                      " (allowed: " + m.allow + ")",
                  m.allow);
    return;
  }
  if (!m.id.empty()) check_id(m.id, "id");
  if (!m.exec_id.empty()) check_id(m.exec_id, "exec_id");
  // Who may call it, from the route table, before anything is read.
  if (!caller.who.is_operator()) switch (m.access) {
      case Access::operator_only:
        // The host's own business: a tenant sees these routes as absent.
        // An upload is read first, so its client gets the answer rather
        // than a broken pipe.
        ex.discard_body();
        ex.send_error(404, "not_found",
                      "no route for " + std::string(ex.method()) + " " + std::string(ex.path()));
        return;
      case Access::own_sandbox:
        // Another tenant's sandbox is answered exactly like one that does
        // not exist (404).
        visible_sandbox(engine, caller.who, m.id);
        break;
      case Access::own_snapshot:
        visible_snapshot(engine, caller.who, m.id);
        break;
      case Access::anyone:
      case Access::tenant:
        break;
    }
  switch (m.route) {
    case Route::create_token:
    case Route::list_tokens:
    case Route::delete_token:
    case Route::list_tenants:
    case Route::set_tenant:
      handle_auth_route(engine, ex, caller, m);
      return;
    case Route::list_images:
    case Route::get_image:
    case Route::delete_image:
    case Route::import_image:
    case Route::disk_usage:
    case Route::prune:
      handle_image_route(engine, ex, m);
      return;
    default:
      break;
  }
  if (is_snapshot_route(m.route)) {
    handle_snapshot_route(engine, ex, m, caller);
    return;
  }
  Query q = parse_query(ex.query());
  const std::string& id = m.id;

  switch (m.route) {
    case Route::create_token:
    case Route::list_tokens:
    case Route::delete_token:
    case Route::list_tenants:
    case Route::set_tenant:
      return;
    case Route::build_image:
      check_query_keys(q, {});
      handle_build_image(engine, ex);
      return;
    case Route::info: {
      check_query_keys(q, {});
      expect_no_body(ex);
      json j = engine.info();
      j["limits"] = engine::limits::to_json();  // not secret: every caller may pre-check
      if (!caller.who.is_operator()) {
        ex.send_json(200, tenant_info(engine, caller.who, j));
        return;
      }
      j["daemon"] = {{"version", AIRLOCK_VERSION},
                     {"pid", ::getpid()},
                     {"connections", counters.to_json(/*operator_view=*/true)}};
      ex.send_json(200, j);
      return;
    }
    case Route::get_pool:
      check_query_keys(q, {});
      expect_no_body(ex);
      ex.send_json(200, engine.pool_info());
      return;
    case Route::set_pool: {
      check_query_keys(q, {});
      PoolRequest req = parse_pool(ex.read_body(kMaxJsonBody));
      ex.send_json(200, engine.set_pool(req.image, req.size, req.shape));
      return;
    }
    case Route::create_sandbox: {
      check_query_keys(q, {});
      engine::SandboxSpec spec = parse_create(ex.read_body(kMaxJsonBody));
      check_policy(spec.network);
      ex.send_json(201, sandbox_json(create_sandbox_as(engine, caller.who, spec, caller.source)));
      return;
    }
    case Route::list_sandboxes: {
      check_query_keys(q, {"all", "metadata.", "stats"});
      expect_no_body(ex);
      bool with_stats = query_bool(q, "stats", false);
      json arr = json::array();
      for (const auto& sb :
           visible_sandboxes(engine, caller.who, metadata_filter(q), query_bool(q, "all", false))) {
        arr.push_back(sandbox_json(sb));
        if (with_stats) {
          try {
            arr.back()["stats"] = engine.stats(sb.id);
          } catch (const Error&) {  // deleted meanwhile: listed without stats
          }
        }
      }
      ex.send_json(200, arr);
      return;
    }
    case Route::sandbox_stats:  // tenant-scoped like every {id} route (see above)
      check_query_keys(q, {});
      expect_no_body(ex);
      ex.send_json(200, engine.stats(id));
      return;
    case Route::get_sandbox:
      check_query_keys(q, {});
      expect_no_body(ex);
      ex.send_json(200, sandbox_json(engine.get(id)));
      return;
    case Route::delete_sandbox:
      check_query_keys(q, {"wait"});
      expect_no_body(ex);
      // ?wait=true: answered once the VM and files are gone, not just once
      // the sandbox is out of service (engine.h, background_delete).
      if (query_bool(q, "wait", false))
        engine.destroy_and_wait(id);
      else
        engine.destroy(id);
      if (auth::Auth* a = caller.auth)
        a->audit().append({{"source", caller.source},
                           {"tenant", caller.who.tenant},
                           {"token_id", caller.who.token_id},
                           {"method", "DELETE"},
                           {"route", "/v1/sandboxes/{id}"},
                           {"sandbox", id},
                           {"outcome", "sandbox_deleted"},
                           {"status", 204}});
      ex.send_empty(204);
      return;
    case Route::exec:
      check_query_keys(q, {});
      handle_exec(engine, ex, id, counters);
      return;
    case Route::list_execs: {
      check_query_keys(q, {});
      expect_no_body(ex);
      json arr = json::array();
      for (const auto& e : engine.list_execs(id)) arr.push_back(engine::to_json(e));
      ex.send_json(200, arr);
      return;
    }
    case Route::get_exec: {
      if (auto off = q.find("offset"); off != q.end()) {
        check_query_keys(q, {"offset"});
        expect_no_body(ex);
        handle_attach_exec(engine, ex, id, m.exec_id, off->second);
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
      expect_no_body(ex);
      ex.send_json(200, engine::to_json(engine.wait_exec(id, m.exec_id, wait)));
      return;
    }
    case Route::exec_stdin:
      handle_exec_stdin(engine, ex, id, m.exec_id, q);
      return;
    case Route::kill_exec: {
      check_query_keys(q, {"signal"});
      int sig = query_signal(q, 9);
      expect_no_body(ex);
      engine.kill_exec(id, m.exec_id, sig);
      ex.send_empty(204);
      return;
    }
    case Route::put_file: {
      check_query_keys(q, {"path", "mode"});
      std::string path = query_path(q);
      uint32_t mode = query_mode(q, 0644);
      if (auto len = ex.content_length(); len && *len > kMaxUploadBody)
        throw Error(Errc::payload_too_large,
                    "upload of " + std::to_string(*len) + " bytes is over the limit of " +
                        std::to_string(kMaxUploadBody),
                    "body");
      // Streamed: at most one 256 KiB piece is held here at a time.
      uint64_t n = engine.write_file(id, path, mode, [&] { return ex.read_chunk(256 * 1024); });
      // The engine may stop early on error; the rest of the body is then unread
      // and keep_alive() turns false, closing the connection after the reply.
      ex.send_json(201, {{"path", path}, {"bytes", n}});
      return;
    }
    case Route::get_file:
      check_query_keys(q, {"path"});
      expect_no_body(ex);
      handle_get_file(engine, ex, id, query_path(q));
      return;
    case Route::delete_file: {
      check_query_keys(q, {"path", "recursive"});
      std::string path = query_path(q);
      bool recursive = query_bool(q, "recursive", false);
      expect_no_body(ex);
      engine.remove_file(id, path, recursive);
      ex.send_empty(204);
      return;
    }
    case Route::list_files: {
      check_query_keys(q, {"path", "depth"});
      int depth = 1;
      if (q.count("depth")) {
        const std::string& d = q["depth"];
        if (d.empty() || d.size() > 2 || d.find_first_not_of("0123456789") != std::string::npos ||
            std::stoi(d) < 1 || std::stoi(d) > 64)
          throw Error(Errc::invalid_argument, "depth must be an integer from 1 to 64", "depth");
        depth = std::stoi(d);
      }
      expect_no_body(ex);
      ex.send_json(200, engine.list_files(id, query_path(q), depth));
      return;
    }
    case Route::stat_file:
      check_query_keys(q, {"path"});
      expect_no_body(ex);
      ex.send_json(200, engine.stat_file(id, query_path(q)));
      return;
    case Route::watch_files: {
      check_query_keys(q, {"path", "recursive"});
      std::string path = query_path(q);
      bool recursive = query_bool(q, "recursive", false);
      expect_no_body(ex);
      handle_watch(engine, ex, id, path, recursive);
      return;
    }
    case Route::make_dir: {
      check_query_keys(q, {});
      MkdirRequest req = parse_mkdir(ex.read_body(kMaxJsonBody));
      engine.make_dir(id, req.path, req.parents);
      ex.send_json(201, {{"path", req.path}});
      return;
    }
    case Route::move_file: {
      check_query_keys(q, {});
      MoveRequest req = parse_move(ex.read_body(kMaxJsonBody));
      ex.send_json(200, engine.move_file(id, req.from, req.to));
      return;
    }
    case Route::logs: {
      check_query_keys(q, {});
      expect_no_body(ex);
      json arr = json::array();
      for (auto& event : engine.audit(id)) arr.push_back(std::move(event));
      ex.send_json(200, arr);
      return;
    }
    case Route::journal_verify:
    case Route::events:
    case Route::changes:
      handle_journal_route(engine, ex, m.route, id, q);
      return;
    case Route::guest_info:
      check_query_keys(q, {});
      expect_no_body(ex);
      ex.send_json(200, engine.guest_info(id));
      return;
    case Route::posture:
      check_query_keys(q, {});
      expect_no_body(ex);
      ex.send_json(
          200, caller.who.is_operator() ? engine.posture(id) : tenant_posture(engine.posture(id)));
      return;
    case Route::set_network: {
      check_query_keys(q, {});
      json policy = parse_network_patch(ex.read_body(kMaxJsonBody));
      check_policy(policy);
      ex.send_json(200, engine.set_network(id, policy));
      return;
    }
    case Route::set_timeout:
      check_query_keys(q, {});
      ex.send_json(
          200, engine::to_json(engine.set_timeout(id, parse_timeout(ex.read_body(kMaxJsonBody)))));
      return;
    case Route::network_events:
      check_query_keys(q, {"follow"});
      expect_no_body(ex);
      handle_network_events(engine, ex, id, query_bool(q, "follow", false));
      return;
    case Route::add_port: {
      check_query_keys(q, {});
      json body = parse_object(ex.read_body(kMaxJsonBody));
      for (auto& [k, v] : body.items())
        if (k != "guest_port" && k != "host_port")
          throw Error(Errc::invalid_argument, "unknown field " + k, k);
      auto port = [&](const char* k, bool required) -> int {
        if (!body.contains(k)) {
          if (required) throw Error(Errc::invalid_argument, std::string(k) + " is required", k);
          return 0;
        }
        if (!body[k].is_number_integer())
          throw Error(Errc::invalid_argument, std::string(k) + " must be an integer", k);
        int64_t v = body[k].get<int64_t>();
        if (v < 0 || v > 65535)
          throw Error(Errc::invalid_argument, std::string(k) + " must be 0..65535", k);
        return static_cast<int>(v);
      };
      int guest = port("guest_port", true);
      int host = port("host_port", false);
      ex.send_json(201, engine.add_port(id, guest, host));
      return;
    }
    case Route::pty:
      check_query_keys(q, {});
      handle_pty(engine, ex, id);
      return;
    case Route::metrics: {
      check_query_keys(q, {});
      expect_no_body(ex);
      metrics::Writer w;
      engine.write_metrics(w);
      w.counter("airlock_http_requests_total",
                "Answered API requests by route template and status (this scrape not yet counted)",
                counters.http_requests.values());
      w.histogram("airlock_http_request_duration_seconds",
                  "Time from request head to the end of the answer, by route template",
                  counters.http_seconds.values());
      w.gauge("airlock_http_connections_open", "Open API connections", counters.open.load());
      w.counter("airlock_http_connections_refused_total",
                "Connections answered 503 over --max-connections",
                {{{}, static_cast<double>(counters.refused.load())}});
      w.counter("airlock_http_connections_idle_closed_total", "Connections cut by --idle-timeout",
                {{{}, static_cast<double>(counters.idle_closed.load())}});
      ex.send_text(200, metrics::kContentType, w.text());
      return;
    }
    case Route::healthz:
      check_query_keys(q, {});
      expect_no_body(ex);
      ex.send_json(200, {{"status", "ok"}});
      return;
    case Route::readyz: {
      check_query_keys(q, {});
      expect_no_body(ex);
      json r = engine.readiness();
      if (!r.value("ready", false)) {
        // What is missing names host paths and images: the operator's to
        // read, not a network caller's (probes answer without a token).
        if (!caller.who.is_operator()) {
          ex.send_error(503, "unavailable", "not ready");
          return;
        }
        std::string why;
        for (const auto& item : r["missing"])
          why += (why.empty() ? "" : "; ") + item.get<std::string>();
        ex.send_error(503, "unavailable", "not ready to create sandboxes: " + why);
        return;
      }
      ex.send_json(200, {{"status", "ready"}});
      return;
    }
    case Route::list_ports:
      check_query_keys(q, {});
      expect_no_body(ex);
      ex.send_json(200, engine.list_ports(id));
      return;
    case Route::remove_port: {
      check_query_keys(q, {});
      expect_no_body(ex);
      const std::string& hp = m.host_port;
      if (hp.empty() || hp.size() > 5 || hp.find_first_not_of("0123456789") != std::string::npos)
        throw Error(Errc::invalid_argument, "host_port must be a port number, got " + hp,
                    "host_port");
      engine.remove_port(id, std::stoi(hp));
      ex.send_empty(204);
      return;
    }
    case Route::pause:  // handlers_snapshots.cc (answered above)
    case Route::resume:
    case Route::create_snapshot:
    case Route::list_snapshots:
    case Route::get_snapshot:
    case Route::delete_snapshot:
    case Route::save_snapshot_image:
    case Route::fork:
      return;
  }
  ex.send_error(500, "internal", "route without a handler");
}

}  // namespace

void answer_errors(Exchange& ex, const std::function<void()>& fn) {
  auto answered = [&ex](std::string_view what) {
    if (!ex.responded()) return false;
    // The stream already reported the error in its own lines, or it must be cut.
    spdlog::warn("{} {}: error after the answer began: {}", ex.method(), ex.path(), what);
    if (ex.stream_open()) ex.abort_stream();
    return true;
  };
  try {
    fn();
  } catch (const Error& e) {
    if (!answered(e.what())) ex.send_error(e);
  } catch (const std::exception& e) {
    spdlog::error("{} {}: unexpected exception: {}", ex.method(), ex.path(), e.what());
    if (!answered(e.what()))
      ex.send_error(500, "internal", std::string("internal error: ") + e.what());
  }
}

void handle(engine::Engine& engine, Exchange& ex, const Caller& caller) {
  answer_errors(ex, [&] { dispatch(engine, ex, caller); });
}

}  // namespace airlock::daemon

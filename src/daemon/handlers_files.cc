// Files in the guest: PUT|GET|DELETE /v1/sandboxes/{id}/files?path=,
// GET .../files/list|stat|watch, POST .../files/mkdir|move. Uploads and
// downloads are streamed, never held whole.
#include <poll.h>

#include "daemon/handlers.h"
#include "daemon/request.h"

namespace airlock::daemon {
namespace {

using nlohmann::json;

void stream_file(engine::SandboxService& engine, Exchange& ex, const std::string& id,
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
void stream_watch(engine::SandboxService& engine, Exchange& ex, const std::string& id,
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
    end_stream_with_error(ex, error_body(to_string(e.code()), e.what(), e.field()));
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

}  // namespace

namespace serve {

void put_file(const RouteContext& c) {
  check_query_keys(c.query, {"path", "mode"});
  std::string path = query_path(c.query);
  uint32_t mode = query_mode(c.query, 0644);
  if (auto len = c.ex.content_length(); len && *len > kMaxUploadBody)
    throw Error(Errc::payload_too_large,
                "upload of " + std::to_string(*len) + " bytes is over the limit of " +
                    std::to_string(kMaxUploadBody),
                "body");
  // Streamed: at most one 256 KiB piece is held here at a time.
  uint64_t n = c.engine.write_file(c.id, path, mode, [&] { return c.ex.read_chunk(256 * 1024); });
  // The engine may stop early on error; the rest of the body is then unread
  // and keep_alive() turns false, closing the connection after the reply.
  c.ex.send_json(201, {{"path", path}, {"bytes", n}});
}

void get_file(const RouteContext& c) {
  check_query_keys(c.query, {"path"});
  expect_no_body(c.ex);
  stream_file(c.engine, c.ex, c.id, query_path(c.query));
}

void delete_file(const RouteContext& c) {
  check_query_keys(c.query, {"path", "recursive"});
  std::string path = query_path(c.query);
  bool recursive = query_bool(c.query, "recursive", false);
  expect_no_body(c.ex);
  c.engine.remove_file(c.id, path, recursive);
  c.ex.send_empty(204);
}

void list_files(const RouteContext& c) {
  check_query_keys(c.query, {"path", "depth"});
  int depth = 1;
  if (auto it = c.query.find("depth"); it != c.query.end()) {
    const std::string& d = it->second;
    if (d.empty() || d.size() > 2 || d.find_first_not_of("0123456789") != std::string::npos ||
        std::stoi(d) < 1 || std::stoi(d) > 64)
      throw Error(Errc::invalid_argument, "depth must be an integer from 1 to 64", "depth");
    depth = std::stoi(d);
  }
  expect_no_body(c.ex);
  c.ex.send_json(200, c.engine.list_files(c.id, query_path(c.query), depth));
}

void stat_file(const RouteContext& c) {
  check_query_keys(c.query, {"path"});
  expect_no_body(c.ex);
  c.ex.send_json(200, c.engine.stat_file(c.id, query_path(c.query)));
}

void make_dir(const RouteContext& c) {
  check_query_keys(c.query, {});
  MkdirRequest req = parse_mkdir(c.ex.read_body(kMaxJsonBody));
  c.engine.make_dir(c.id, req.path, req.parents);
  c.ex.send_json(201, {{"path", req.path}});
}

void move_file(const RouteContext& c) {
  check_query_keys(c.query, {});
  MoveRequest req = parse_move(c.ex.read_body(kMaxJsonBody));
  c.ex.send_json(200, c.engine.move_file(c.id, req.from, req.to));
}

void watch_files(const RouteContext& c) {
  check_query_keys(c.query, {"path", "recursive"});
  std::string path = query_path(c.query);
  bool recursive = query_bool(c.query, "recursive", false);
  expect_no_body(c.ex);
  stream_watch(c.engine, c.ex, c.id, path, recursive);
}

}  // namespace serve
}  // namespace airlock::daemon

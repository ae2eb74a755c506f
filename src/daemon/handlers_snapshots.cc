// Pause, resume, snapshots and fork: POST
// /v1/sandboxes/{id}/pause|resume|snapshots|fork, GET /v1/snapshots,
// GET|DELETE /v1/snapshots/{id}, POST /v1/snapshots/{id}/image (image
// save). A snapshot belongs to the tenant whose sandbox it was taken of
// (the operator's own to the operator): a tenant lists, reads, deletes and
// saves as an image only its own, and sees another's as absent; the image
// it saves is its own too (bootable by it alone).
#include "daemon/handlers.h"
#include "daemon/request.h"
#include "daemon/router.h"
#include "daemon/tenancy.h"

namespace airlock::daemon {

using nlohmann::json;

namespace {

void no_body(Exchange& ex) {
  if (!ex.read_body(kMaxJsonBody).empty())
    throw Error(Errc::invalid_argument, "this request takes no body", "body");
}

json sandbox_view(const engine::SandboxInfo& info) {
  json j = engine::to_json(info);
  if (!j.contains("network")) j["network"] = info.spec.network;
  return j;
}

}  // namespace

bool is_snapshot_route(Route r) {
  return r == Route::pause || r == Route::resume || r == Route::create_snapshot ||
         r == Route::list_snapshots || r == Route::get_snapshot || r == Route::delete_snapshot ||
         r == Route::fork || r == Route::save_snapshot_image;
}

void handle_snapshot_route(engine::Engine& engine, Exchange& ex, const RouteMatch& m,
                           const Caller& caller) {
  const Principal& who = caller.who;
  Query q = parse_query(ex.query());
  check_query_keys(q, {});
  switch (m.route) {
    case Route::pause:
      no_body(ex);
      ex.send_json(200, sandbox_view(engine.pause(m.id)));
      return;
    case Route::resume:
      no_body(ex);
      ex.send_json(200, sandbox_view(resume_sandbox_as(engine, who, m.id, caller.source)));
      return;
    case Route::create_snapshot: {
      json req = parse_object(ex.read_body(kMaxJsonBody));
      for (auto& [k, v] : req.items())
        if (k != "name" && k != "memory")
          throw Error(Errc::invalid_argument, "unknown field '" + k + "'", k);
      if (!req.contains("name") || !req["name"].is_string())
        throw Error(Errc::invalid_argument, "name is required (a string)", "name");
      bool memory = false;
      if (req.contains("memory")) {
        if (!req["memory"].is_boolean())
          throw Error(Errc::invalid_argument, "memory must be true or false", "memory");
        memory = req["memory"].get<bool>();
      }
      ex.send_json(201, engine.snapshot(m.id, req["name"].get<std::string>(), memory));
      return;
    }
    case Route::list_snapshots:
      no_body(ex);
      ex.send_json(200, visible_snapshots(engine, who));
      return;
    case Route::get_snapshot:
      no_body(ex);
      ex.send_json(200, engine.get_snapshot(m.id));
      return;
    case Route::delete_snapshot:
      no_body(ex);
      engine.delete_snapshot(m.id);
      ex.send_empty(204);
      return;
    case Route::save_snapshot_image: {
      json req = parse_object(ex.read_body(kMaxJsonBody));
      for (auto& [k, v] : req.items())
        if (k != "name") throw Error(Errc::invalid_argument, "unknown field '" + k + "'", k);
      if (!req.contains("name") || !req["name"].is_string())
        throw Error(Errc::invalid_argument, "name is required (the new image's name)", "name");
      ex.send_json(201, engine.save_snapshot_image(m.id, req["name"].get<std::string>()));
      return;
    }
    case Route::fork: {
      json req = parse_object(ex.read_body(kMaxJsonBody));
      for (auto& [k, v] : req.items())
        if (k != "count") throw Error(Errc::invalid_argument, "unknown field '" + k + "'", k);
      int count = 1;
      if (req.contains("count")) {
        if (!req["count"].is_number_integer())
          throw Error(Errc::invalid_argument, "count must be an integer 1..16", "count");
        int64_t c = req["count"].get<int64_t>();
        if (c < 1 || c > 16) throw Error(Errc::invalid_argument, "count must be 1..16", "count");
        count = static_cast<int>(c);
      }
      json arr = json::array();
      for (const auto& sb : fork_sandbox_as(engine, who, m.id, count, caller.source))
        arr.push_back(sandbox_view(sb));
      ex.send_json(201, {{"sandboxes", arr}});
      return;
    }
    default:
      throw Error(Errc::internal, "not a snapshot route");
  }
}

}  // namespace airlock::daemon

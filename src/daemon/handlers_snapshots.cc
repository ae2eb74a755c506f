// Pause, resume, snapshots and fork: POST
// /v1/sandboxes/{id}/pause|resume|snapshots|fork, GET /v1/snapshots,
// GET|DELETE /v1/snapshots/{id}, POST /v1/snapshots/{id}/image (image
// save). A snapshot belongs to the tenant whose sandbox it was taken of
// (the operator's own to the operator): a tenant lists, reads, deletes and
// saves as an image only its own, and sees another's as absent; the image
// it saves is its own too (bootable by it alone).
#include <algorithm>

#include "daemon/handlers.h"
#include "daemon/request.h"
#include "daemon/router.h"
#include "daemon/tenancy.h"

namespace airlock::daemon {

using nlohmann::json;

namespace {

// A JSON object body whose keys are all in `allowed`.
json parse_fields(Exchange& ex, std::initializer_list<const char*> allowed) {
  json req = parse_object(ex.read_body(kMaxJsonBody));
  for (auto& [k, v] : req.items())
    if (std::find_if(allowed.begin(), allowed.end(), [&](const char* a) { return k == a; }) ==
        allowed.end())
      throw Error(Errc::invalid_argument, "unknown field '" + k + "'", k);
  return req;
}

// Every snapshot route takes no query string.
void no_query(const RouteContext& c) { check_query_keys(c.query, {}); }

}  // namespace

namespace serve {

void pause(const RouteContext& c) {
  no_query(c);
  expect_no_body(c.ex);
  c.ex.send_json(200, sandbox_json(c.engine.pause(c.id)));
}

void resume(const RouteContext& c) {
  no_query(c);
  expect_no_body(c.ex);
  c.ex.send_json(200,
                 sandbox_json(resume_sandbox_as(c.engine, c.caller.who, c.id, c.caller.source)));
}

void create_snapshot(const RouteContext& c) {
  no_query(c);
  json req = parse_fields(c.ex, {"name", "memory"});
  if (!req.contains("name") || !req["name"].is_string())
    throw Error(Errc::invalid_argument, "name is required (a string)", "name");
  bool memory = false;
  if (req.contains("memory")) {
    if (!req["memory"].is_boolean())
      throw Error(Errc::invalid_argument, "memory must be true or false", "memory");
    memory = req["memory"].get<bool>();
  }
  c.ex.send_json(201, c.engine.snapshot(c.id, req["name"].get<std::string>(), memory));
}

void list_snapshots(const RouteContext& c) {
  no_query(c);
  expect_no_body(c.ex);
  c.ex.send_json(200, visible_snapshots(c.engine, c.caller.who));
}

void get_snapshot(const RouteContext& c) {
  no_query(c);
  expect_no_body(c.ex);
  c.ex.send_json(200, c.engine.get_snapshot(c.id));
}

void delete_snapshot(const RouteContext& c) {
  no_query(c);
  expect_no_body(c.ex);
  c.engine.delete_snapshot(c.id);
  c.ex.send_empty(204);
}

void save_snapshot_image(const RouteContext& c) {
  no_query(c);
  json req = parse_fields(c.ex, {"name"});
  if (!req.contains("name") || !req["name"].is_string())
    throw Error(Errc::invalid_argument, "name is required (the new image's name)", "name");
  c.ex.send_json(201, c.engine.save_snapshot_image(c.id, req["name"].get<std::string>()));
}

void fork(const RouteContext& c) {
  no_query(c);
  json req = parse_fields(c.ex, {"count"});
  int count = 1;
  if (req.contains("count")) {
    if (!req["count"].is_number_integer())
      throw Error(Errc::invalid_argument, "count must be an integer 1..16", "count");
    int64_t n = req["count"].get<int64_t>();
    if (n < 1 || n > 16) throw Error(Errc::invalid_argument, "count must be 1..16", "count");
    count = static_cast<int>(n);
  }
  json arr = json::array();
  for (const auto& sb : fork_sandbox_as(c.engine, c.caller.who, c.id, count, c.caller.source))
    arr.push_back(sandbox_json(sb));
  c.ex.send_json(201, {{"sandboxes", arr}});
}

}  // namespace serve
}  // namespace airlock::daemon

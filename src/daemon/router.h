// The route table of airlockd's HTTP API: (method, path template) -> Route
// and who may call it. Matching only; the handlers live in handlers*.cc. The table is also the list
// the OpenAPI test checks against api/openapi.yaml, so spec and code cannot
// drift apart.
//
//   RouteMatch m = match_route("DELETE", "/v1/sandboxes/sb-1/exec/e-2");
//   // m.status == RouteStatus::ok, m.route == Route::kill_exec,
//   // m.id == "sb-1", m.exec_id == "e-2"
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace airlock::daemon {

enum class Route {
  get_pool,  // warm pool state
  set_pool,  // warm pool size and shape for one image
  create_sandbox,
  list_sandboxes,
  get_sandbox,
  delete_sandbox,
  exec,
  kill_exec,
  list_execs,
  get_exec,
  exec_stdin,  // append to a streamed stdin (POST .../exec/{exec_id}/stdin)
  put_file,
  get_file,
  delete_file,
  list_files,
  stat_file,
  make_dir,
  move_file,    // rename in the guest (POST .../files/move)
  watch_files,  // NDJSON stream of changes under a directory
  logs,
  journal_verify,  // the journal's hash chain checked (handlers_journal.cc)
  events,          // the whole journal, JSON or a live NDJSON stream
  changes,         // filesystem diff since the sandbox started
  guest_info,
  posture,  // the QEMU jail read back from /proc
  set_network,
  set_timeout,  // move a running sandbox's expiry (POST .../timeout)
  network_events,
  add_port,
  list_ports,
  remove_port,
  info,
  pty,           // WebSocket: an interactive terminal (pty.h)
  metrics,       // Prometheus text exposition (GET /metrics)
  healthz,       // liveness: the daemon answers
  readyz,        // readiness: a create can succeed (an image built, accelerator probed)
  create_token,  // operator only (handlers_auth.cc)
  list_tokens,
  delete_token,
  list_tenants,  // operator only: quotas and usage
  set_tenant,    // operator only: PUT a tenant's quota
  // Pause, resume, snapshots, fork (handlers_snapshots.cc).
  pause,
  resume,
  create_snapshot,  // POST /v1/sandboxes/{id}/snapshots
  list_snapshots,
  get_snapshot,  // {id} is the snapshot's name
  delete_snapshot,
  save_snapshot_image,  // POST /v1/snapshots/{id}/image {name}: `airlock image save`
  fork,
  // Images (handlers_images.cc): operator only.
  list_images,
  get_image,
  delete_image,
  import_image,   // POST /v1/images/{id}/import, body: docker save / OCI layout tar
  disk_usage,     // GET /v1/df
  prune,          // POST /v1/prune
  sandbox_stats,  // GET /v1/sandboxes/{id}/stats
  build_image,    // operator only: an image from a recipe, NDJSON progress (handlers_recipes.cc)
};

// Who may call a route: decided once, from the table, before its handler
// reads anything (handlers.cc dispatch). api/openapi.yaml states the same
// per operation as x-airlock-access (test_spec checks).
enum class Access {
  anyone,         // no credential needed (probes); what it says discloses nothing
  operator_only,  // the unix socket's caller; to a tenant the route does not exist (404)
  tenant,         // any authenticated caller; the handler scopes what it shows
  own_sandbox,    // {id} is a sandbox: another tenant's is answered like a missing one
  own_snapshot,   // {id} is a snapshot's name: likewise
};
const char* to_string(Access a);

struct RouteSpec {
  const char* method;  // "GET", "POST", "PUT", "PATCH", "DELETE"
  const char* path;    // OpenAPI-style template: "/v1/sandboxes/{id}/exec/{exec_id}"
  Route route;
  Access access;
};

// Every route airlockd serves.
const std::vector<RouteSpec>& routes();

// The template of the route `method` `path` matches (for per-route
// metrics: bounded label values, no ids), or "unmatched".
std::string route_template(std::string_view method, std::string_view path);

enum class RouteStatus { ok, not_found, method_not_allowed };

struct RouteMatch {
  RouteStatus status = RouteStatus::not_found;
  Route route = Route::info;
  Access access = Access::operator_only;
  std::string id;         // {id}, if the template has one
  std::string exec_id;    // {exec_id}, if the template has one
  std::string host_port;  // {host_port}, if the template has one (not yet checked)
  std::string allow;      // for method_not_allowed: the Allow header value
};

// Matches `path` (no query string). A path that exists under another method
// gives method_not_allowed with `allow` set. A trailing slash is not
// accepted, and empty segments never match a parameter.
RouteMatch match_route(std::string_view method, std::string_view path);

}  // namespace airlock::daemon

#include "daemon/router.h"

namespace airlock::daemon {
namespace {

std::vector<std::string_view> split(std::string_view path) {
  std::vector<std::string_view> parts;
  if (path.empty() || path[0] != '/') return parts;
  path.remove_prefix(1);
  while (true) {
    auto slash = path.find('/');
    parts.push_back(path.substr(0, slash));
    if (slash == std::string_view::npos) break;
    path.remove_prefix(slash + 1);
  }
  return parts;
}

// Matches path segments against a template; fills {id} / {exec_id}.
bool match_template(const std::vector<std::string_view>& segs, std::string_view tmpl,
                    RouteMatch& out) {
  auto t = split(tmpl);
  if (t.size() != segs.size()) return false;
  RouteMatch m;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == "{id}" || t[i] == "{exec_id}") {
      if (segs[i].empty()) return false;
      (t[i] == "{id}" ? m.id : m.exec_id) = std::string(segs[i]);
    } else if (t[i] == "{host_port}") {
      if (segs[i].empty()) return false;
      m.host_port = std::string(segs[i]);
    } else if (t[i] != segs[i]) {
      return false;
    }
  }
  out.id = std::move(m.id);
  out.exec_id = std::move(m.exec_id);
  out.host_port = std::move(m.host_port);
  return true;
}

}  // namespace

const char* to_string(Access a) {
  switch (a) {
    case Access::anyone:
      return "anyone";
    case Access::operator_only:
      return "operator";
    case Access::tenant:
      return "tenant";
    case Access::own_sandbox:
      return "own_sandbox";
    case Access::own_snapshot:
      return "own_snapshot";
  }
  return "operator";
}

const std::vector<RouteSpec>& routes() {
  static const std::vector<RouteSpec> table = {
      {"GET", "/v1/info", Route::info, Access::tenant},
      {"POST", "/v1/tokens", Route::create_token, Access::operator_only},
      {"GET", "/v1/tokens", Route::list_tokens, Access::operator_only},
      {"DELETE", "/v1/tokens/{id}", Route::delete_token, Access::operator_only},
      {"GET", "/v1/tenants", Route::list_tenants, Access::operator_only},
      {"PUT", "/v1/tenants/{id}", Route::set_tenant, Access::operator_only},
      {"GET", "/v1/pool", Route::get_pool, Access::operator_only},
      {"PUT", "/v1/pool", Route::set_pool, Access::operator_only},
      {"POST", "/v1/sandboxes", Route::create_sandbox, Access::tenant},
      {"GET", "/v1/sandboxes", Route::list_sandboxes, Access::tenant},
      {"GET", "/v1/sandboxes/{id}", Route::get_sandbox, Access::own_sandbox},
      {"DELETE", "/v1/sandboxes/{id}", Route::delete_sandbox, Access::own_sandbox},
      {"POST", "/v1/sandboxes/{id}/exec", Route::exec, Access::own_sandbox},
      {"DELETE", "/v1/sandboxes/{id}/exec/{exec_id}", Route::kill_exec, Access::own_sandbox},
      {"GET", "/v1/sandboxes/{id}/exec", Route::list_execs, Access::own_sandbox},
      {"GET", "/v1/sandboxes/{id}/exec/{exec_id}", Route::get_exec, Access::own_sandbox},
      {"POST", "/v1/sandboxes/{id}/exec/{exec_id}/stdin", Route::exec_stdin, Access::own_sandbox},
      {"PUT", "/v1/sandboxes/{id}/files", Route::put_file, Access::own_sandbox},
      {"GET", "/v1/sandboxes/{id}/files", Route::get_file, Access::own_sandbox},
      {"DELETE", "/v1/sandboxes/{id}/files", Route::delete_file, Access::own_sandbox},
      {"GET", "/v1/sandboxes/{id}/files/list", Route::list_files, Access::own_sandbox},
      {"GET", "/v1/sandboxes/{id}/files/stat", Route::stat_file, Access::own_sandbox},
      {"POST", "/v1/sandboxes/{id}/files/mkdir", Route::make_dir, Access::own_sandbox},
      {"POST", "/v1/sandboxes/{id}/files/move", Route::move_file, Access::own_sandbox},
      {"GET", "/v1/sandboxes/{id}/files/watch", Route::watch_files, Access::own_sandbox},
      {"GET", "/v1/sandboxes/{id}/logs", Route::logs, Access::own_sandbox},
      {"GET", "/v1/sandboxes/{id}/journal/verify", Route::journal_verify, Access::own_sandbox},
      {"GET", "/v1/sandboxes/{id}/events", Route::events, Access::own_sandbox},
      {"GET", "/v1/sandboxes/{id}/changes", Route::changes, Access::own_sandbox},
      {"GET", "/v1/sandboxes/{id}/info", Route::guest_info, Access::own_sandbox},
      {"GET", "/v1/sandboxes/{id}/posture", Route::posture, Access::own_sandbox},
      {"PATCH", "/v1/sandboxes/{id}/network", Route::set_network, Access::own_sandbox},
      {"POST", "/v1/sandboxes/{id}/timeout", Route::set_timeout, Access::own_sandbox},
      {"GET", "/v1/sandboxes/{id}/network/events", Route::network_events, Access::own_sandbox},
      {"POST", "/v1/sandboxes/{id}/ports", Route::add_port, Access::own_sandbox},
      {"GET", "/v1/sandboxes/{id}/ports", Route::list_ports, Access::own_sandbox},
      {"DELETE", "/v1/sandboxes/{id}/ports/{host_port}", Route::remove_port, Access::own_sandbox},
      {"GET", "/v1/sandboxes/{id}/pty", Route::pty, Access::own_sandbox},
      {"POST", "/v1/sandboxes/{id}/pause", Route::pause, Access::own_sandbox},
      {"POST", "/v1/sandboxes/{id}/resume", Route::resume, Access::own_sandbox},
      {"POST", "/v1/sandboxes/{id}/snapshots", Route::create_snapshot, Access::own_sandbox},
      {"POST", "/v1/sandboxes/{id}/fork", Route::fork, Access::own_sandbox},
      {"GET", "/v1/snapshots", Route::list_snapshots, Access::tenant},
      {"GET", "/v1/snapshots/{id}", Route::get_snapshot, Access::own_snapshot},
      {"DELETE", "/v1/snapshots/{id}", Route::delete_snapshot, Access::own_snapshot},
      {"POST", "/v1/snapshots/{id}/image", Route::save_snapshot_image, Access::own_snapshot},
      {"GET", "/v1/images", Route::list_images, Access::operator_only},
      {"GET", "/v1/images/{id}", Route::get_image, Access::operator_only},
      {"DELETE", "/v1/images/{id}", Route::delete_image, Access::operator_only},
      {"POST", "/v1/images/{id}/import", Route::import_image, Access::operator_only},
      {"GET", "/v1/df", Route::disk_usage, Access::operator_only},
      {"POST", "/v1/prune", Route::prune, Access::operator_only},
      {"GET", "/v1/sandboxes/{id}/stats", Route::sandbox_stats, Access::own_sandbox},
      // Unversioned, like every Prometheus target and probe endpoint.
      {"GET", "/metrics", Route::metrics, Access::operator_only},
      {"GET", "/healthz", Route::healthz, Access::anyone},
      {"GET", "/readyz", Route::readyz, Access::anyone},
      {"POST", "/v1/images/build", Route::build_image, Access::operator_only},
  };
  return table;
}

RouteMatch match_route(std::string_view method, std::string_view path) {
  auto segs = split(path);
  RouteMatch result;
  // A template without parameters that matches the path wins over the
  // parameterised ones (POST /v1/images/build is not image "build"; a GET
  // there is a 405, not GET /v1/images/{id}).
  bool literal = false;
  for (const auto& spec : routes()) {
    RouteMatch m;
    if (std::string_view(spec.path).find('{') == std::string::npos &&
        match_template(segs, spec.path, m))
      literal = true;
  }
  for (const auto& spec : routes()) {
    RouteMatch m;
    if (literal && std::string_view(spec.path).find('{') != std::string::npos) continue;
    if (!match_template(segs, spec.path, m)) continue;
    if (method == spec.method) {
      m.status = RouteStatus::ok;
      m.route = spec.route;
      m.access = spec.access;
      return m;
    }
    result.status = RouteStatus::method_not_allowed;
    if (!result.allow.empty()) result.allow += ", ";
    result.allow += spec.method;
  }
  return result;
}

std::string route_template(std::string_view method, std::string_view path) {
  auto segs = split(path);
  for (const auto& spec : routes()) {
    RouteMatch m;
    if (spec.method == method && match_template(segs, spec.path, m)) return spec.path;
  }
  return "unmatched";
}

}  // namespace airlock::daemon

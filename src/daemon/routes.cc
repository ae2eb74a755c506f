// The one table of airlockd's routes (router.h): method, path template, who
// may call it, handler. The rows' order is the order a 405's Allow header names
// their methods in.
#include "daemon/handlers.h"
#include "daemon/router.h"

namespace airlock::daemon {

// A table: one row per operation, deliberately in one function.
const std::vector<RouteSpec>& routes() {
  static const std::vector<RouteSpec> table = {
      {"GET", "/v1/info", Access::tenant, serve::info},
      {"POST", "/v1/tokens", Access::operator_only, serve::create_token},
      {"GET", "/v1/tokens", Access::operator_only, serve::list_tokens},
      {"DELETE", "/v1/tokens/{id}", Access::operator_only, serve::delete_token},
      {"GET", "/v1/tenants", Access::operator_only, serve::list_tenants},
      {"PUT", "/v1/tenants/{id}", Access::operator_only, serve::set_tenant},
      {"GET", "/v1/pool", Access::operator_only, serve::get_pool},
      {"PUT", "/v1/pool", Access::operator_only, serve::set_pool},
      {"POST", "/v1/sandboxes", Access::tenant, serve::create_sandbox},
      {"GET", "/v1/sandboxes", Access::tenant, serve::list_sandboxes},
      {"GET", "/v1/sandboxes/{id}", Access::own_sandbox, serve::get_sandbox},
      {"DELETE", "/v1/sandboxes/{id}", Access::own_sandbox, serve::delete_sandbox},
      {"POST", "/v1/sandboxes/{id}/exec", Access::own_sandbox, serve::exec},
      {"DELETE", "/v1/sandboxes/{id}/exec/{exec_id}", Access::own_sandbox, serve::kill_exec},
      {"GET", "/v1/sandboxes/{id}/exec", Access::own_sandbox, serve::list_execs},
      {"GET", "/v1/sandboxes/{id}/exec/{exec_id}", Access::own_sandbox, serve::get_exec},
      {"POST", "/v1/sandboxes/{id}/exec/{exec_id}/stdin", Access::own_sandbox, serve::exec_stdin},
      {"PUT", "/v1/sandboxes/{id}/files", Access::own_sandbox, serve::put_file},
      {"GET", "/v1/sandboxes/{id}/files", Access::own_sandbox, serve::get_file},
      {"DELETE", "/v1/sandboxes/{id}/files", Access::own_sandbox, serve::delete_file},
      {"GET", "/v1/sandboxes/{id}/files/list", Access::own_sandbox, serve::list_files},
      {"GET", "/v1/sandboxes/{id}/files/stat", Access::own_sandbox, serve::stat_file},
      {"POST", "/v1/sandboxes/{id}/files/mkdir", Access::own_sandbox, serve::make_dir},
      {"POST", "/v1/sandboxes/{id}/files/move", Access::own_sandbox, serve::move_file},
      {"GET", "/v1/sandboxes/{id}/files/watch", Access::own_sandbox, serve::watch_files},
      {"GET", "/v1/sandboxes/{id}/logs", Access::own_sandbox, serve::logs},
      {"GET", "/v1/sandboxes/{id}/journal/verify", Access::own_sandbox, serve::journal_verify},
      {"GET", "/v1/sandboxes/{id}/events", Access::own_sandbox, serve::events},
      {"GET", "/v1/sandboxes/{id}/changes", Access::own_sandbox, serve::changes},
      {"GET", "/v1/sandboxes/{id}/info", Access::own_sandbox, serve::guest_info},
      {"GET", "/v1/sandboxes/{id}/posture", Access::own_sandbox, serve::posture},
      {"PATCH", "/v1/sandboxes/{id}/network", Access::own_sandbox, serve::set_network},
      {"POST", "/v1/sandboxes/{id}/timeout", Access::own_sandbox, serve::set_timeout},
      {"GET", "/v1/sandboxes/{id}/network/events", Access::own_sandbox, serve::network_events},
      {"POST", "/v1/sandboxes/{id}/ports", Access::own_sandbox, serve::add_port},
      {"GET", "/v1/sandboxes/{id}/ports", Access::own_sandbox, serve::list_ports},
      {"DELETE", "/v1/sandboxes/{id}/ports/{host_port}", Access::own_sandbox, serve::remove_port},
      {"GET", "/v1/sandboxes/{id}/pty", Access::own_sandbox, serve::pty},
      {"POST", "/v1/sandboxes/{id}/pause", Access::own_sandbox, serve::pause},
      {"POST", "/v1/sandboxes/{id}/resume", Access::own_sandbox, serve::resume},
      {"POST", "/v1/sandboxes/{id}/snapshots", Access::own_sandbox, serve::create_snapshot},
      {"POST", "/v1/sandboxes/{id}/fork", Access::own_sandbox, serve::fork},
      {"GET", "/v1/snapshots", Access::tenant, serve::list_snapshots},
      {"GET", "/v1/snapshots/{id}", Access::own_snapshot, serve::get_snapshot},
      {"DELETE", "/v1/snapshots/{id}", Access::own_snapshot, serve::delete_snapshot},
      {"POST", "/v1/snapshots/{id}/image", Access::own_snapshot, serve::save_snapshot_image},
      {"GET", "/v1/images", Access::operator_only, serve::list_images},
      {"GET", "/v1/images/{id}", Access::operator_only, serve::get_image},
      {"DELETE", "/v1/images/{id}", Access::operator_only, serve::delete_image},
      {"POST", "/v1/images/{id}/import", Access::operator_only, serve::import_image},
      {"GET", "/v1/df", Access::operator_only, serve::disk_usage},
      {"POST", "/v1/prune", Access::operator_only, serve::prune},
      {"GET", "/v1/sandboxes/{id}/stats", Access::own_sandbox, serve::sandbox_stats},
      // Unversioned, like every Prometheus target and probe endpoint.
      {"GET", "/metrics", Access::operator_only, serve::metrics},
      {"GET", "/healthz", Access::anyone, serve::healthz},
      {"GET", "/readyz", Access::anyone, serve::readyz},
      {"POST", "/v1/images/build", Access::operator_only, serve::build_image},
  };
  return table;
}

}  // namespace airlock::daemon

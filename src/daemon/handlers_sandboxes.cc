// Sandboxes: POST|GET /v1/sandboxes, GET|DELETE /v1/sandboxes/{id}, and the
// reads and settings of one: .../stats, .../logs, .../info (the guest's),
// .../posture, POST .../timeout. A tenant sees and creates its own only
// (daemon/tenancy.h).
#include "auth/auth.h"
#include "daemon/handlers.h"
#include "daemon/request.h"
#include "daemon/tenancy.h"

namespace airlock::daemon::serve {

using nlohmann::json;

void create_sandbox(const RouteContext& c) {
  check_query_keys(c.query, {});
  engine::SandboxSpec spec = parse_create(c.ex.read_body(kMaxJsonBody));
  check_policy(spec.network);
  c.ex.send_json(201,
                 sandbox_json(create_sandbox_as(c.engine, c.caller.who, spec, c.caller.source)));
}

void list_sandboxes(const RouteContext& c) {
  const Query& q = c.query;
  check_query_keys(q, {"all", "metadata.", "stats"});
  expect_no_body(c.ex);
  bool with_stats = query_bool(q, "stats", false);
  json arr = json::array();
  for (const auto& sb :
       visible_sandboxes(c.engine, c.caller.who, metadata_filter(q), query_bool(q, "all", false))) {
    arr.push_back(sandbox_json(sb));
    if (with_stats) {
      try {
        arr.back()["stats"] = c.engine.stats(sb.id);
      } catch (const Error&) {  // deleted meanwhile: listed without stats
      }
    }
  }
  c.ex.send_json(200, arr);
}

void get_sandbox(const RouteContext& c) {
  check_query_keys(c.query, {});
  expect_no_body(c.ex);
  c.ex.send_json(200, sandbox_json(c.engine.get(c.id)));
}

void delete_sandbox(const RouteContext& c) {
  check_query_keys(c.query, {"wait"});
  expect_no_body(c.ex);
  // ?wait=true: answered once the VM and files are gone, not just once
  // the sandbox is out of service (engine.h, background_delete).
  if (query_bool(c.query, "wait", false))
    c.engine.destroy_and_wait(c.id);
  else
    c.engine.destroy(c.id);
  if (auth::Auth* a = c.caller.auth)
    a->audit().append({{"source", c.caller.source},
                       {"tenant", c.caller.who.tenant},
                       {"token_id", c.caller.who.token_id},
                       {"method", "DELETE"},
                       {"route", "/v1/sandboxes/{id}"},
                       {"sandbox", c.id},
                       {"outcome", "sandbox_deleted"},
                       {"status", 204}});
  c.ex.send_empty(204);
}

void sandbox_stats(const RouteContext& c) {
  check_query_keys(c.query, {});
  expect_no_body(c.ex);
  c.ex.send_json(200, c.engine.stats(c.id));
}

void logs(const RouteContext& c) {
  check_query_keys(c.query, {});
  expect_no_body(c.ex);
  json arr = json::array();
  for (auto& event : c.engine.audit(c.id)) arr.push_back(std::move(event));
  c.ex.send_json(200, arr);
}

void guest_info(const RouteContext& c) {
  check_query_keys(c.query, {});
  expect_no_body(c.ex);
  c.ex.send_json(200, c.engine.guest_info(c.id));
}

void posture(const RouteContext& c) {
  check_query_keys(c.query, {});
  expect_no_body(c.ex);
  json p = c.engine.posture(c.id);
  c.ex.send_json(200, c.caller.who.is_operator() ? p : tenant_posture(std::move(p)));
}

void set_timeout(const RouteContext& c) {
  check_query_keys(c.query, {});
  c.ex.send_json(200, engine::to_json(
                          c.engine.set_timeout(c.id, parse_timeout(c.ex.read_body(kMaxJsonBody)))));
}

}  // namespace airlock::daemon::serve

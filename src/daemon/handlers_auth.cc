// The operator's token and tenant routes: POST/GET /v1/tokens, DELETE
// /v1/tokens/{id}, GET /v1/tenants, PUT /v1/tenants/{tenant}.
// Only the unix socket (the operator) reaches them; over TCP they answer
// like a route that does not exist, so a tenant learns nothing about them.
#include <spdlog/spdlog.h>

#include <set>

#include "auth/auth.h"
#include "daemon/handlers.h"
#include "daemon/request.h"
#include "daemon/router.h"
#include "daemon/tenancy.h"

namespace airlock::daemon {

using nlohmann::json;

namespace {

auth::Auth& need_auth(const Caller& c) {
  if (!c.auth) throw Error(Errc::unavailable, "this airlockd has no token store");
  return *c.auth;
}

// {"tenant": T, "expires_in_s"?: N (0 or absent = never), "format"?: "airlock"|"e2b"}
json make_token(const Caller& c, const std::string& body) {
  json req = parse_object(body);
  for (auto& [k, v] : req.items())
    if (k != "tenant" && k != "expires_in_s" && k != "format")
      throw Error(Errc::invalid_argument, "unknown field " + k, k);
  if (!req.contains("tenant") || !req["tenant"].is_string())
    throw Error(Errc::invalid_argument, "tenant is required (a string)", "tenant");
  int64_t expires = 0;
  if (req.contains("expires_in_s") && !req["expires_in_s"].is_null()) {
    if (!req["expires_in_s"].is_number_integer())
      throw Error(Errc::invalid_argument, "expires_in_s must be an integer", "expires_in_s");
    expires = req["expires_in_s"].get<int64_t>();
  }
  auth::TokenFormat format = auth::TokenFormat::airlock;
  if (req.contains("format")) {
    const json& f = req["format"];
    if (f == "e2b")
      format = auth::TokenFormat::e2b;
    else if (f != "airlock")
      throw Error(Errc::invalid_argument, "format must be \"airlock\" or \"e2b\"", "format");
  }
  auth::Auth& a = need_auth(c);
  auto made = a.tokens().create(req["tenant"].get<std::string>(), expires, format);
  a.audit().append({{"source", c.source},
                    {"method", "POST"},
                    {"route", "/v1/tokens"},
                    {"outcome", "token_created"},
                    {"tenant", made.token.tenant},
                    {"token_id", made.token.id},
                    {"status", 201}});
  json j = auth::to_public_json(made.token);
  j["secret"] = made.secret;  // the only time it is shown
  return j;
}

// A tenant's quota and what it holds now.
json tenant_json(const std::string& name, const auth::Quota& q, const TenantUsage& u) {
  return {
      {"tenant", name},
      {"quota", auth::to_json(q)},
      {"usage", {{"sandboxes", u.sandboxes}, {"memory_mb", u.memory_mb}, {"disk_mb", u.disk_mb}}}};
}

}  // namespace

// Operator only (the route table says so; dispatch checked).
namespace serve {

void create_token(const RouteContext& c) {
  check_query_keys(c.query, {});
  c.ex.send_json(201, make_token(c.caller, c.ex.read_body(kMaxJsonBody)));
}

void list_tokens(const RouteContext& c) {
  check_query_keys(c.query, {});
  expect_no_body(c.ex);
  json arr = json::array();
  for (const auto& t : need_auth(c.caller).tokens().list()) arr.push_back(auth::to_public_json(t));
  c.ex.send_json(200, arr);
}

void delete_token(const RouteContext& c) {
  check_query_keys(c.query, {});
  expect_no_body(c.ex);
  auth::Auth& a = need_auth(c.caller);
  if (!a.tokens().remove(c.id)) throw Error(Errc::not_found, "no token " + c.id, "id");
  a.audit().append({{"source", c.caller.source},
                    {"method", "DELETE"},
                    {"route", "/v1/tokens/{id}"},
                    {"outcome", "token_removed"},
                    {"token_id", c.id},
                    {"status", 204}});
  c.ex.send_empty(204);
}

void list_tenants(const RouteContext& c) {
  check_query_keys(c.query, {});
  expect_no_body(c.ex);
  auto usage = tenant_usage(c.engine);
  auto quotas = need_auth(c.caller).quotas().list();
  // Every tenant with a quota, a token or a live sandbox.
  std::set<std::string> names;
  for (const auto& [t, q] : quotas) names.insert(t);
  for (const auto& [t, u] : usage) names.insert(t);
  for (const auto& t : need_auth(c.caller).tokens().list()) names.insert(t.tenant);
  json arr = json::array();
  for (const auto& t : names)
    arr.push_back(tenant_json(t, quotas.count(t) ? quotas[t] : auth::Quota{}, usage[t]));
  c.ex.send_json(200, arr);
}

void set_tenant(const RouteContext& c) {
  check_query_keys(c.query, {});
  // The body first: an answer before it is read would reset the connection.
  json body = parse_object(c.ex.read_body(kMaxJsonBody));
  auth::check_tenant(c.id, "tenant");
  auth::Quota q = auth::parse_quota(body);
  auth::Auth& a = need_auth(c.caller);
  a.quotas().set(c.id, q);
  a.audit().append({{"source", c.caller.source},
                    {"method", "PUT"},
                    {"route", "/v1/tenants/{id}"},
                    {"outcome", "quota_set"},
                    {"tenant", c.id},
                    {"detail", auth::to_json(q).dump()},
                    {"status", 200}});
  c.ex.send_json(200, tenant_json(c.id, q, tenant_usage(c.engine)[c.id]));
}

}  // namespace serve
}  // namespace airlock::daemon

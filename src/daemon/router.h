// The route table of airlockd's HTTP API: one row per operation, holding
// its method, path template, who may call it and the handler that answers
// it (routes.cc). Adding a route is one row there, its handler in the
// handlers_*.cc of its area, and its operation in api/openapi.yaml (the
// OpenAPI test checks the table against the spec, so they cannot drift).
//
//   RouteMatch m = match_route("DELETE", "/v1/sandboxes/sb-1/exec/e-2");
//   // m.status == RouteStatus::ok, m.spec->handler == &serve::kill_exec,
//   // m.id == "sb-1", m.exec_id == "e-2"
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace airlock::daemon {

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

// What a handler is given (handlers.h): the engine, the exchange, the caller,
// the matched ids and the parsed query string.
struct RouteContext;
using RouteHandler = void (*)(const RouteContext&);

struct RouteSpec {
  const char* method;  // "GET", "POST", "PUT", "PATCH", "DELETE"
  const char* path;    // OpenAPI-style template: "/v1/sandboxes/{id}/exec/{exec_id}"
  Access access;
  RouteHandler handler;  // never null (router_test checks)
};

// Every route airlockd serves, in the order a 405's Allow header lists them.
const std::vector<RouteSpec>& routes();

// The template of the route `method` `path` matches (for per-route
// metrics: bounded label values, no ids), or "unmatched".
std::string route_template(std::string_view method, std::string_view path);

enum class RouteStatus { ok, not_found, method_not_allowed };

struct RouteMatch {
  RouteStatus status = RouteStatus::not_found;
  const RouteSpec* spec = nullptr;  // the row, when status is ok
  std::string id;                   // {id}, if the template has one
  std::string exec_id;              // {exec_id}, if the template has one
  std::string host_port;            // {host_port}, if the template has one (not yet checked)
  std::string allow;                // for method_not_allowed: the Allow header value
};

// Matches `path` (no query string). A path that exists under another method
// gives method_not_allowed with `allow` set. A trailing slash is not
// accepted, and empty segments never match a parameter.
RouteMatch match_route(std::string_view method, std::string_view path);

}  // namespace airlock::daemon

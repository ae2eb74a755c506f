#include "daemon/router.h"

#include <gtest/gtest.h>

#include <set>

#include "daemon/handlers.h"

namespace airlock::daemon {
namespace {

// The handler of a match (null if it matched no row).
RouteHandler handler(const RouteMatch& m) { return m.spec ? m.spec->handler : nullptr; }

TEST(Router, MatchesEveryRouteInTheTable) {
  for (const auto& spec : routes()) {
    std::string path = spec.path;
    for (auto [from, to] : {std::pair{"{id}", "sb1"}, std::pair{"{exec_id}", "ex1"}}) {
      auto pos = path.find(from);
      if (pos != std::string::npos) path.replace(pos, std::string(from).size(), to);
    }
    RouteMatch m = match_route(spec.method, path);
    ASSERT_EQ(m.status, RouteStatus::ok) << spec.method << " " << path;
    EXPECT_EQ(m.spec, &spec) << path;
  }
}

TEST(Router, EveryRowHasItsOwnHandlerAndOperation) {
  // A row copied without changing its handler would serve another route.
  std::set<RouteHandler> handlers;
  std::set<std::string> operations;
  for (const auto& spec : routes()) {
    std::string op = std::string(spec.method) + " " + spec.path;
    EXPECT_NE(spec.handler, nullptr) << op;
    EXPECT_TRUE(handlers.insert(spec.handler).second) << op << ": handler shared with another row";
    EXPECT_TRUE(operations.insert(op).second) << op << ": two rows";
  }
}

TEST(Router, ExtractsIds) {
  RouteMatch m = match_route("DELETE", "/v1/sandboxes/sb-1/exec/e-2");
  ASSERT_EQ(m.status, RouteStatus::ok);
  EXPECT_EQ(handler(m), &serve::kill_exec);
  EXPECT_EQ(m.id, "sb-1");
  EXPECT_EQ(m.exec_id, "e-2");
  m = match_route("GET", "/v1/sandboxes/abc/files/list");
  EXPECT_EQ(handler(m), &serve::list_files);
  EXPECT_EQ(m.id, "abc");
}

TEST(Router, FixedSegmentsBeatNothing) {
  // "info" under a sandbox is the guest info route, not a sandbox named info.
  EXPECT_EQ(handler(match_route("GET", "/v1/info")), &serve::info);
  EXPECT_EQ(handler(match_route("GET", "/v1/sandboxes/x/info")), &serve::guest_info);
  EXPECT_EQ(handler(match_route("GET", "/v1/sandboxes/x/files")), &serve::get_file);
}

TEST(Router, UnknownPathsAre404) {
  for (const char* p : {"/", "", "/v1", "/v2/sandboxes", "/v1/sandboxes/", "/v1/sandboxes//exec",
                        "/v1/sandboxes/x/exec/", "/v1/sandboxes/x/nope", "v1/info",
                        "/v1/sandboxes/x/files/list/more"})
    EXPECT_EQ(match_route("GET", p).status, RouteStatus::not_found) << p;
}

TEST(Router, WrongMethodIs405WithAllow) {
  RouteMatch m = match_route("PATCH", "/v1/sandboxes/x");
  EXPECT_EQ(m.status, RouteStatus::method_not_allowed);
  EXPECT_EQ(m.allow, "GET, DELETE");
  m = match_route("PUT", "/v1/sandboxes/x/exec");
  EXPECT_EQ(m.status, RouteStatus::method_not_allowed);
  EXPECT_EQ(m.allow, "POST, GET");
  m = match_route("GET", "/v1/sandboxes/x/exec/ex-1");
  EXPECT_EQ(m.status, RouteStatus::ok);
  EXPECT_EQ(handler(m), &serve::get_exec);
  EXPECT_EQ(m.exec_id, "ex-1");
  EXPECT_EQ(match_route("DELETE", "/v1/sandboxes").allow, "POST, GET");
  m = match_route("GET", "/v1/sandboxes/x/network");
  EXPECT_EQ(m.status, RouteStatus::method_not_allowed);
  EXPECT_EQ(m.allow, "PATCH");
}

TEST(Router, NetworkRoutes) {
  RouteMatch m = match_route("PATCH", "/v1/sandboxes/sb-1/network");
  ASSERT_EQ(m.status, RouteStatus::ok);
  EXPECT_EQ(handler(m), &serve::set_network);
  EXPECT_EQ(m.id, "sb-1");
  m = match_route("GET", "/v1/sandboxes/sb-1/network/events");
  ASSERT_EQ(m.status, RouteStatus::ok);
  EXPECT_EQ(handler(m), &serve::network_events);
  EXPECT_EQ(match_route("POST", "/v1/sandboxes/sb-1/network/events").allow, "GET");
}

TEST(Router, HealthAndMetricsRoutes) {
  EXPECT_EQ(handler(match_route("GET", "/metrics")), &serve::metrics);
  EXPECT_EQ(handler(match_route("GET", "/healthz")), &serve::healthz);
  EXPECT_EQ(handler(match_route("GET", "/readyz")), &serve::readyz);
  EXPECT_EQ(match_route("POST", "/metrics").allow, "GET");
}

TEST(Router, ALiteralPathWinsOverAParameter) {
  // /v1/images/build is the build route, not image "build": only POST.
  EXPECT_EQ(handler(match_route("POST", "/v1/images/build")), &serve::build_image);
  RouteMatch m = match_route("GET", "/v1/images/build");
  EXPECT_EQ(m.status, RouteStatus::method_not_allowed);
  EXPECT_EQ(m.allow, "POST");
  m = match_route("GET", "/v1/images/builder");
  ASSERT_EQ(m.status, RouteStatus::ok);
  EXPECT_EQ(handler(m), &serve::get_image);
  EXPECT_EQ(m.id, "builder");
}

TEST(Router, RouteTemplateHidesIds) {
  // Per-route metrics are labelled by template: bounded, no ids.
  EXPECT_EQ(route_template("POST", "/v1/sandboxes/sb-123/exec"), "/v1/sandboxes/{id}/exec");
  EXPECT_EQ(route_template("DELETE", "/v1/sandboxes/sb-1/exec/ex-2"),
            "/v1/sandboxes/{id}/exec/{exec_id}");
  EXPECT_EQ(route_template("GET", "/metrics"), "/metrics");
  EXPECT_EQ(route_template("GET", "/no/such/path"), "unmatched");
  EXPECT_EQ(route_template("POST", "/metrics"), "unmatched");  // 405: no such operation
}

}  // namespace
}  // namespace airlock::daemon

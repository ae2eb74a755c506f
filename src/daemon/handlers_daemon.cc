// The daemon itself: GET /v1/info, GET|PUT /v1/pool, and the unversioned
// GET /metrics, /healthz, /readyz a scraper or load balancer asks.
#include <unistd.h>

#include "common/metrics/metrics.h"
#include "daemon/handlers.h"
#include "daemon/request.h"
#include "daemon/tenancy.h"
#include "engine/api/limits.h"

namespace airlock::daemon::serve {

using nlohmann::json;

void info(const RouteContext& c) {
  check_query_keys(c.query, {});
  expect_no_body(c.ex);
  json j = c.engine.info();
  j["limits"] = engine::limits::to_json();  // not secret: every caller may pre-check
  if (!c.caller.who.is_operator()) {
    c.ex.send_json(200, tenant_info(c.engine, c.caller.who, j));
    return;
  }
  j["daemon"] = {{"version", AIRLOCK_VERSION},
                 {"pid", ::getpid()},
                 {"connections", c.caller.counters.to_json(/*operator_view=*/true)}};
  c.ex.send_json(200, j);
}

void get_pool(const RouteContext& c) {
  check_query_keys(c.query, {});
  expect_no_body(c.ex);
  c.ex.send_json(200, c.engine.pool_info());
}

void set_pool(const RouteContext& c) {
  check_query_keys(c.query, {});
  PoolRequest req = parse_pool(c.ex.read_body(kMaxJsonBody));
  c.ex.send_json(200, c.engine.set_pool(req.image, req.size, req.shape));
}

void metrics(const RouteContext& c) {
  check_query_keys(c.query, {});
  expect_no_body(c.ex);
  const ServerCounters& counters = c.caller.counters;
  metrics::Writer w;
  c.engine.write_metrics(w);
  w.counter("airlock_http_requests_total",
            "Answered API requests by route template and status (this scrape not yet counted)",
            counters.http_requests.values());
  w.histogram("airlock_http_request_duration_seconds",
              "Time from request head to the end of the answer, by route template",
              counters.http_seconds.values());
  w.gauge("airlock_http_connections_open", "Open API connections", counters.open.load());
  w.counter("airlock_http_connections_refused_total",
            "Connections answered 503 over --max-connections",
            {{{}, static_cast<double>(counters.refused.load())}});
  w.counter("airlock_http_connections_idle_closed_total", "Connections cut by --idle-timeout",
            {{{}, static_cast<double>(counters.idle_closed.load())}});
  c.ex.send_text(200, metrics::kContentType, w.text());
}

void healthz(const RouteContext& c) {
  check_query_keys(c.query, {});
  expect_no_body(c.ex);
  c.ex.send_json(200, {{"status", "ok"}});
}

void readyz(const RouteContext& c) {
  check_query_keys(c.query, {});
  expect_no_body(c.ex);
  json r = c.engine.readiness();
  if (!r.value("ready", false)) {
    // What is missing names host paths and images: the operator's to
    // read, not a network caller's (probes answer without a token).
    if (!c.caller.who.is_operator()) {
      c.ex.send_error(503, "unavailable", "not ready");
      return;
    }
    std::string why;
    for (const auto& item : r["missing"])
      why += (why.empty() ? "" : "; ") + item.get<std::string>();
    c.ex.send_error(503, "unavailable", "not ready to create sandboxes: " + why);
    return;
  }
  c.ex.send_json(200, {{"status", "ready"}});
}

}  // namespace airlock::daemon::serve

// The network policy and ports: PATCH /v1/sandboxes/{id}/network,
// GET .../network/events, POST|GET .../ports, DELETE .../ports/{host_port}.
#include "daemon/handlers.h"
#include "daemon/request.h"
#include "engine/net/policy.h"

namespace airlock::daemon {
namespace {

using nlohmann::json;

// A port number in 0..65535 from `body[k]` (0 if absent and not required).
int body_port(const json& body, const char* k, bool required) {
  if (!body.contains(k)) {
    if (required) throw Error(Errc::invalid_argument, std::string(k) + " is required", k);
    return 0;
  }
  if (!body[k].is_number_integer())
    throw Error(Errc::invalid_argument, std::string(k) + " must be an integer", k);
  int64_t v = body[k].get<int64_t>();
  if (v < 0 || v > 65535)
    throw Error(Errc::invalid_argument, std::string(k) + " must be 0..65535", k);
  return static_cast<int>(v);
}

}  // namespace

void check_policy(const json& policy) { net::NetworkPolicy::parse(policy); }

namespace serve {

void set_network(const RouteContext& c) {
  check_query_keys(c.query, {});
  json policy = parse_network_patch(c.ex.read_body(kMaxJsonBody));
  check_policy(policy);
  c.ex.send_json(200, c.engine.set_network(c.id, policy));
}

void network_events(const RouteContext& c) {
  check_query_keys(c.query, {"follow"});
  expect_no_body(c.ex);
  send_records(c.engine, c.ex, c.id, RecordLog::network_events,
               query_bool(c.query, "follow", false));
}

void add_port(const RouteContext& c) {
  check_query_keys(c.query, {});
  json body = parse_object(c.ex.read_body(kMaxJsonBody));
  for (auto& [k, v] : body.items())
    if (k != "guest_port" && k != "host_port")
      throw Error(Errc::invalid_argument, "unknown field " + k, k);
  int guest = body_port(body, "guest_port", true);
  int host = body_port(body, "host_port", false);
  c.ex.send_json(201, c.engine.add_port(c.id, guest, host));
}

void list_ports(const RouteContext& c) {
  check_query_keys(c.query, {});
  expect_no_body(c.ex);
  c.ex.send_json(200, c.engine.list_ports(c.id));
}

void remove_port(const RouteContext& c) {
  check_query_keys(c.query, {});
  expect_no_body(c.ex);
  const std::string& hp = c.host_port;
  if (hp.empty() || hp.size() > 5 || hp.find_first_not_of("0123456789") != std::string::npos)
    throw Error(Errc::invalid_argument, "host_port must be a port number, got " + hp, "host_port");
  c.engine.remove_port(c.id, std::stoi(hp));
  c.ex.send_empty(204);
}

}  // namespace serve
}  // namespace airlock::daemon

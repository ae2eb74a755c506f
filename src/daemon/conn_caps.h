// Who holds airlockd's connections (internal to airlockd): the limits on
// them and the caps that keep one tenant, one source address or the network
// as a whole from taking every slot, so that the operator's unix socket
// always gets in.
//
//   ConnectionCaps caps;
//   ConnSlot slot{.network = true, .source = auth::source_key(peer)};
//   if (auto why = caps.open(limits, slot); !why.empty()) -> 503 `why`, close
//   ... authenticate a request as tenant T ...
//   if (auto why = caps.claim(limits, slot, T); !why.empty()) -> 503 `why`, close
//   caps.close(slot);   // when the connection ends, however it ends
//
// A connection counts from accept to close, whatever it carries: a request,
// a stream (exec output, follow, watch) or a pty. It counts against its
// source from the start and against a tenant from its first authenticated
// request. Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

namespace airlock::daemon {

struct ServerLimits {
  // Open connections served at once; beyond it a new connection is answered
  // 503 {"error": {"code": "unavailable", ...}} and closed (and counted).
  int max_connections = 256;
  // Of max_connections, this many are kept for the unix socket (the
  // operator): TCP clients together hold at most max_connections less this
  // (never more than half of max_connections is kept).
  int unix_reserve = 16;
  // TCP connections at once from one source address (an IPv6 /64 counts as
  // one), and held by one tenant.
  int max_per_source = 128;
  int max_per_tenant = 64;
  // A socket read or write blocked this long closes the connection.
  std::chrono::milliseconds idle_timeout{std::chrono::seconds(60)};
  // A request's whole header block must arrive within this, counted from
  // its first byte (for a connection's first request, from accept, so the
  // TLS handshake is inside it too).
  std::chrono::milliseconds header_timeout{std::chrono::seconds(10)};

  // The unix reserve actually kept.
  int effective_reserve() const;
};

// One connection as the caps see it.
struct ConnSlot {
  bool network = false;  // TCP (else the unix socket)
  std::string source;    // auth::source_key of the peer (TCP only)
  std::string tenant;    // the tenant it is counted against; "" = none yet
  bool counted = false;  // open() admitted it
};

class ConnectionCaps {
 public:
  // Admits and counts a new connection; returns "" or, over a cap, the
  // refusal's message naming the cap (nothing counted then).
  std::string open(const ServerLimits& limits, ConnSlot& slot);
  // Counts the connection against `tenant` from now on ("" = against no
  // tenant). Returns "" or, over max_per_tenant, the refusal's message
  // (the slot then keeps its earlier tenant).
  std::string claim(const ServerLimits& limits, ConnSlot& slot, const std::string& tenant);
  // The connection ended: counted nowhere any more. Idempotent.
  void close(ConnSlot& slot);

  // {"unix_open", "tcp_open", "refused_source_cap", "refused_tenant_cap",
  //  "tenants": {T: n}, "sources": {S: n}}; the two maps only with `names`
  // (the operator's view: a tenant learns no other tenant's name).
  nlohmann::json to_json(bool names) const;

 private:
  mutable std::mutex mu_;
  int unix_ = 0, tcp_ = 0;
  std::map<std::string, int> sources_, tenants_;
  uint64_t refused_source_ = 0, refused_tenant_ = 0;
};

}  // namespace airlock::daemon

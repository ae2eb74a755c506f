// DNS pinning: which IPs the helper's own resolver returned to this sandbox,
// for which name, until when.
//
// A domain rule ("api.example.com", "*.example.com") allows a connection to
// an IP only if the resolver returned that IP for an allowed name within its
// TTL: the guest cannot reach an arbitrary address by claiming a name, and
// an IP literal never matches a domain rule. Answers that point an allowed
// name at a denied address (DNS rebinding: "allowed.example.com A
// 127.0.0.1") are not pinned and not given to the guest; pin_answers()
// returns them so the caller records them.
//
// TTLs are clamped to [min_ttl, max_ttl] (default 10 s .. 1 h): a 0-second
// TTL would make the answer useless before the guest can connect, a huge one
// would keep a stale pin forever. The table holds at most max_entries
// (name, ip) pairs; when full the entry expiring soonest is evicted.
//
//   PinTable pins(clock);
//   auto r = pin_answers(policy, pins, "api.example.com", answers);
//   ...                   // r.kept go to the guest, r.dropped are recorded
//   std::string name;
//   Decision d = decide_pinned(policy, pins, ip, 443, Proto::tcp, &name);
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "engine/net/policy.h"

namespace airlock::net {

using Clock = std::function<std::chrono::steady_clock::time_point()>;
Clock steady_clock_fn();

struct ResolvedAddr {
  IpAddr ip;
  uint32_t ttl = 0;  // seconds, as the upstream resolver returned it
};

class PinTable {
 public:
  explicit PinTable(Clock clock = steady_clock_fn(), size_t max_entries = 4096,
                    uint32_t min_ttl = 10, uint32_t max_ttl = 3600);

  // Pins `ip` for `name` (normalised) for the clamped ttl; refreshes an existing pin.
  void add(const std::string& name, const IpAddr& ip, uint32_t ttl);
  // The names `ip` is pinned for right now (unexpired), sorted.
  std::vector<std::string> names_for(const IpAddr& ip) const;
  // Drops expired pins; returns how many.
  size_t expire();
  size_t size() const { return pins_.size(); }

 private:
  using Key = std::pair<IpAddr, std::string>;
  Clock clock_;
  size_t max_entries_;
  uint32_t min_ttl_, max_ttl_;
  std::map<Key, std::chrono::steady_clock::time_point> pins_;
};

struct PinResult {
  std::vector<ResolvedAddr> kept;                          // pinned, to be answered to the guest
  std::vector<std::pair<ResolvedAddr, Decision>> dropped;  // denied addresses (rebinding)
};

// Checks each resolved address of `name` against the policy (as a connection
// to it would be, with the name): denied ones are dropped, the others pinned.
PinResult pin_answers(const NetworkPolicy& policy, PinTable& pins, const std::string& name,
                      const std::vector<ResolvedAddr>& answers);

// Decides a connection to ip:port: by address rules, else by any name the IP
// is pinned for. *name_out gets the name that allowed it (or the first pinned
// name, for the record), empty if none.
Decision decide_pinned(const NetworkPolicy& policy, const PinTable& pins, const IpAddr& ip,
                       uint16_t port, Proto proto, std::string* name_out);

}  // namespace airlock::net

#include "engine/net/pinning.h"

#include <algorithm>

namespace airlock::net {

Clock steady_clock_fn() {
  return [] { return std::chrono::steady_clock::now(); };
}

PinTable::PinTable(Clock clock, size_t max_entries, uint32_t min_ttl, uint32_t max_ttl)
    : clock_(std::move(clock)), max_entries_(max_entries), min_ttl_(min_ttl), max_ttl_(max_ttl) {}

void PinTable::add(const std::string& name, const IpAddr& ip, uint32_t ttl) {
  auto until = clock_() + std::chrono::seconds(std::clamp(ttl, min_ttl_, max_ttl_));
  Key key{ip, name};
  auto it = pins_.find(key);
  if (it != pins_.end()) {
    it->second = std::max(it->second, until);
    return;
  }
  if (pins_.size() >= max_entries_) {
    expire();
    if (pins_.size() >= max_entries_) {
      // Evict the pin that would expire first: bounded memory whatever the guest asks.
      auto victim = std::min_element(pins_.begin(), pins_.end(),
                                     [](auto& a, auto& b) { return a.second < b.second; });
      pins_.erase(victim);
    }
  }
  pins_.emplace(std::move(key), until);
}

std::vector<std::string> PinTable::names_for(const IpAddr& ip) const {
  std::vector<std::string> out;
  auto now = clock_();
  for (auto it = pins_.lower_bound(Key{ip, std::string()});
       it != pins_.end() && it->first.first == ip; ++it) {
    if (it->second > now) out.push_back(it->first.second);
  }
  return out;
}

size_t PinTable::expire() {
  auto now = clock_();
  return std::erase_if(pins_, [&](const auto& kv) { return kv.second <= now; });
}

PinResult pin_answers(const NetworkPolicy& policy, PinTable& pins, const std::string& name,
                      const std::vector<ResolvedAddr>& answers) {
  PinResult r;
  for (const auto& a : answers) {
    // Port/proto do not take part in address decisions; tcp/0 stands for "any".
    Decision d = policy.decide(a.ip, 0, Proto::tcp, &name);
    if (!d.allowed) {
      r.dropped.emplace_back(a, std::move(d));
      continue;
    }
    pins.add(name, a.ip, a.ttl);
    r.kept.push_back(a);
  }
  return r;
}

Decision decide_pinned(const NetworkPolicy& policy, const PinTable& pins, const IpAddr& ip,
                       uint16_t port, Proto proto, std::string* name_out) {
  if (name_out) name_out->clear();
  Decision by_addr = policy.decide(ip, port, proto, nullptr);
  auto names = pins.names_for(ip);
  if (by_addr.allowed || by_addr.rule != "default deny") {
    // Decided without names (always-deny, deny CIDR, open, allow CIDR) — but
    // a deny *name* rule may still apply to the name the IP came from.
    for (const auto& n : names) {
      Decision d = policy.decide(ip, port, proto, &n);
      if (!d.allowed) {
        if (name_out) *name_out = n;
        return d;
      }
    }
    if (name_out && !names.empty()) *name_out = names.front();
    return by_addr;
  }
  for (const auto& n : names) {
    Decision d = policy.decide(ip, port, proto, &n);
    if (d.allowed) {
      if (name_out) *name_out = n;
      return d;
    }
  }
  if (name_out && !names.empty()) *name_out = names.front();
  return by_addr;
}

}  // namespace airlock::net

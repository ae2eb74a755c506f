#include "daemon/conn_caps.h"

#include <algorithm>

namespace airlock::daemon {

int ServerLimits::effective_reserve() const {
  return std::clamp(unix_reserve, 0, max_connections / 2);
}

namespace {
void drop(std::map<std::string, int>& m, const std::string& key) {
  auto it = m.find(key);
  if (it != m.end() && --it->second <= 0) m.erase(it);
}
}  // namespace

std::string ConnectionCaps::open(const ServerLimits& limits, ConnSlot& slot) {
  std::lock_guard lock(mu_);
  if (slot.counted) return {};
  if (unix_ + tcp_ >= limits.max_connections)
    return "airlockd is serving its maximum of " + std::to_string(limits.max_connections) +
           " connections (--max-connections); try again later";
  if (slot.network) {
    int reserve = limits.effective_reserve();
    int tcp_max = limits.max_connections - reserve;
    if (tcp_ >= tcp_max)
      return "airlockd is serving its maximum of " + std::to_string(tcp_max) +
             " network connections (--max-connections " + std::to_string(limits.max_connections) +
             " less --unix-socket-reserve " + std::to_string(reserve) +
             " kept for the unix socket); try again later";
    auto it = sources_.find(slot.source);
    if (it != sources_.end() && it->second >= limits.max_per_source) {
      ++refused_source_;
      return "this source address holds its maximum of " + std::to_string(limits.max_per_source) +
             " connections (--max-connections-per-source); close one or try again later";
    }
    ++sources_[slot.source];
    ++tcp_;
  } else {
    ++unix_;
  }
  slot.counted = true;
  return {};
}

std::string ConnectionCaps::claim(const ServerLimits& limits, ConnSlot& slot,
                                  const std::string& tenant) {
  std::lock_guard lock(mu_);
  if (!slot.counted || slot.tenant == tenant) return {};
  if (!tenant.empty()) {
    auto it = tenants_.find(tenant);
    if (it != tenants_.end() && it->second >= limits.max_per_tenant) {
      ++refused_tenant_;
      return "tenant " + tenant + " holds its maximum of " + std::to_string(limits.max_per_tenant) +
             " connections (--max-connections-per-tenant), streams included; close one or try "
             "again later";
    }
    ++tenants_[tenant];
  }
  if (!slot.tenant.empty()) drop(tenants_, slot.tenant);
  slot.tenant = tenant;
  return {};
}

void ConnectionCaps::close(ConnSlot& slot) {
  std::lock_guard lock(mu_);
  if (!slot.counted) return;
  if (!slot.tenant.empty()) drop(tenants_, slot.tenant);
  if (slot.network) {
    drop(sources_, slot.source);
    --tcp_;
  } else {
    --unix_;
  }
  slot.tenant.clear();
  slot.counted = false;
}

nlohmann::json ConnectionCaps::to_json(bool names) const {
  std::lock_guard lock(mu_);
  nlohmann::json j = {{"unix_open", unix_},
                      {"tcp_open", tcp_},
                      {"refused_source_cap", refused_source_},
                      {"refused_tenant_cap", refused_tenant_}};
  if (names) {
    j["tenants"] = nlohmann::json::object();
    for (const auto& [t, n] : tenants_) j["tenants"][t] = n;
    j["sources"] = nlohmann::json::object();
    for (const auto& [s, n] : sources_) j["sources"][s] = n;
  }
  return j;
}

}  // namespace airlock::daemon

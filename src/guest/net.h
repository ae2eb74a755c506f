// The guest's network interface, configured from the host's hello (issue 4).
//
// The host sends {"network": {"address": "10.0.2.15/24", "gateway": "10.0.2.2",
// "dns": "10.0.2.3"}} in hello when the VM has a NIC (the airlock-net helper's
// fixed slirp addresses). The agent brings the first non-loopback interface up
// with that address, adds the default route and writes /etc/resolv.conf: no
// DHCP client in the image. Without "network" nothing is touched (and the VM
// has no NIC at all).
#pragma once

#include <netinet/in.h>

#include <nlohmann/json.hpp>
#include <string>

namespace airlock::guest {

struct GuestNetwork {
  in_addr address{};
  int prefix = 24;
  in_addr gateway{};
  in_addr dns{};
};

// Parses hello's "network" object; throws std::invalid_argument naming the
// bad field (IPv4 dotted quads only, prefix 1..32, gateway inside the subnet).
GuestNetwork parse_guest_network(const nlohmann::json& j);

// The first interface in /sys/class/net other than "lo" (sorted by name),
// waiting up to `wait_ms` for the driver to create it; "" if none.
std::string first_nic(int wait_ms);

// Configures `nic` per `net` (SIOCSIFADDR/NETMASK/FLAGS, SIOCADDRT default
// route) and writes `resolv_conf`. Returns "" or what failed.
std::string configure_network(const std::string& nic, const GuestNetwork& net,
                              const std::string& resolv_conf = "/etc/resolv.conf");

}  // namespace airlock::guest

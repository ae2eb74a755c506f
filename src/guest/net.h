// The guest's network interface, configured from the host's hello.
//
// The host sends {"network": {"address": "10.0.2.15/24", "gateway": "10.0.2.2",
// "dns": "10.0.2.3"}} in hello when the VM has a NIC (the airlock-net helper's
// fixed slirp addresses). The agent brings the first non-loopback interface up
// with that address, adds the default route and writes /etc/resolv.conf: no
// DHCP client in the image. Without "network" nothing is touched (and the VM
// has no NIC at all).
//
// Optional in the same object: "address6": "fec0::15/64" and "gateway6":
// "fec0::2" (slirp's IPv6 network; both or neither), and "mac":
// "52:54:00:xx:xx:xx", set on the interface before it is brought up (a VM
// restored from a template would otherwise keep the template's MAC).
#pragma once

#include <netinet/in.h>

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace airlock::guest {

struct GuestNetwork {
  in_addr address{};
  int prefix = 24;
  in_addr gateway{};
  in_addr dns{};
  std::optional<in6_addr> address6;  // with prefix6 and gateway6
  int prefix6 = 64;
  in6_addr gateway6{};
  std::optional<std::array<uint8_t, 6>> mac;
};

// Parses hello's "network" object; throws std::invalid_argument naming the
// bad field (IPv4 dotted quads only, prefix 1..32, gateway inside the subnet;
// address6 "v6/1..128" with gateway6 inside it; mac six hex pairs, unicast).
GuestNetwork parse_guest_network(const nlohmann::json& j);

// The first interface in /sys/class/net other than "lo" (sorted by name),
// waiting up to `wait_ms` for the driver to create it; "" if none.
std::string first_nic(int wait_ms);

// Configures `nic` per `net` (SIOCSIFHWADDR if a MAC is given, then
// SIOCSIFADDR/NETMASK/FLAGS, SIOCADDRT default route; IPv6 address and
// default route if given, with duplicate address detection off: the
// address is the only one on slirp's link) and writes `resolv_conf`.
// Returns "" or what failed (all of it, "; "-separated).
std::string configure_network(const std::string& nic, const GuestNetwork& net,
                              const std::string& resolv_conf = "/etc/resolv.conf");

}  // namespace airlock::guest

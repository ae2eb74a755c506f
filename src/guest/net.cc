#include "guest/net.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <net/if.h>
#include <net/if_arp.h>
#include <net/route.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <thread>
#include <vector>

namespace airlock::guest {
namespace {

in_addr parse_ip(const nlohmann::json& j, const char* field) {
  in_addr a{};
  // inet_pton, not inet_aton: only the plain dotted quad is accepted.
  if (!j.is_string() || inet_pton(AF_INET, j.get<std::string>().c_str(), &a) != 1)
    throw std::invalid_argument(std::string("network.") + field + " must be an IPv4 address");
  return a;
}

in_addr mask_of(int prefix) {
  in_addr m{};
  m.s_addr = htonl(prefix == 0 ? 0 : ~uint32_t{0} << (32 - prefix));
  return m;
}

void set_sin(sockaddr* sa, in_addr a) {
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_addr = a;
  std::memcpy(sa, &sin, sizeof sin);
}

in6_addr parse_ip6(const std::string& s, const char* field) {
  in6_addr a{};
  if (inet_pton(AF_INET6, s.c_str(), &a) != 1)
    throw std::invalid_argument(std::string("network.") + field + " must be an IPv6 address");
  return a;
}

bool same_prefix(const in6_addr& a, const in6_addr& b, int prefix) {
  for (int i = 0; i < 16; ++i) {
    int bits = std::clamp(prefix - 8 * i, 0, 8);
    uint8_t m = static_cast<uint8_t>(0xff00 >> bits);
    if ((a.s6_addr[i] & m) != (b.s6_addr[i] & m)) return false;
  }
  return true;
}

std::array<uint8_t, 6> parse_mac(const nlohmann::json& j) {
  std::array<uint8_t, 6> mac{};
  const char* err = "network.mac must be six hex pairs \"52:54:00:12:34:56\", unicast";
  if (!j.is_string()) throw std::invalid_argument(err);
  std::string s = j.get<std::string>();
  if (s.size() != 17) throw std::invalid_argument(err);
  for (size_t i = 0; i < 6; ++i) {
    if (i < 5 && s[i * 3 + 2] != ':') throw std::invalid_argument(err);
    if (!isxdigit(static_cast<unsigned char>(s[i * 3])) ||
        !isxdigit(static_cast<unsigned char>(s[i * 3 + 1])))
      throw std::invalid_argument(err);
    mac[i] = static_cast<uint8_t>(std::stoi(s.substr(i * 3, 2), nullptr, 16));
  }
  if (mac[0] & 1) throw std::invalid_argument(err);  // multicast bit
  return mac;
}

}  // namespace

GuestNetwork parse_guest_network(const nlohmann::json& j) {
  if (!j.is_object()) throw std::invalid_argument("network must be an object");
  GuestNetwork n;
  auto addr = j.find("address");
  if (addr == j.end() || !addr->is_string())
    throw std::invalid_argument("network.address must be \"a.b.c.d/prefix\"");
  std::string s = addr->get<std::string>();
  auto slash = s.find('/');
  if (slash == std::string::npos)
    throw std::invalid_argument("network.address must be \"a.b.c.d/prefix\"");
  n.address = parse_ip(s.substr(0, slash), "address");
  std::string p = s.substr(slash + 1);
  if (p.empty() || p.size() > 2 || !std::all_of(p.begin(), p.end(), ::isdigit) ||
      std::stoi(p) < 1 || std::stoi(p) > 32)
    throw std::invalid_argument("network.address prefix must be 1..32");
  n.prefix = std::stoi(p);
  n.gateway = parse_ip(j.value("gateway", nlohmann::json()), "gateway");
  n.dns = parse_ip(j.value("dns", nlohmann::json()), "dns");
  uint32_t m = mask_of(n.prefix).s_addr;
  if ((n.gateway.s_addr & m) != (n.address.s_addr & m))
    throw std::invalid_argument("network.gateway must be inside network.address's subnet");
  auto a6 = j.find("address6");
  if (a6 != j.end() && !a6->is_null()) {
    std::string v = a6->is_string() ? a6->get<std::string>() : "";
    auto sl = v.find('/');
    std::string pl = sl == std::string::npos ? "" : v.substr(sl + 1);
    if (pl.empty() || pl.size() > 3 || !std::all_of(pl.begin(), pl.end(), ::isdigit) ||
        std::stoi(pl) < 1 || std::stoi(pl) > 128)
      throw std::invalid_argument("network.address6 must be \"v6addr/prefix\" (prefix 1..128)");
    n.address6 = parse_ip6(v.substr(0, sl), "address6");
    n.prefix6 = std::stoi(pl);
    auto g6 = j.find("gateway6");
    if (g6 == j.end() || !g6->is_string())
      throw std::invalid_argument("network.gateway6 must be an IPv6 address");
    n.gateway6 = parse_ip6(g6->get<std::string>(), "gateway6");
    if (!same_prefix(*n.address6, n.gateway6, n.prefix6))
      throw std::invalid_argument("network.gateway6 must be inside network.address6's subnet");
  } else if (j.contains("gateway6") && !j["gateway6"].is_null()) {
    throw std::invalid_argument("network.gateway6 needs network.address6");
  }
  auto mac = j.find("mac");
  if (mac != j.end() && !mac->is_null()) n.mac = parse_mac(*mac);
  return n;
}

std::string first_nic(int wait_ms) {
  for (int waited = 0;; waited += 20) {
    std::vector<std::string> names;
    if (DIR* d = opendir("/sys/class/net")) {
      while (dirent* e = readdir(d))
        if (e->d_name[0] != '.' && std::strcmp(e->d_name, "lo") != 0) names.push_back(e->d_name);
      closedir(d);
    }
    if (!names.empty()) return *std::min_element(names.begin(), names.end());
    if (waited >= wait_ms) return "";
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

namespace {

// linux/ipv6.h's in6_ifreq (that header clashes with glibc's netinet/in.h).
struct Ifreq6 {
  in6_addr ifr6_addr;
  uint32_t ifr6_prefixlen;
  int ifr6_ifindex;
};

std::string configure_ipv6(const std::string& nic, const GuestNetwork& net) {
  // The only address on slirp's link: duplicate address detection would
  // only delay it (tentative addresses cannot be used for ~1 s).
  std::ofstream("/proc/sys/net/ipv6/conf/" + nic + "/accept_dad") << "0\n";
  int fd = socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::string("IPv6 socket: ") + strerror(errno);
  std::string err;
  unsigned idx = if_nametoindex(nic.c_str());
  Ifreq6 r{};
  r.ifr6_addr = *net.address6;
  r.ifr6_prefixlen = static_cast<uint32_t>(net.prefix6);
  r.ifr6_ifindex = static_cast<int>(idx);
  if (ioctl(fd, SIOCSIFADDR, &r) != 0 && errno != EEXIST)
    err = "SIOCSIFADDR (IPv6) " + nic + ": " + strerror(errno);
  in6_rtmsg rt{};
  rt.rtmsg_gateway = net.gateway6;
  rt.rtmsg_dst_len = 0;  // ::/0
  rt.rtmsg_metric = 1;
  rt.rtmsg_flags = RTF_UP | RTF_GATEWAY;
  rt.rtmsg_ifindex = static_cast<int>(idx);
  if (err.empty() && ioctl(fd, SIOCADDRT, &rt) != 0 && errno != EEXIST)
    err = "SIOCADDRT (IPv6) " + nic + ": " + strerror(errno);
  close(fd);
  return err;
}

}  // namespace

std::string configure_network(const std::string& nic, const GuestNetwork& net,
                              const std::string& resolv_conf) {
  if (nic.empty() || nic.size() >= IFNAMSIZ) return "no network interface";
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::string("socket: ") + strerror(errno);
  std::string err;
  auto ioc = [&](unsigned long req, void* arg, const char* what) {
    if (err.empty() && ioctl(fd, req, arg) != 0 && errno != EEXIST)
      err = std::string(what) + " " + nic + ": " + strerror(errno);
  };
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, nic.c_str(), IFNAMSIZ - 1);
  if (net.mac) {
    // Before the interface is up: not every driver takes a new MAC while up.
    ifreq hw = ifr;
    hw.ifr_hwaddr.sa_family = ARPHRD_ETHER;
    std::memcpy(hw.ifr_hwaddr.sa_data, net.mac->data(), 6);
    ioc(SIOCSIFHWADDR, &hw, "SIOCSIFHWADDR");
  }
  set_sin(&ifr.ifr_addr, net.address);
  ioc(SIOCSIFADDR, &ifr, "SIOCSIFADDR");
  set_sin(&ifr.ifr_netmask, mask_of(net.prefix));
  ioc(SIOCSIFNETMASK, &ifr, "SIOCSIFNETMASK");
  if (err.empty() && ioctl(fd, SIOCGIFFLAGS, &ifr) == 0) {
    ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
    ioc(SIOCSIFFLAGS, &ifr, "SIOCSIFFLAGS");
  }
  rtentry rt{};
  set_sin(&rt.rt_dst, in_addr{});
  set_sin(&rt.rt_genmask, in_addr{});
  set_sin(&rt.rt_gateway, net.gateway);
  rt.rt_flags = RTF_UP | RTF_GATEWAY;
  char dev[IFNAMSIZ] = {};
  std::strncpy(dev, nic.c_str(), IFNAMSIZ - 1);
  rt.rt_dev = dev;
  ioc(SIOCADDRT, &rt, "SIOCADDRT");  // EEXIST (a repeated hello) is fine
  close(fd);
  if (net.address6) {
    std::string err6 = configure_ipv6(nic, net);
    if (!err6.empty()) err += (err.empty() ? "" : "; ") + err6;
  }
  char dns[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &net.dns, dns, sizeof dns);
  std::ofstream out(resolv_conf, std::ios::trunc);
  out << "nameserver " << dns << "\n";
  if (!out && err.empty()) err = "cannot write " + resolv_conf;
  return err;
}

}  // namespace airlock::guest

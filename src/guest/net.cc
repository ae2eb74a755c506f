#include "guest/net.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <net/if.h>
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
  char dns[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &net.dns, dns, sizeof dns);
  std::ofstream out(resolv_conf, std::ios::trunc);
  out << "nameserver " << dns << "\n";
  if (!out && err.empty()) err = "cannot write " + resolv_conf;
  return err;
}

}  // namespace airlock::guest

#include "engine/net/policy.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstring>

#include "common/error.h"

namespace airlock::net {

namespace {

constexpr size_t kMaxEntries = 1024;
constexpr size_t kMaxEntryLen = 300;

bool ipv4_literal_chars(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!(std::isxdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'x' || c == 'X'))
      return false;
  }
  return true;
}

// The IPv4 part of the always-deny set, as plain v4 prefixes.
struct V4Range {
  uint32_t base;
  int len;
};
constexpr V4Range kDenyV4[] = {
    {0x00000000, 8},   // 0.0.0.0/8 "this network"
    {0x0A000000, 8},   // 10/8
    {0x64400000, 10},  // 100.64/10 CGNAT
    {0x7F000000, 8},   // loopback
    {0xA83F8110, 32},  // 168.63.129.16: Azure's wireserver (metadata, not link-local)
    {0xA9FE0000, 16},  // link-local, cloud metadata
    {0xAC100000, 12},  // 172.16/12
    {0xC0000000, 24},  // 192.0.0/24 IETF protocol assignments (DS-Lite, NAT64 discovery,
                       // Oracle's 192.0.0.192 metadata)
    {0xC0A80000, 16},  // 192.168/16
    {0xC6120000, 15},  // 198.18/15 benchmarking (RFC 2544): used as internal space
    {0xE0000000, 4},   // multicast
    {0xF0000000, 4},   // reserved + broadcast
};

Cidr v6_cidr(const char* text) {
  auto c = Cidr::parse(text);
  if (!c) abort();  // our own constant
  return *c;
}

std::vector<Cidr> build_always_deny() {
  std::vector<Cidr> out;
  for (auto& r : kDenyV4) out.push_back(Cidr{IpAddr::v4(r.base), r.len + 96});
  // ::1 before ::/96 so loopback is named as such.
  // fc00::/7 (ULA) also covers AWS's IPv6 metadata address fd00:ec2::254.
  for (const char* t : {"::1/128", "::/96", "fc00::/7", "fe80::/10",
                        // deprecated site-local; also libslirp's virtual IPv6 prefix
                        // (fec0::2 is the host's loopback through slirp)
                        "fec0::/10", "ff00::/8",
                        // Teredo: embeds a server and an (obfuscated) client IPv4
                        // address; a relay would reach them
                        "2001::/32",
                        // local-use NAT64 (RFC 8215): translates to IPv4 addresses at
                        // operator-chosen positions, so none can be checked
                        "64:ff9b:1::/48"})
    out.push_back(v6_cidr(t));
  return out;
}

// IPv6 prefixes that embed an IPv4 address the network may translate to:
// NAT64 (64:ff9b::/96, v4 in the last 32 bits) and 6to4 (2002::/16, v4 in
// bits 16..47). They are denied when the embedded address is.
std::optional<IpAddr> embedded_v4(const IpAddr& a) {
  const auto& b = a.bytes;
  static const uint8_t nat64[12] = {0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0};
  if (memcmp(b.data(), nat64, 12) == 0) return IpAddr::v4_bytes(b.data() + 12);
  if (b[0] == 0x20 && b[1] == 0x02) return IpAddr::v4_bytes(b.data() + 2);
  return std::nullopt;
}

}  // namespace

// ---- IpAddr / Cidr ----

IpAddr IpAddr::v4(uint32_t h) {
  IpAddr a;
  a.bytes[10] = a.bytes[11] = 0xff;
  a.bytes[12] = h >> 24;
  a.bytes[13] = h >> 16;
  a.bytes[14] = h >> 8;
  a.bytes[15] = h;
  return a;
}

IpAddr IpAddr::v4_bytes(const uint8_t* four) {
  IpAddr a;
  a.bytes[10] = a.bytes[11] = 0xff;
  memcpy(a.bytes.data() + 12, four, 4);
  return a;
}

IpAddr IpAddr::v6_bytes(const uint8_t* sixteen) {
  IpAddr a;
  memcpy(a.bytes.data(), sixteen, 16);
  return a;
}

bool IpAddr::is_v4() const {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return memcmp(bytes.data(), prefix, 12) == 0;
}

uint32_t IpAddr::v4_host_order() const {
  return (uint32_t(bytes[12]) << 24) | (uint32_t(bytes[13]) << 16) | (uint32_t(bytes[14]) << 8) |
         bytes[15];
}

std::optional<IpAddr> IpAddr::parse(std::string_view text) {
  if (text.empty() || text.size() > 64) return std::nullopt;
  std::string s(text);
  if (ipv4_literal_chars(s)) {
    // inet_aton itself, so the canonical form is exactly what the C library
    // (and so most guest software) would connect to. Only the characters of
    // a number reach it: inet_aton would stop at whitespace and ignore junk.
    in_addr in{};
    if (inet_aton(s.c_str(), &in) == 0) return std::nullopt;
    return v4(ntohl(in.s_addr));
  }
  if (s.find(':') != std::string::npos) {
    uint8_t buf[16];
    if (inet_pton(AF_INET6, s.c_str(), buf) != 1) return std::nullopt;
    return v6_bytes(buf);  // a mapped address lands on the IPv4 form
  }
  return std::nullopt;
}

std::string IpAddr::to_string() const {
  char buf[INET6_ADDRSTRLEN];
  if (is_v4()) {
    inet_ntop(AF_INET, bytes.data() + 12, buf, sizeof buf);
  } else {
    inet_ntop(AF_INET6, bytes.data(), buf, sizeof buf);
  }
  return buf;
}

std::optional<Cidr> Cidr::parse(std::string_view text) {
  auto slash = text.find('/');
  auto ip = IpAddr::parse(text.substr(0, slash));
  if (!ip) return std::nullopt;
  int max = ip->is_v4() ? 32 : 128;
  int len = max;
  if (slash != std::string_view::npos) {
    auto num = text.substr(slash + 1);
    if (num.empty() || num.size() > 3) return std::nullopt;
    len = 0;
    for (char c : num) {
      if (c < '0' || c > '9') return std::nullopt;
      len = len * 10 + (c - '0');
    }
    if (len > max) return std::nullopt;
  }
  Cidr c{*ip, ip->is_v4() ? len + 96 : len};
  for (int i = 0; i < 16; ++i) {  // clear host bits: canonical base
    int keep = std::clamp(c.prefix - i * 8, 0, 8);
    c.base.bytes[i] &= static_cast<uint8_t>(0xff00 >> keep);
  }
  return c;
}

Cidr Cidr::host(const IpAddr& ip) { return Cidr{ip, 128}; }

bool Cidr::contains(const IpAddr& ip) const {
  for (int i = 0; i < 16; ++i) {
    int keep = std::clamp(prefix - i * 8, 0, 8);
    if (keep == 0) return true;
    uint8_t mask = static_cast<uint8_t>(0xff00 >> keep);
    if ((ip.bytes[i] & mask) != base.bytes[i]) return false;
  }
  return true;
}

bool Cidr::overlaps(const Cidr& o) const {
  return prefix <= o.prefix ? contains(o.base) : o.contains(base);
}

std::string Cidr::to_string() const {
  bool v4 = base.is_v4() && prefix >= 96;
  return base.to_string() + "/" + std::to_string(v4 ? prefix - 96 : prefix);
}

const char* to_string(Proto p) {
  switch (p) {
    case Proto::tcp:
      return "tcp";
    case Proto::udp:
      return "udp";
    case Proto::icmp:
      return "icmp";
  }
  return "?";
}

const char* to_string(Mode m) {
  switch (m) {
    case Mode::none:
      return "none";
    case Mode::allowlist:
      return "allowlist";
    case Mode::open:
      return "open";
  }
  return "?";
}

// ---- names ----

std::optional<std::string> normalize_name(std::string_view name) {
  if (!name.empty() && name.back() == '.') name.remove_suffix(1);
  if (name.empty() || name.size() > 253) return std::nullopt;
  std::string out;
  out.reserve(name.size());
  size_t label = 0;
  for (char ch : name) {
    unsigned char c = static_cast<unsigned char>(ch);
    if (c == '.') {
      if (label == 0) return std::nullopt;  // empty label ("a..b", ".a")
      label = 0;
      out.push_back('.');
      continue;
    }
    if (c >= 'A' && c <= 'Z') c = c - 'A' + 'a';
    // Only host-name bytes: this rejects NUL, CR/LF, '%', '*', spaces, UTF-8.
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_'))
      return std::nullopt;
    if (++label > 63) return std::nullopt;
    out.push_back(static_cast<char>(c));
  }
  if (label == 0) return std::nullopt;
  return out;
}

bool is_ip_literal(std::string_view text) {
  if (!text.empty() && text.back() == '.') text.remove_suffix(1);
  return IpAddr::parse(text).has_value();
}

const std::vector<Cidr>& always_deny_ranges() {
  static const std::vector<Cidr> ranges = build_always_deny();
  return ranges;
}

std::vector<Cidr> host_addresses() {
  std::vector<Cidr> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) throw_errno("getifaddrs");
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr) continue;
    if (i->ifa_addr->sa_family == AF_INET) {
      auto* sin = reinterpret_cast<sockaddr_in*>(i->ifa_addr);
      out.push_back(Cidr::host(IpAddr::v4(ntohl(sin->sin_addr.s_addr))));
    } else if (i->ifa_addr->sa_family == AF_INET6) {
      auto* sin6 = reinterpret_cast<sockaddr_in6*>(i->ifa_addr);
      out.push_back(Cidr::host(IpAddr::v6_bytes(sin6->sin6_addr.s6_addr)));
    }
  }
  freeifaddrs(list);
  return out;
}

// ---- NetworkPolicy ----

NetworkPolicy::NetworkPolicy() = default;

bool NetworkPolicy::Rule::matches_name(const std::string& n) const {
  if (cidr) return false;
  if (!wildcard) return n == name;
  return n.size() > name.size() && n.compare(n.size() - name.size(), name.size(), name) == 0;
}

NetworkPolicy::Rule NetworkPolicy::parse_rule(const nlohmann::json& entry,
                                              const std::string& field) {
  if (!entry.is_string())
    throw Error(Errc::invalid_argument, field + " must be a string (CIDR, host name or *.domain)",
                field);
  const std::string& s = entry.get_ref<const std::string&>();
  auto bad = [&](const std::string& why) {
    std::string shown = s.size() > 80 ? s.substr(0, 80) + "..." : s;
    for (auto& c : shown)
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
    return Error(Errc::invalid_argument, field + " \"" + shown + "\": " + why, field);
  };
  if (s.empty()) throw bad("empty entry");
  if (s.size() > kMaxEntryLen) throw bad("longer than 300 characters");
  Rule r;
  if (auto c = Cidr::parse(s)) {
    r.cidr = c;
    r.text = c->to_string();
    return r;
  }
  if (s.find('/') != std::string::npos || s.find(':') != std::string::npos)
    throw bad("not a valid CIDR or IP address");
  std::string_view body = s;
  if (body.starts_with("*.")) {
    r.wildcard = true;
    body.remove_prefix(2);
  }
  if (body.find('*') != std::string_view::npos)
    throw bad("a wildcard must be the whole first label, as in *.example.com");
  if (is_ip_literal(body)) throw bad("not a valid IP address (and IP literals are not names)");
  auto n = normalize_name(body);
  if (!n)
    throw bad(
        "not a valid host name (letters, digits, '-', '_' in non-empty labels of <= 63, <= 253 "
        "in all)");
  r.name = r.wildcard ? "." + *n : *n;
  r.text = r.wildcard ? "*." + *n : *n;
  return r;
}

NetworkPolicy NetworkPolicy::parse(const nlohmann::json& j) { return parse(j, host_addresses()); }

NetworkPolicy NetworkPolicy::parse(const nlohmann::json& j, std::vector<Cidr> host_addrs) {
  if (!j.is_object())
    throw Error(Errc::invalid_argument, "network must be an object with a \"mode\"", "network");
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() != "mode" && it.key() != "allow" && it.key() != "deny")
      throw Error(Errc::invalid_argument,
                  "network has unknown field \"" + it.key() + "\" (expected mode, allow, deny)",
                  "network." + it.key());
  }
  NetworkPolicy p;
  p.host_addrs_ = std::move(host_addrs);
  auto mode = j.find("mode");
  if (mode == j.end() || !mode->is_string())
    throw Error(Errc::invalid_argument, "network.mode must be \"none\", \"allowlist\" or \"open\"",
                "network.mode");
  const auto& m = mode->get_ref<const std::string&>();
  if (m == "none") {
    p.mode_ = Mode::none;
  } else if (m == "allowlist") {
    p.mode_ = Mode::allowlist;
  } else if (m == "open") {
    p.mode_ = Mode::open;
  } else {
    throw Error(Errc::invalid_argument,
                "network.mode \"" + m.substr(0, 40) + "\" is not none, allowlist or open",
                "network.mode");
  }
  for (const char* key : {"allow", "deny"}) {
    auto list = j.find(key);
    if (list == j.end() || list->is_null()) continue;
    std::string field = std::string("network.") + key;
    if (!list->is_array()) throw Error(Errc::invalid_argument, field + " must be an array", field);
    if (list->size() > kMaxEntries)
      throw Error(Errc::invalid_argument, field + " has more than 1024 entries", field);
    if (!list->empty() && p.mode_ == Mode::none)
      throw Error(Errc::invalid_argument, field + " has no effect in mode none", field);
    if (!list->empty() && p.mode_ == Mode::open && std::string(key) == "allow")
      throw Error(Errc::invalid_argument,
                  "network.allow has no effect in mode open (everything not denied is allowed)",
                  field);
    auto& rules = std::string(key) == "allow" ? p.allow_ : p.deny_;
    for (size_t i = 0; i < list->size(); ++i) {
      std::string f = field + "[" + std::to_string(i) + "]";
      Rule r = parse_rule((*list)[i], f);
      if (r.cidr && std::string(key) == "allow") {
        auto reject = [&](const std::string& what) {
          throw Error(Errc::invalid_argument,
                      f + " \"" + r.text + "\" overlaps the always-denied " + what +
                          "; internal, loopback, link-local and the host's own addresses can "
                          "never be allowed",
                      f);
        };
        for (const auto& d : always_deny_ranges())
          if (r.cidr->overlaps(d)) reject(d.to_string());
        for (const char* t : {"64:ff9b::/96", "2002::/16"}) {
          Cidr c = *Cidr::parse(t);
          if (r.cidr->overlaps(c)) reject(std::string(t) + " (embeds IPv4 addresses)");
        }
        for (const auto& h : p.host_addrs_)
          if (r.cidr->overlaps(h)) reject("host address " + h.base.to_string());
      }
      rules.push_back(std::move(r));
    }
  }
  return p;
}

std::optional<Decision> NetworkPolicy::always_denied(const IpAddr& addr) const {
  for (const auto& d : always_deny_ranges())
    if (d.contains(addr)) return Decision{false, "always-deny " + d.to_string()};
  if (auto v4 = embedded_v4(addr)) {
    for (const auto& d : always_deny_ranges())
      if (d.contains(*v4))
        return Decision{false,
                        "always-deny " + d.to_string() + " (embedded in " + addr.to_string() + ")"};
  }
  for (const auto& h : host_addrs_)
    if (h.contains(addr)) return Decision{false, "always-deny host address " + addr.to_string()};
  return std::nullopt;
}

const NetworkPolicy::Rule* NetworkPolicy::match(const std::vector<Rule>& rules, const IpAddr* addr,
                                                const std::string* name) const {
  for (const auto& r : rules) {
    if (r.cidr && addr && r.cidr->contains(*addr)) return &r;
    if (!r.cidr && name && r.matches_name(*name)) return &r;
  }
  return nullptr;
}

Decision NetworkPolicy::decide(const IpAddr& addr, uint16_t /*port*/, Proto /*proto*/,
                               const std::string* resolved_name) const {
  if (auto d = always_denied(addr)) return *d;
  if (mode_ == Mode::none) return {false, "mode none"};
  std::optional<std::string> name;
  if (resolved_name) name = normalize_name(*resolved_name);
  const std::string* n = name ? &*name : nullptr;
  if (auto r = match(deny_, &addr, n)) return {false, "deny " + r->text};
  if (mode_ == Mode::open) return {true, "open"};
  if (auto r = match(allow_, &addr, nullptr)) return {true, "allow " + r->text};
  if (auto r = match(allow_, nullptr, n)) return {true, "allow " + r->text + " (pinned)"};
  return {false, "default deny"};
}

Decision NetworkPolicy::decide_name(std::string_view raw) const {
  if (is_ip_literal(raw)) return {false, "ip literal is not a name"};
  auto name = normalize_name(raw);
  if (!name) return {false, "invalid name"};
  if (mode_ == Mode::none) return {false, "mode none"};
  if (auto r = match(deny_, nullptr, &*name)) return {false, "deny " + r->text};
  if (mode_ == Mode::open) return {true, "open"};
  if (auto r = match(allow_, nullptr, &*name)) return {true, "allow " + r->text};
  return {false, "default deny"};
}

nlohmann::json NetworkPolicy::to_json() const {
  nlohmann::json j{{"mode", to_string(mode_)}};
  auto list = [](const std::vector<Rule>& rules) {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& r : rules) a.push_back(r.text);
    return a;
  };
  if (mode_ == Mode::allowlist) j["allow"] = list(allow_);
  if (mode_ != Mode::none) j["deny"] = list(deny_);
  return j;
}

}  // namespace airlock::net

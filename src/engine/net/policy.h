// Network egress policy of one sandbox: what the guest may reach.
//
// JSON form (the API's `network` field and the helper's control socket):
//   {"mode": "none"}                                   no network (the default)
//   {"mode": "allowlist", "allow": [...], "deny": [...]}
//   {"mode": "open", "deny": [...]}                    everything minus always-deny/deny
// Entries of allow/deny are one of
//   - an IP literal or CIDR, v4 or v6: "203.0.113.7", "203.0.113.0/24", "2001:db8::/32"
//     (IPv4 spelled any way inet_aton accepts: "2130706433", "127.1", "0x7f.0.0.1";
//     IPv4-mapped IPv6 "::ffff:1.2.3.4" is the IPv4 address)
//   - a host name "api.example.com" (case-insensitive, trailing dot ignored)
//   - a wildcard "*.example.com": any name strictly below example.com
//
// Decision order (first match wins):
//   1. the always-deny set (loopback, private, link-local/metadata, CGNAT,
//      multicast, reserved, their IPv6 counterparts and IPv4-mapped/NAT64/6to4
//      forms, and the host's own addresses), in every mode;
//   2. mode none;  3. deny entries (deny wins over allow);  4. mode open;
//   5. allow CIDRs;  6. allow names, for a connection only with the name the
//      helper's own resolver returned this IP for (see pinning.h);  7. default deny.
// Decision::rule names what decided, e.g. "always-deny 169.254.0.0/16",
// "allow 203.0.113.0/24", "allow *.example.com (pinned)", "default deny".
//
// An allow entry that overlaps the always-deny set is rejected at parse time
// (Error invalid_argument, field "network.allow[3]"): a policy never silently
// means less than it says.
//
//   auto p = NetworkPolicy::parse(json::parse(R"({"mode":"allowlist","allow":["*.a.com"]})"));
//   Decision d = p.decide(*IpAddr::parse("203.0.113.9"), 443, Proto::tcp, &name);
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace airlock::net {

// An IPv4 or IPv6 address. IPv4 is stored in its IPv4-mapped IPv6 form
// (::ffff:a.b.c.d), so "::ffff:127.0.0.1" and "127.0.0.1" are the same value.
struct IpAddr {
  std::array<uint8_t, 16> bytes{};

  // IPv4 in any inet_aton spelling (decimal, octal, hex, 1-4 parts) or IPv6
  // (inet_pton; no zone "%eth0"). nullopt for anything else.
  static std::optional<IpAddr> parse(std::string_view text);
  static IpAddr v4(uint32_t host_order);
  static IpAddr v4_bytes(const uint8_t* four);
  static IpAddr v6_bytes(const uint8_t* sixteen);

  bool is_v4() const;
  uint32_t v4_host_order() const;  // only if is_v4()
  const uint8_t* v4_ptr() const { return bytes.data() + 12; }
  std::string to_string() const;  // canonical: dotted quad or RFC 5952 v6

  auto operator<=>(const IpAddr&) const = default;
};

// A prefix. IPv4 prefixes are stored as mapped prefixes (/len + 96).
struct Cidr {
  IpAddr base;     // host bits cleared
  int prefix = 0;  // 0..128 in the mapped space

  // "a.b.c.d/n", "v6/n" or a bare address (= host prefix). nullopt if invalid.
  static std::optional<Cidr> parse(std::string_view text);
  static Cidr host(const IpAddr& ip);
  bool contains(const IpAddr& ip) const;
  bool overlaps(const Cidr& other) const;
  std::string to_string() const;  // IPv4 prefixes as "10.0.0.0/8"
  bool operator==(const Cidr&) const = default;
};

enum class Proto { tcp, udp, icmp };
const char* to_string(Proto proto);

enum class Mode { none, allowlist, open };
const char* to_string(Mode mode);

struct Decision {
  bool allowed = false;
  std::string rule;
};

// Lower-cases and validates a host name; strips one trailing dot. nullopt if
// it is not a plain DNS host name: NUL, CR/LF, '%', any byte outside
// [a-z0-9-_], empty or > 63 byte labels, > 253 bytes, or empty.
std::optional<std::string> normalize_name(std::string_view name);

// True if `text` is an IPv4 (any inet_aton spelling) or IPv6 literal: such
// strings never match domain rules.
bool is_ip_literal(std::string_view text);

// The always-deny set (without the host's addresses), for docs and tests.
const std::vector<Cidr>& always_deny_ranges();

// The addresses of this host's interfaces (getifaddrs), as host prefixes.
std::vector<Cidr> host_addresses();

class NetworkPolicy {
 public:
  // Mode none, nothing allowed.
  NetworkPolicy();

  // Parses the JSON form. `host_addrs` joins the always-deny set (defaults
  // to this host's interface addresses). Throws Error(invalid_argument) with
  // the field ("network.mode", "network.allow[3]") of the first bad entry.
  static NetworkPolicy parse(const nlohmann::json& j);
  static NetworkPolicy parse(const nlohmann::json& j, std::vector<Cidr> host_addrs);

  // Decides a connection to addr:port. `resolved_name` is the (normalised)
  // name the helper's resolver returned addr for (pinning), or null. Domain
  // rules only ever match through it, never through the address.
  Decision decide(const IpAddr& addr, uint16_t port, Proto proto,
                  const std::string* resolved_name = nullptr) const;

  // Decides a DNS question for `name` (raw, as the guest sent it): may the
  // helper resolve it? Invalid names and IP literals are denied.
  Decision decide_name(std::string_view name) const;

  // The always-deny check alone ("always-deny <range>" / "always-deny host
  // address <ip>"), nullopt if addr is not in it.
  std::optional<Decision> always_denied(const IpAddr& addr) const;

  Mode mode() const { return mode_; }
  nlohmann::json to_json() const;

 private:
  struct Rule {
    std::string text;  // as normalised, e.g. "203.0.113.0/24", "*.a.com"
    std::optional<Cidr> cidr;
    std::string name;  // exact name, or the suffix (".a.com") of a wildcard
    bool wildcard = false;
    bool matches_name(const std::string& n) const;
  };
  static Rule parse_rule(const nlohmann::json& entry, const std::string& field);
  const Rule* match(const std::vector<Rule>& rules, const IpAddr* addr,
                    const std::string* name) const;

  Mode mode_ = Mode::none;
  std::vector<Rule> allow_;
  std::vector<Rule> deny_;
  std::vector<Cidr> host_addrs_;
};

}  // namespace airlock::net

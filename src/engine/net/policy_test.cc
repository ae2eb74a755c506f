#include "engine/net/policy.h"

#include <gtest/gtest.h>

#include "common/error.h"

using namespace airlock;
using namespace airlock::net;
using nlohmann::json;

namespace {

IpAddr ip(const char* s) {
  auto a = IpAddr::parse(s);
  EXPECT_TRUE(a) << s;
  return a.value_or(IpAddr{});
}

// Host addresses are injected so tests do not depend on this machine.
NetworkPolicy pol(const char* text, std::vector<Cidr> host = {}) {
  return NetworkPolicy::parse(json::parse(text), std::move(host));
}

std::string field_of(const char* text) {
  try {
    pol(text, {Cidr::host(ip("192.0.2.77"))});
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    return e.field() + " | " + e.what();
  }
  return "accepted";
}

}  // namespace

TEST(IpAddr, CanonicalisesLikeInetAton) {
  EXPECT_EQ(ip("2130706433").to_string(), "127.0.0.1");
  EXPECT_EQ(ip("127.1").to_string(), "127.0.0.1");
  EXPECT_EQ(ip("0x7f.0.0.1").to_string(), "127.0.0.1");
  EXPECT_EQ(ip("0177.0.0.1").to_string(), "127.0.0.1");
  EXPECT_EQ(ip("0xA9.0xfe.169.254").to_string(), "169.254.169.254");
  EXPECT_EQ(ip("::ffff:127.0.0.1"), ip("127.0.0.1"));
  EXPECT_EQ(ip("::FFFF:7f00:1").to_string(), "127.0.0.1");
  EXPECT_EQ(ip("2001:DB8::1").to_string(), "2001:db8::1");
  EXPECT_FALSE(IpAddr::parse("1.2.3.4 junk"));
  EXPECT_FALSE(IpAddr::parse("256.1.1.1"));
  EXPECT_FALSE(IpAddr::parse("fe80::1%eth0"));
  EXPECT_FALSE(IpAddr::parse("example.com"));
  EXPECT_FALSE(IpAddr::parse(""));
}

TEST(Cidr, ParseContainsOverlap) {
  auto c = Cidr::parse("203.0.113.77/24");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->to_string(), "203.0.113.0/24");
  EXPECT_TRUE(c->contains(ip("203.0.113.255")));
  EXPECT_FALSE(c->contains(ip("203.0.114.0")));
  EXPECT_FALSE(c->contains(ip("2001:db8::1")));
  EXPECT_TRUE(Cidr::parse("0.0.0.0/0")->overlaps(*Cidr::parse("10.0.0.0/8")));
  EXPECT_FALSE(Cidr::parse("203.0.113.0/24")->overlaps(*Cidr::parse("10.0.0.0/8")));
  EXPECT_TRUE(Cidr::parse("2001:db8::/32")->contains(ip("2001:db8:ffff::1")));
  EXPECT_FALSE(Cidr::parse("1.2.3.4/33"));
  EXPECT_FALSE(Cidr::parse("1.2.3.4/"));
  EXPECT_FALSE(Cidr::parse("1.2.3.4/-1"));
}

TEST(Names, NormaliseAndReject) {
  EXPECT_EQ(normalize_name("WWW.Example.COM."), "www.example.com");
  EXPECT_FALSE(normalize_name("a..com"));
  EXPECT_FALSE(normalize_name(".a.com"));
  EXPECT_FALSE(normalize_name("a.com.."));
  EXPECT_FALSE(normalize_name(std::string("a\0b.com", 7)));
  EXPECT_FALSE(normalize_name("a\r\nb.com"));
  EXPECT_FALSE(normalize_name("a%2e.com"));
  EXPECT_FALSE(normalize_name(std::string(64, 'a') + ".com"));
  std::string long_name;
  for (int i = 0; i < 64; ++i) long_name += "abc.";
  long_name += "com";  // 259 chars
  EXPECT_FALSE(normalize_name(long_name));
  EXPECT_TRUE(normalize_name(std::string(63, 'a') + ".com"));
}

TEST(Policy, ParseErrorsNameTheEntry) {
  EXPECT_NE(field_of(R"({"mode":"allowlist","allow":["a.com","b.com","c.com","127.0.0.0/8"]})")
                .find("network.allow[3] |"),
            std::string::npos);
  EXPECT_NE(field_of(R"({"mode":"allowlist","allow":["2130706433"]})").find("network.allow[0]"),
            std::string::npos);
  EXPECT_NE(field_of(R"({"mode":"allowlist","allow":["0x7f.0.0.1"]})").find("127.0.0.0/8"),
            std::string::npos);
  EXPECT_NE(field_of(R"({"mode":"allowlist","allow":["0.0.0.0/0"]})").find("network.allow[0]"),
            std::string::npos);
  EXPECT_NE(
      field_of(R"({"mode":"allowlist","allow":["::ffff:169.254.169.254"]})").find("169.254.0.0/16"),
      std::string::npos);
  EXPECT_NE(field_of(R"({"mode":"allowlist","allow":["fd00::/8"]})").find("fc00::/7"),
            std::string::npos);
  EXPECT_NE(
      field_of(R"({"mode":"allowlist","allow":["192.0.2.0/24"]})").find("host address 192.0.2.77"),
      std::string::npos);
  EXPECT_NE(field_of(R"({"mode":"allowlist","allow":["a.*.com"]})").find("network.allow[0]"),
            std::string::npos);
  EXPECT_NE(field_of(R"({"mode":"allowlist","allow":["bad%name.com"]})").find("not a valid"),
            std::string::npos);
  EXPECT_NE(field_of(R"({"mode":"allowlist","deny":[7]})").find("network.deny[0]"),
            std::string::npos);
  EXPECT_NE(field_of(R"({"mode":"sometimes"})").find("network.mode"), std::string::npos);
  EXPECT_NE(field_of(R"({"mode":"open","allow":["a.com"]})").find("network.allow"),
            std::string::npos);
  EXPECT_NE(field_of(R"({"mode":"none","extra":1})").find("network.extra"), std::string::npos);
  EXPECT_EQ(field_of(R"({"mode":"open","deny":["10.0.0.0/8","*.evil.com"]})"), "accepted");
}

TEST(Policy, AlwaysDenyInEveryMode) {
  auto open = pol(R"({"mode":"open"})", {Cidr::host(ip("192.0.2.77"))});
  for (const char* a : {"127.0.0.1",       "2130706433", "127.1",           "0x7f.0.0.1",
                        "169.254.169.254", "10.1.2.3",   "172.16.0.1",      "172.31.255.255",
                        "192.168.1.1",     "100.64.0.1", "0.0.0.0",         "224.0.0.1",
                        "255.255.255.255", "::1",        "fd12::1",         "fe80::1",
                        "::ffff:10.0.0.1", "fec0::2",    "64:ff9b::7f00:1", "2002:a9fe:a9fe::1",
                        "192.0.2.77"}) {
    auto d = open.decide(ip(a), 80, Proto::tcp);
    EXPECT_FALSE(d.allowed) << a;
    EXPECT_TRUE(d.rule.starts_with("always-deny")) << a << " " << d.rule;
  }
  EXPECT_EQ(open.decide(ip("169.254.169.254"), 80, Proto::tcp).rule, "always-deny 169.254.0.0/16");
  EXPECT_EQ(open.decide(ip("192.0.2.77"), 80, Proto::tcp).rule,
            "always-deny host address 192.0.2.77");
  EXPECT_TRUE(open.decide(ip("203.0.113.5"), 80, Proto::tcp).allowed);
  EXPECT_TRUE(open.decide(ip("2001:db8::5"), 80, Proto::udp).allowed);
  EXPECT_TRUE(open.decide(ip("64:ff9b::cb00:7105"), 80, Proto::tcp).allowed);  // NAT64 of public
}

// Issue 9: ranges review found missing, each with the rule that must name it,
// in every mode and refused as an allow entry.
TEST(Policy, AlwaysDenyReviewGaps) {
  auto open = pol(R"({"mode":"open"})");
  struct Case {
    const char* addr;
    const char* rule;
  };
  for (const Case& c : std::initializer_list<Case>{
           {"192.0.0.1", "always-deny 192.0.0.0/24"},
           {"192.0.0.170", "always-deny 192.0.0.0/24"},  // NAT64 discovery
           {"192.0.0.192", "always-deny 192.0.0.0/24"},  // Oracle's metadata
           {"198.18.0.1", "always-deny 198.18.0.0/15"},
           {"198.19.255.254", "always-deny 198.18.0.0/15"},
           {"2001::1", "always-deny 2001::/32"},
           {"2001:0:4136:e378:8000:63bf:3fff:fdd2", "always-deny 2001::/32"},  // Teredo
           {"64:ff9b:1::a00:1", "always-deny 64:ff9b:1::/48"},
           {"64:ff9b:1:ffff::1", "always-deny 64:ff9b:1::/48"},
           {"168.63.129.16", "always-deny 168.63.129.16/32"},  // Azure wireserver
           {"::ffff:168.63.129.16", "always-deny 168.63.129.16/32"},
           {"64:ff9b::a83f:8110", "always-deny 168.63.129.16/32 (embedded in 64:ff9b::a83f:8110)"},
           {"fd00:ec2::254", "always-deny fc00::/7"},         // AWS IMDS over IPv6
           {"100.100.100.200", "always-deny 100.64.0.0/10"},  // Alibaba's metadata
           {"169.254.0.23", "always-deny 169.254.0.0/16"},    // Tencent's metadata
       }) {
    auto d = open.decide(ip(c.addr), 80, Proto::tcp);
    EXPECT_FALSE(d.allowed) << c.addr;
    EXPECT_EQ(d.rule, c.rule) << c.addr;
    std::string allow = std::string(R"({"mode":"allowlist","allow":[")") + c.addr + R"("]})";
    EXPECT_NE(field_of(allow.c_str()).find("network.allow[0]"), std::string::npos) << c.addr;
  }
  // Neighbours stay public: the documentation ranges the tests use, the
  // edges of the new ranges, and 2001:db8::/32 beside Teredo.
  for (const char* a : {"192.0.1.1", "192.0.2.1", "198.17.255.255", "198.20.0.1", "198.51.100.1",
                        "168.63.129.17", "2001:1::1", "2001:db8::1", "64:ff9b:2::1"})
    EXPECT_TRUE(open.decide(ip(a), 80, Proto::tcp).allowed) << a;
}

TEST(Policy, AllowlistCidrsNamesAndDenyWins) {
  auto p = pol(R"({"mode":"allowlist",
                   "allow":["203.0.113.0/28","2001:db8:1::/48","api.example.com","*.wild.example"],
                   "deny":["203.0.113.8/29","bad.wild.example"]})");
  EXPECT_EQ(p.decide(ip("203.0.113.1"), 80, Proto::tcp).rule, "allow 203.0.113.0/28");
  EXPECT_EQ(p.decide(ip("203.0.113.9"), 80, Proto::tcp).rule, "deny 203.0.113.8/29");
  EXPECT_EQ(p.decide(ip("203.0.113.16"), 80, Proto::tcp).rule, "default deny");
  EXPECT_TRUE(p.decide(ip("2001:db8:1::80"), 443, Proto::tcp).allowed);
  EXPECT_FALSE(p.decide(ip("2001:db8:2::80"), 443, Proto::tcp).allowed);
  std::string api = "api.example.com", sib = "www.example.com", w = "x.wild.example",
              bad = "bad.wild.example";
  auto other = ip("198.51.100.7");
  EXPECT_EQ(p.decide(other, 443, Proto::tcp, &api).rule, "allow api.example.com (pinned)");
  EXPECT_EQ(p.decide(other, 443, Proto::tcp, &sib).rule, "default deny");
  EXPECT_EQ(p.decide(other, 443, Proto::tcp, &w).rule, "allow *.wild.example (pinned)");
  EXPECT_EQ(p.decide(other, 443, Proto::tcp, &bad).rule, "deny bad.wild.example");
  EXPECT_FALSE(p.decide(ip("127.0.0.1"), 443, Proto::tcp, &api).allowed);

  EXPECT_TRUE(p.decide_name("API.Example.com.").allowed);
  EXPECT_FALSE(p.decide_name("example.com").allowed);
  EXPECT_TRUE(p.decide_name("a.b.wild.example").allowed);
  EXPECT_FALSE(p.decide_name("wild.example").allowed);
  EXPECT_FALSE(p.decide_name("evilwild.example").allowed);
  EXPECT_EQ(p.decide_name("bad.wild.example").rule, "deny bad.wild.example");
  EXPECT_EQ(p.decide_name("203.0.113.1").rule, "ip literal is not a name");
  EXPECT_EQ(p.decide_name("2130706433").rule, "ip literal is not a name");
  EXPECT_EQ(p.decide_name(std::string("api.example.com\0.evil", 21)).rule, "invalid name");
}

TEST(Policy, NoneDeniesAndJsonRoundTrips) {
  auto none = pol(R"({"mode":"none"})");
  EXPECT_EQ(none.decide(ip("203.0.113.1"), 80, Proto::tcp).rule, "mode none");
  EXPECT_FALSE(none.decide_name("example.com").allowed);
  auto p = pol(R"({"mode":"allowlist","allow":["203.0.113.7","*.A.com."],"deny":["B.a.com"]})");
  EXPECT_EQ(p.to_json().dump(),
            R"({"allow":["203.0.113.7/32","*.a.com"],"deny":["b.a.com"],"mode":"allowlist"})");
  auto again = NetworkPolicy::parse(p.to_json(), {});
  EXPECT_EQ(again.to_json(), p.to_json());
}

TEST(Policy, HostAddressesAreFound) {
  auto addrs = host_addresses();
  bool loopback = false;
  for (auto& a : addrs) loopback |= a.base == ip("127.0.0.1");
  EXPECT_TRUE(loopback);
}

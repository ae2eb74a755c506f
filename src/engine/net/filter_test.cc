#include "engine/net/filter.h"

#include <gtest/gtest.h>

#include <random>

#include "common/error.h"
#include "engine/net/helper.h"

using namespace airlock;
using namespace airlock::net;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

IpAddr ip(const char* s) { return *IpAddr::parse(s); }

struct Rig {
  std::chrono::steady_clock::time_point now{};
  std::vector<json> events;
  Filter filter;
  explicit Rig(const char* policy, FilterConfig cfg = {})
      : filter(
            NetworkPolicy::parse(json::parse(policy), {}), cfg,
            [this](json j) { events.push_back(std::move(j)); }, [this] { return now; }) {}
  Endpoint guest(uint16_t port = 40000, const char* a = "10.0.2.15") {
    return {{0x52, 0x54, 0, 0x12, 0x34, 0x56}, ip(a), port};
  }
  Endpoint remote(const char* a, uint16_t port = 80) {
    return {{0x52, 0x55, 0x0a, 0, 2, 2}, ip(a), port};
  }
  std::vector<json> of(const std::string& type) {
    std::vector<json> out;
    for (auto& e : events)
      if (e["event"] == type) out.push_back(e);
    return out;
  }
};

// A TCP segment with payload (lengths fixed up; checksums do not matter here).
std::vector<uint8_t> tcp_data(const Endpoint& from, const Endpoint& to, uint32_t seq, uint32_t ack,
                              uint8_t flags, size_t payload) {
  auto f = make_tcp(from, to, seq, ack, flags);
  f.insert(f.end(), payload, 'x');
  size_t l3 = f.size() - 14;
  if (from.ip.is_v4()) {
    f[16] = l3 >> 8;
    f[17] = l3 & 0xff;
  } else {
    f[18] = (l3 - 40) >> 8;
    f[19] = (l3 - 40) & 0xff;
  }
  return f;
}

std::vector<uint8_t> dns_query(const std::string& name, uint16_t qtype) {
  std::vector<uint8_t> q = {0xab, 0xcd, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0};
  size_t start = 0;
  while (start <= name.size()) {
    size_t dot = std::min(name.find('.', start), name.size());
    q.push_back(static_cast<uint8_t>(dot - start));
    q.insert(q.end(), name.begin() + start, name.begin() + dot);
    start = dot + 1;
  }
  q.insert(q.end(), {0, uint8_t(qtype >> 8), uint8_t(qtype), 0, 1});
  return q;
}

}  // namespace

TEST(Filter, DeniedSynGetsImmediateRst) {
  Rig r(R"({"mode":"open"})");
  for (const char* dst : {"169.254.169.254", "10.0.2.2", "127.0.0.1", "192.168.0.1"}) {
    auto out = r.filter.from_guest(make_tcp(r.guest(), r.remote(dst), 1000, 0, kTcpSyn));
    EXPECT_FALSE(out.to_slirp) << dst;
    ASSERT_EQ(out.to_guest.size(), 1u);
    auto rst = parse_frame(out.to_guest[0]);
    ASSERT_TRUE(rst);
    EXPECT_EQ(rst->src, ip(dst));
    EXPECT_EQ(rst->dst, ip("10.0.2.15"));
    EXPECT_EQ(rst->sport, 80);
    EXPECT_EQ(rst->dport, 40000);
    EXPECT_EQ(rst->tcp_flags, kTcpRst | kTcpAck);
    EXPECT_EQ(rst->ack, 1001u);
  }
  auto ev = r.of("net_flow");
  ASSERT_EQ(ev.size(), 4u);
  EXPECT_EQ(ev[0]["rule"], "always-deny 169.254.0.0/16");
  EXPECT_EQ(ev[0]["allowed"], false);
  EXPECT_EQ(ev[0]["port"], 80);
  EXPECT_EQ(r.filter.flow_count(), 0u);
}

TEST(Filter, AllowedTcpFlowIsPassedCountedAndClosed) {
  Rig r(R"({"mode":"allowlist","allow":["198.51.100.0/28"]})");
  auto g = r.guest();
  auto s = r.remote("198.51.100.10");
  EXPECT_TRUE(r.filter.from_guest(make_tcp(g, s, 100, 0, kTcpSyn)).to_slirp);
  r.filter.from_net(make_tcp(s, g, 5000, 101, kTcpSyn | kTcpAck));
  EXPECT_TRUE(r.filter.from_guest(make_tcp(g, s, 101, 5001, kTcpAck)).to_slirp);
  EXPECT_TRUE(r.filter.from_guest(tcp_data(g, s, 101, 5001, kTcpAck | kTcpPsh, 120)).to_slirp);
  r.filter.from_net(tcp_data(s, g, 5001, 221, kTcpAck | kTcpPsh, 3000));
  r.now += 1500ms;
  r.filter.from_net(make_tcp(s, g, 8001, 221, kTcpFin | kTcpAck));
  EXPECT_TRUE(r.filter.from_guest(make_tcp(g, s, 221, 8002, kTcpFin | kTcpAck)).to_slirp);
  // The last ACK still passes while the closed flow lingers.
  EXPECT_TRUE(r.filter.from_guest(make_tcp(g, s, 222, 8002, kTcpAck)).to_slirp);
  auto end = r.of("net_flow_end");
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0]["bytes_out"], 120);
  EXPECT_EQ(end[0]["bytes_in"], 3000);
  EXPECT_EQ(end[0]["duration_ms"], 1500);
  EXPECT_EQ(end[0]["reason"], "fin");
  EXPECT_EQ(end[0]["rule"], "allow 198.51.100.0/28");
  r.now += 11s;
  r.filter.tick();
  EXPECT_EQ(r.filter.flow_count(), 0u);
  // Neighbour outside the CIDR: reset.
  auto out = r.filter.from_guest(make_tcp(g, r.remote("198.51.100.20"), 1, 0, kTcpSyn));
  EXPECT_FALSE(out.to_slirp);
  EXPECT_EQ(out.to_guest.size(), 1u);
}

TEST(Filter, SegmentOfNoFlowIsResetNotPassed) {
  Rig r(R"({"mode":"open"})");
  auto out = r.filter.from_guest(make_tcp(r.guest(), r.remote("203.0.113.1"), 7, 9, kTcpAck));
  EXPECT_FALSE(out.to_slirp);
  ASSERT_EQ(out.to_guest.size(), 1u);
  auto rst = parse_frame(out.to_guest[0]);
  EXPECT_EQ(rst->tcp_flags, kTcpRst);
  EXPECT_EQ(rst->seq, 9u);
  // A RST of no flow is dropped silently.
  out = r.filter.from_guest(make_tcp(r.guest(), r.remote("203.0.113.1"), 7, 9, kTcpRst));
  EXPECT_FALSE(out.to_slirp);
  EXPECT_TRUE(out.to_guest.empty());
}

TEST(Filter, DeniedUdpAndIcmpGetUnreachable) {
  Rig r(R"({"mode":"allowlist","allow":["198.51.100.0/28"]})");
  std::vector<uint8_t> payload(20, 1);
  auto out = r.filter.from_guest(make_udp(r.guest(5000), r.remote("198.51.100.20", 123), payload));
  EXPECT_FALSE(out.to_slirp);
  ASSERT_EQ(out.to_guest.size(), 1u);
  auto icmp = parse_frame(out.to_guest[0]);
  ASSERT_TRUE(icmp);
  EXPECT_EQ(icmp->l4, kIpICMP);
  EXPECT_EQ(icmp->icmp_type, 3);
  EXPECT_EQ(icmp->icmp_code, 13);
  EXPECT_EQ(icmp->src, ip("198.51.100.20"));
  EXPECT_EQ(icmp->dst, ip("10.0.2.15"));
  // Allowed UDP passes; its replies are counted.
  out = r.filter.from_guest(make_udp(r.guest(5000), r.remote("198.51.100.10", 123), payload));
  EXPECT_TRUE(out.to_slirp);
  r.filter.from_net(make_udp(r.remote("198.51.100.10", 123), r.guest(5000), payload));
  // ICMP echo: denied → unreachable, allowed → passed.
  out = r.filter.from_guest(make_icmp_echo(r.guest(), r.remote("198.51.100.20"), false, 7, 1));
  EXPECT_FALSE(out.to_slirp);
  ASSERT_EQ(out.to_guest.size(), 1u);
  EXPECT_EQ(parse_frame(out.to_guest[0])->icmp_type, 3);
  out = r.filter.from_guest(make_icmp_echo(r.guest(), r.remote("198.51.100.10"), false, 7, 1));
  EXPECT_TRUE(out.to_slirp);
  r.now += 61s;
  r.filter.tick();
  auto end = r.of("net_flow_end");
  ASSERT_EQ(end.size(), 2u);
  EXPECT_EQ(end[1]["proto"], "udp");
  EXPECT_EQ(end[1]["bytes_in"], 20);
  EXPECT_EQ(end[1]["reason"], "idle");
}

TEST(Filter, Ipv6LiteralsDecidedToo) {
  Rig r(R"({"mode":"allowlist","allow":["2001:db8:1::/48"]})");
  Endpoint g{{0x52, 0x54, 0, 0x12, 0x34, 0x56}, ip("fec0::15"), 40000};
  Endpoint ok{{0x52, 0x55, 0x0a, 0, 2, 2}, ip("2001:db8:1::80"), 80};
  Endpoint bad{{0x52, 0x55, 0x0a, 0, 2, 2}, ip("fe80::1"), 80};
  EXPECT_TRUE(r.filter.from_guest(make_tcp(g, ok, 1, 0, kTcpSyn)).to_slirp);
  auto out = r.filter.from_guest(make_tcp(g, bad, 1, 0, kTcpSyn));
  EXPECT_FALSE(out.to_slirp);
  ASSERT_EQ(out.to_guest.size(), 1u);
  EXPECT_TRUE(parse_frame(out.to_guest[0])->ipv6);
  out = r.filter.from_guest(make_icmp_echo(g, bad, false, 3, 1));
  ASSERT_EQ(out.to_guest.size(), 1u);
  EXPECT_EQ(parse_frame(out.to_guest[0])->icmp_type, 1);  // ICMPv6 unreachable
}

TEST(Filter, DnsDeniedNamesNxdomainAllowedPinnedRebindingDropped) {
  Rig r(R"({"mode":"allowlist","allow":["*.example.com"]})");
  Endpoint dns{{0x52, 0x55, 0x0a, 0, 2, 2}, ip("10.0.2.3"), 53};
  // A random subdomain of a zone that is not allowed: answered here, NXDOMAIN.
  auto out = r.filter.from_guest(make_udp(r.guest(3333), dns, dns_query("k3j4h5.evil.test", 1)));
  EXPECT_FALSE(out.to_slirp);
  EXPECT_FALSE(out.resolve);
  ASSERT_EQ(out.to_guest.size(), 1u);
  auto reply = parse_frame(out.to_guest[0]);
  EXPECT_EQ(reply->src, ip("10.0.2.3"));
  EXPECT_EQ(reply->sport, 53);
  EXPECT_EQ(reply->dport, 3333);
  EXPECT_EQ(out.to_guest[0][reply->payload_off + 3] & 0xF, 3);  // NXDOMAIN
  EXPECT_EQ(r.of("net_dns").back()["name"], "k3j4h5.evil.test");
  EXPECT_EQ(r.of("net_dns").back()["rcode"], "NXDOMAIN");

  out = r.filter.from_guest(make_udp(r.guest(3334), dns, dns_query("WWW.example.com", 1)));
  ASSERT_TRUE(out.resolve);
  EXPECT_EQ(out.resolve->name, "www.example.com");
  Resolution res{Rcode::noerror, {{ip("203.0.113.10"), 60}, {ip("127.0.0.1"), 60}}, ""};
  auto ans = r.filter.dns_resolved(*out.resolve, res);
  auto af = parse_frame(ans);
  auto parsed =
      parse_upstream_answer(std::span(ans.data() + af->payload_off, af->payload_len), kTypeA);
  ASSERT_EQ(parsed.addrs.size(), 1u);
  EXPECT_EQ(parsed.addrs[0].ip, ip("203.0.113.10"));
  auto ev = r.of("net_dns").back();
  EXPECT_EQ(ev["answers"], json::array({"203.0.113.10"}));
  EXPECT_EQ(ev["dropped"][0]["ip"], "127.0.0.1");
  EXPECT_EQ(ev["dropped"][0]["rule"], "always-deny 127.0.0.0/8");

  // The pinned IP is reachable, by the wildcard; its neighbour is not.
  EXPECT_TRUE(
      r.filter.from_guest(make_tcp(r.guest(), r.remote("203.0.113.10"), 1, 0, kTcpSyn)).to_slirp);
  auto flow = r.of("net_flow").back();
  EXPECT_EQ(flow["name"], "www.example.com");
  EXPECT_EQ(flow["rule"], "allow *.example.com (pinned)");
  EXPECT_FALSE(
      r.filter.from_guest(make_tcp(r.guest(), r.remote("203.0.113.11"), 1, 0, kTcpSyn)).to_slirp);
  // TXT for an allowed name: NOERROR, no records, nothing resolved upstream.
  out = r.filter.from_guest(make_udp(r.guest(3335), dns, dns_query("www.example.com", 16)));
  EXPECT_FALSE(out.resolve);
  ASSERT_EQ(out.to_guest.size(), 1u);
  // Malformed DNS: FORMERR.
  std::vector<uint8_t> junk = {0x11, 0x22, 0x01, 0x00, 0, 1, 0, 0};
  out = r.filter.from_guest(make_udp(r.guest(3336), dns, junk));
  ASSERT_EQ(out.to_guest.size(), 1u);
  auto jf = parse_frame(out.to_guest[0]);
  EXPECT_EQ(out.to_guest[0][jf->payload_off + 3] & 0xF, 1);
}

TEST(Filter, PolicyChangeCutsFlowsBothWays) {
  Rig r(R"({"mode":"allowlist","allow":["198.51.100.0/28","203.0.113.0/24"]})");
  auto g = r.guest();
  auto s = r.remote("198.51.100.10");
  r.filter.from_guest(make_tcp(g, s, 100, 0, kTcpSyn));
  r.filter.from_net(make_tcp(s, g, 5000, 101, kTcpSyn | kTcpAck));
  r.filter.from_guest(tcp_data(g, s, 101, 5001, kTcpAck, 10));
  r.filter.from_guest(make_tcp(g, r.remote("203.0.113.5"), 1, 0, kTcpSyn));
  ASSERT_EQ(r.filter.flow_count(), 2u);
  auto cut = r.filter.set_policy(
      NetworkPolicy::parse(json::parse(R"({"mode":"allowlist","allow":["203.0.113.0/24"]})"), {}));
  EXPECT_EQ(r.filter.flow_count(), 1u);
  ASSERT_EQ(cut.to_guest.size(), 1u);
  ASSERT_EQ(cut.to_slirp.size(), 1u);
  auto to_guest = parse_frame(cut.to_guest[0]);
  EXPECT_EQ(to_guest->tcp_flags, kTcpRst);
  EXPECT_EQ(to_guest->seq, 5001u);  // what the guest acknowledged last
  EXPECT_EQ(to_guest->src, ip("198.51.100.10"));
  auto to_net = parse_frame(cut.to_slirp[0]);
  EXPECT_EQ(to_net->seq, 101u);  // what slirp acknowledged last
  EXPECT_EQ(to_net->src, ip("10.0.2.15"));
  auto end = r.of("net_flow_end").back();
  EXPECT_EQ(end["reason"], "policy");
  EXPECT_EQ(end["rule"], "default deny");
  // Later segments of the cut flow are reset, not passed.
  EXPECT_FALSE(r.filter.from_guest(tcp_data(g, s, 111, 5001, kTcpAck, 10)).to_slirp);
}

TEST(Filter, SynFloodIsBoundedAndEventsRateLimited) {
  FilterConfig cfg;
  cfg.max_flows = 16;
  cfg.events_per_second = 10;
  Rig r(R"({"mode":"open"})", cfg);
  size_t passed = 0;
  for (uint16_t p = 1; p <= 2000; ++p) {
    auto out = r.filter.from_guest(make_tcp(r.guest(p), r.remote("203.0.113.9"), p, 0, kTcpSyn));
    passed += out.to_slirp;
    if (!out.to_slirp) {
      EXPECT_EQ(out.to_guest.size(), 1u);
    }
  }
  EXPECT_EQ(passed, 16u);
  EXPECT_EQ(r.filter.flow_count(), 16u);
  EXPECT_LT(r.events.size(), 40u);
  r.now += 2s;
  r.filter.from_guest(make_tcp(r.guest(9), r.remote("169.254.169.254"), 1, 0, kTcpSyn));
  auto sup = r.of("net_suppressed");
  ASSERT_EQ(sup.size(), 1u);
  EXPECT_GT(sup[0]["count"].get<int>(), 1900);
  // Half-open flows expire and free the table.
  r.now += 31s;
  r.filter.tick();
  EXPECT_EQ(r.filter.flow_count(), 0u);
}

TEST(Filter, PendingHandshakesAreCapped) {
  FilterConfig cfg;
  cfg.max_pending_tcp = 4;
  Rig r(R"({"mode":"open"})", cfg);
  auto s = r.remote("203.0.113.9");
  for (uint16_t p = 1; p <= 4; ++p)
    EXPECT_TRUE(r.filter.from_guest(make_tcp(r.guest(p), s, 1, 0, kTcpSyn)).to_slirp);
  EXPECT_FALSE(r.filter.from_guest(make_tcp(r.guest(5), s, 1, 0, kTcpSyn)).to_slirp);
  EXPECT_EQ(r.of("net_flow").back()["rule"], "too many pending connections");
  // One handshake completes: room for a new one.
  r.filter.from_net(make_tcp(s, r.guest(1), 50, 2, kTcpSyn | kTcpAck));
  r.filter.from_guest(make_tcp(r.guest(1), s, 2, 51, kTcpAck));
  EXPECT_TRUE(r.filter.from_guest(make_tcp(r.guest(6), s, 1, 0, kTcpSyn)).to_slirp);
}

TEST(Filter, SlirpServicesPassAndJunkIsDropped) {
  Rig r(R"({"mode":"allowlist","allow":["203.0.113.0/24"]})");
  std::vector<uint8_t> arp(42, 0);
  arp[12] = 0x08;
  arp[13] = 0x06;
  EXPECT_TRUE(r.filter.from_guest(arp).to_slirp);
  std::vector<uint8_t> dhcp(300, 0);
  Endpoint bcast{{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, ip("255.255.255.255"), 67};
  EXPECT_TRUE(r.filter.from_guest(make_udp(r.guest(68, "0.0.0.0"), bcast, dhcp)).to_slirp);
  // Fragments are dropped (no ports to decide on).
  auto frag = make_udp(r.guest(5000), r.remote("203.0.113.9", 53), dhcp);
  frag[20] = 0x20;  // MF
  EXPECT_FALSE(r.filter.from_guest(frag).to_slirp);
  std::mt19937 rng(7);
  for (int i = 0; i < 20000; ++i) {
    auto f = make_tcp(r.guest(i), r.remote("203.0.113.9"), i, 0, kTcpSyn);
    int flips = 1 + rng() % 6;
    for (int k = 0; k < flips; ++k) f[rng() % f.size()] = static_cast<uint8_t>(rng());
    f.resize(rng() % (f.size() + 4));
    r.filter.from_guest(f);
    r.filter.from_net(f);
  }
  EXPECT_LE(r.filter.flow_count(), FilterConfig{}.max_flows);
}

// Issue 9: libslirp opens a host socket for a 68->67 datagram to any address
// but its own and the broadcast, so only those two skip the policy.
TEST(Filter, DhcpCarveOutOnlyForSlirpAndBroadcast) {
  Rig r(R"({"mode":"allowlist","allow":["203.0.113.0/24"]})");
  std::vector<uint8_t> dhcp(300, 0);
  Endpoint bcast{{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, ip("255.255.255.255"), 67};
  EXPECT_TRUE(r.filter.from_guest(make_udp(r.guest(68, "0.0.0.0"), bcast, dhcp)).to_slirp);
  EXPECT_TRUE(r.filter.from_guest(make_udp(r.guest(68), r.remote("10.0.2.2", 67), dhcp)).to_slirp);
  EXPECT_TRUE(r.events.empty()) << "slirp's own DHCP is no flow";
  // Anywhere else it is a UDP flow like any other: denied ones never reach slirp.
  for (const char* dst :
       {"198.51.100.7", "10.0.2.255", "10.0.2.3", "169.254.169.254", "10.1.2.3"}) {
    auto out = r.filter.from_guest(make_udp(r.guest(68), r.remote(dst, 67), dhcp));
    EXPECT_FALSE(out.to_slirp) << dst;
    ASSERT_EQ(out.to_guest.size(), 1u) << dst;
    EXPECT_EQ(parse_frame(out.to_guest[0])->icmp_type, 3) << dst;
    auto flow = r.of("net_flow").back();
    EXPECT_EQ(flow["dst"], dst);
    EXPECT_EQ(flow["port"], 67);
    EXPECT_EQ(flow["allowed"], false);
  }
  EXPECT_EQ(r.of("net_flow").back()["rule"], "always-deny 10.0.0.0/8");
  // An allowed destination is an allowed, tracked flow (recorded).
  auto out = r.filter.from_guest(make_udp(r.guest(68), r.remote("203.0.113.9", 67), dhcp));
  EXPECT_TRUE(out.to_slirp);
  EXPECT_EQ(r.of("net_flow").back()["rule"], "allow 203.0.113.0/24");
  EXPECT_EQ(r.filter.flow_count(), 1u);
}

TEST(StreamDecoder, SplitsLengthPrefixedFrames) {
  StreamDecoder d;
  std::vector<uint8_t> s = {0, 0, 0, 3, 'a', 'b', 'c', 0, 0, 0, 1};
  d.append(s.data(), s.size());
  auto f = d.next();
  ASSERT_TRUE(f);
  EXPECT_EQ(*f, (std::vector<uint8_t>{'a', 'b', 'c'}));
  EXPECT_FALSE(d.next());
  uint8_t z = 'z';
  d.append(&z, 1);
  EXPECT_EQ(*d.next(), std::vector<uint8_t>{'z'});
  std::vector<uint8_t> bad = {0x7f, 0, 0, 0};
  d.append(bad.data(), bad.size());
  EXPECT_THROW(d.next(), Error);
}

TEST(Filter, InboundPortForwardFlowsPassOnlyForForwardedPorts) {
  Rig r(R"({"mode":"allowlist","allow":["198.51.100.10"]})");
  auto host = r.remote("10.0.2.2", 51000);  // slirp's alias for the host
  auto g = r.guest(8080);
  // Not forwarded: the guest's SYN-ACK to slirp's SYN is answered with a RST.
  EXPECT_TRUE(r.filter.from_net(make_tcp(host, g, 7000, 0, kTcpSyn)));
  auto out = r.filter.from_guest(make_tcp(g, host, 100, 7001, kTcpSyn | kTcpAck));
  EXPECT_FALSE(out.to_slirp);
  ASSERT_EQ(out.to_guest.size(), 1u);
  EXPECT_EQ(r.filter.flow_count(), 0u);

  r.filter.add_inbound(8080, 40123);
  auto h2 = r.remote("10.0.2.2", 51001);
  EXPECT_TRUE(r.filter.from_net(make_tcp(h2, g, 9000, 0, kTcpSyn)));
  EXPECT_TRUE(r.filter.from_guest(make_tcp(g, h2, 500, 9001, kTcpSyn | kTcpAck)).to_slirp);
  r.filter.from_net(tcp_data(h2, g, 9001, 501, kTcpAck | kTcpPsh, 10));
  EXPECT_TRUE(r.filter.from_guest(tcp_data(g, h2, 501, 9011, kTcpAck | kTcpPsh, 30)).to_slirp);
  auto ev = r.of("net_flow");
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0]["direction"], "in");
  EXPECT_EQ(ev[0]["port"], 8080);
  EXPECT_EQ(ev[0]["host_port"], 40123);
  EXPECT_EQ(ev[0]["rule"], "port 127.0.0.1:40123");
  EXPECT_EQ(ev[0]["allowed"], true);
  // Egress policy changes leave inbound flows alone...
  auto cut = r.filter.set_policy(NetworkPolicy::parse(json::parse(R"({"mode":"allowlist"})"), {}));
  EXPECT_TRUE(cut.to_guest.empty());
  EXPECT_EQ(r.filter.flow_count(), 1u);
  // ...removing the forward cuts them, both ways.
  cut = r.filter.remove_inbound(8080);
  ASSERT_EQ(cut.to_guest.size(), 1u);
  ASSERT_EQ(cut.to_slirp.size(), 1u);
  auto rst = parse_frame(cut.to_guest[0]);
  ASSERT_TRUE(rst);
  EXPECT_EQ(rst->seq, 9011u);  // the sequence number the guest expects next (RFC 5961)
  auto end = r.of("net_flow_end");
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0]["reason"], "port closed");
  EXPECT_EQ(end[0]["bytes_in"], 10);
  EXPECT_EQ(end[0]["bytes_out"], 30);
  EXPECT_EQ(r.filter.flow_count(), 0u);
  // Gone: a new SYN to the port is no flow of ours.
  r.filter.from_net(make_tcp(h2, g, 12000, 0, kTcpSyn));
  EXPECT_EQ(r.filter.flow_count(), 0u);
}

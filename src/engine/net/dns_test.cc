#include "engine/net/dns.h"

#include <gtest/gtest.h>

#include <random>

using namespace airlock::net;

namespace {

// A query as a stub resolver sends it.
std::vector<uint8_t> query(const std::string& name, uint16_t qtype, uint16_t id = 0x1234,
                           uint16_t qclass = 1) {
  std::vector<uint8_t> q = {uint8_t(id >> 8), uint8_t(id), 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0};
  size_t start = 0;
  while (start <= name.size()) {
    size_t dot = name.find('.', start);
    if (dot == std::string::npos) dot = name.size();
    q.push_back(static_cast<uint8_t>(dot - start));
    q.insert(q.end(), name.begin() + start, name.begin() + dot);
    start = dot + 1;
  }
  q.push_back(0);
  q.push_back(qtype >> 8);
  q.push_back(qtype & 0xff);
  q.push_back(qclass >> 8);
  q.push_back(qclass & 0xff);
  return q;
}

}  // namespace

TEST(Dns, ParsesPlainQuery) {
  Rcode err;
  auto pkt = query("WWW.example.com", kTypeAAAA);
  auto q = parse_query(pkt, &err);
  ASSERT_TRUE(q);
  EXPECT_EQ(q->id, 0x1234);
  EXPECT_EQ(q->qname, "WWW.example.com");
  EXPECT_EQ(q->qtype, kTypeAAAA);
  EXPECT_TRUE(q->recursion_desired);
  EXPECT_TRUE(q->qname_printable);
}

TEST(Dns, RejectsMalformed) {
  Rcode err;
  EXPECT_FALSE(parse_query(std::vector<uint8_t>{0x12}, &err));
  EXPECT_EQ(err, Rcode::noerror);  // nothing to answer
  EXPECT_TRUE(build_error(std::vector<uint8_t>{0x12}, err).empty());
  auto short_hdr = std::vector<uint8_t>{0x12, 0x34, 1, 0, 0, 1};
  EXPECT_FALSE(parse_query(short_hdr, &err));
  EXPECT_EQ(err, Rcode::formerr);
  auto e = build_error(short_hdr, err);
  ASSERT_EQ(e.size(), 12u);
  EXPECT_EQ(e[0], 0x12);
  EXPECT_EQ(e[3] & 0xF, 1);
  EXPECT_TRUE(e[2] & 0x80);

  auto pkt = query("a.com", 1);
  pkt[12] = 0xC0;  // a compression pointer in the question
  EXPECT_FALSE(parse_query(pkt, &err));
  EXPECT_EQ(err, Rcode::formerr);
  pkt = query("a.com", 1);
  pkt[12] = 60;  // label runs past the end
  EXPECT_FALSE(parse_query(pkt, &err));
  pkt = query("a.com", 1);
  pkt[5] = 2;  // two questions
  EXPECT_FALSE(parse_query(pkt, &err));
  pkt = query("a.com", 1);
  pkt[2] |= 0x80;  // a response
  EXPECT_FALSE(parse_query(pkt, &err));
  EXPECT_EQ(err, Rcode::noerror);
  pkt = query("a.com", 1);
  pkt[2] |= 0x28;  // opcode 5 (UPDATE)
  EXPECT_FALSE(parse_query(pkt, &err));
  EXPECT_EQ(err, Rcode::notimp);
  EXPECT_FALSE(parse_query(query("a.com", 1, 7, 3), &err));  // class CHAOS
  EXPECT_EQ(err, Rcode::refused);
  std::string huge;
  for (int i = 0; i < 60; ++i) huge += "abcd.";
  huge += "com";  // > 255 bytes on the wire
  EXPECT_FALSE(parse_query(query(huge, 1), &err));
  EXPECT_EQ(err, Rcode::formerr);
}

TEST(Dns, FlagsUnprintableLabels) {
  Rcode err;
  auto pkt = query("a.com", 1);
  pkt[13] = 0;  // NUL inside the label "a"
  auto q = parse_query(pkt, &err);
  ASSERT_TRUE(q);
  EXPECT_FALSE(q->qname_printable);
}

TEST(Dns, BuildsAnswersForTheQuestionType) {
  Rcode err;
  auto q = parse_query(query("www.example.com", kTypeA, 0xBEEF), &err);
  ASSERT_TRUE(q);
  std::vector<ResolvedAddr> addrs = {{*IpAddr::parse("203.0.113.10"), 300},
                                     {*IpAddr::parse("2001:db8::10"), 300},
                                     {*IpAddr::parse("203.0.113.11"), 60}};
  auto a = build_answer(*q, Rcode::noerror, addrs);
  EXPECT_EQ(a[0], 0xBE);
  EXPECT_EQ(a[1], 0xEF);
  EXPECT_TRUE(a[2] & 0x80);
  EXPECT_EQ(a[7], 2);  // two A records, the AAAA left out
  // Parsed back with the upstream parser: same addresses and TTLs.
  auto r = parse_upstream_answer(a, kTypeA);
  EXPECT_EQ(r.rcode, Rcode::noerror);
  ASSERT_EQ(r.addrs.size(), 2u);
  EXPECT_EQ(r.addrs[0].ip.to_string(), "203.0.113.10");
  EXPECT_EQ(r.addrs[1].ttl, 60u);
  auto nx = build_answer(*q, Rcode::nxdomain, {});
  EXPECT_EQ(nx[3] & 0xF, 3);
  EXPECT_EQ(nx[7], 0);
  EXPECT_EQ(parse_upstream_answer(nx, kTypeA).rcode, Rcode::nxdomain);
}

TEST(Dns, AnswerStaysWithin512Bytes) {
  Rcode err;
  auto q = parse_query(query("many.example.com", kTypeAAAA), &err);
  std::vector<ResolvedAddr> addrs;
  for (int i = 0; i < 40; ++i) addrs.push_back({*IpAddr::parse("2001:db8::1"), 30});
  EXPECT_LE(build_answer(*q, Rcode::noerror, addrs).size(), 512u);
}

TEST(Dns, ParserSurvivesRandomInput) {
  std::mt19937 rng(42);
  Rcode err;
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> pkt = query("x.example.com", 1);
    int flips = rng() % 8;
    for (int k = 0; k < flips; ++k) pkt[rng() % pkt.size()] = static_cast<uint8_t>(rng());
    pkt.resize(rng() % (pkt.size() + 8), 0xAA);
    auto q = parse_query(pkt, &err);
    if (q) {
      EXPECT_LE(q->qname.size(), 255u);
    }
    parse_upstream_answer(pkt, 1);
    build_error(pkt, Rcode::formerr);
  }
}

TEST(HostResolver, UnreachableUpstreamIsServfailNotHang) {
  // A loopback port nobody listens on: the query is refused immediately.
  HostResolver r("127.0.0.1:9");
  auto res = r.resolve("example.invalid", kTypeA);
  EXPECT_EQ(res.rcode, Rcode::servfail);
}

#include "engine/net/dns.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <random>
#include <thread>

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

namespace {

// A DNS server on 127.0.0.1 (UDP and TCP on one port) that answers every UDP
// query with TC set, and over TCP with `tcp_size` bytes: `filler` TXT
// records, then A records for 203.0.113.1.. (so the addresses lie beyond
// the first kMaxDnsPacket bytes when the answer is long).
class BigAnswerServer {
 public:
  explicit BigAnswerServer(size_t filler) : filler_(filler) {
    for (int attempt = 0; attempt < 20 && port_ == 0; ++attempt) {
      udp_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
      sockaddr_in sa{};
      sa.sin_family = AF_INET;
      sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      socklen_t len = sizeof sa;
      ::bind(udp_, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
      ::getsockname(udp_, reinterpret_cast<sockaddr*>(&sa), &len);
      tcp_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      int one = 1;
      ::setsockopt(tcp_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (::bind(tcp_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0 &&
          ::listen(tcp_, 4) == 0) {
        port_ = ntohs(sa.sin_port);
      } else {
        ::close(udp_);
        ::close(tcp_);
      }
    }
    thread_ = std::thread([this] { serve(); });
  }
  ~BigAnswerServer() {
    stop_ = true;
    ::shutdown(tcp_, SHUT_RDWR);
    ::shutdown(udp_, SHUT_RDWR);
    thread_.join();
    ::close(udp_);
    ::close(tcp_);
  }
  uint16_t port() const { return port_; }
  size_t answer_size() const { return answer_size_; }

 private:
  static void put16(std::vector<uint8_t>& v, uint16_t x) {
    v.push_back(x >> 8);
    v.push_back(x & 0xff);
  }
  std::vector<uint8_t> answer(const uint8_t* q, size_t n, bool tc) {
    std::vector<uint8_t> a(q, q + n);
    a[2] = 0x81 | (tc ? 0x02 : 0);
    a[3] = 0x80;
    a[6] = 0;
    a[7] = 0;
    if (tc) return a;
    uint16_t count = 0;
    for (size_t i = 0; i < filler_; ++i, ++count) {
      put16(a, 0xC00C);
      put16(a, 16);  // TXT: skipped by the parser, fills the buffer
      put16(a, 1);
      put16(a, 0);
      put16(a, 60);
      put16(a, 200);
      a.push_back(199);
      a.insert(a.end(), 199, 'x');
    }
    for (uint8_t i = 1; i <= 8; ++i, ++count) {
      put16(a, 0xC00C);
      put16(a, 1);
      put16(a, 1);
      put16(a, 0);
      put16(a, 60);
      put16(a, 4);
      a.insert(a.end(), {203, 0, 113, i});
    }
    a[6] = count >> 8;
    a[7] = count & 0xff;
    answer_size_ = a.size();
    return a;
  }
  void serve() {
    while (!stop_) {
      pollfd p[2] = {{udp_, POLLIN, 0}, {tcp_, POLLIN, 0}};
      if (::poll(p, 2, 100) <= 0) continue;
      uint8_t buf[4096];
      if (p[0].revents & POLLIN) {
        sockaddr_in from{};
        socklen_t fl = sizeof from;
        ssize_t n = ::recvfrom(udp_, buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&from), &fl);
        if (n >= 12) {
          auto a = answer(buf, static_cast<size_t>(n), true);
          ::sendto(udp_, a.data(), a.size(), 0, reinterpret_cast<sockaddr*>(&from), fl);
        }
      }
      if (p[1].revents & POLLIN) {
        int c = ::accept4(tcp_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c < 0) continue;
        ssize_t n = ::recv(c, buf, sizeof buf, 0);
        if (n >= 14) {
          auto a = answer(buf + 2, static_cast<size_t>(n - 2), false);
          uint8_t len[2] = {uint8_t(a.size() >> 8), uint8_t(a.size())};
          ::send(c, len, 2, MSG_NOSIGNAL);
          ::send(c, a.data(), a.size(), MSG_NOSIGNAL);
        }
        ::shutdown(c, SHUT_WR);
        ::recv(c, buf, sizeof buf, 0);
        ::close(c);
      }
    }
  }
  size_t filler_;
  int udp_ = -1, tcp_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<size_t> answer_size_{0};
  std::thread thread_;
};

}  // namespace

// Issue 9: res_nquery returns the full length of a TCP answer even when it
// kept only the first kMaxDnsPacket bytes; the parser must not read past
// the buffer (under ASan, net_asan_test, the old code aborts here).
TEST(HostResolver, TcpAnswerLongerThanTheBufferIsClamped) {
  BigAnswerServer server(/*filler=*/30);  // 30 x 212 bytes: the A records start past 6 KiB
  ASSERT_NE(server.port(), 0);
  HostResolver resolver("127.0.0.1:" + std::to_string(server.port()));
  Resolution r = resolver.resolve("big.example", kTypeA);
  ASSERT_GT(server.answer_size(), kMaxDnsPacket) << "the server never answered over TCP";
  EXPECT_EQ(r.rcode, Rcode::noerror) << r.error;
  EXPECT_TRUE(r.addrs.empty()) << "addresses past the buffer were read: " << r.addrs.size();
  EXPECT_NE(r.error.find("truncated"), std::string::npos) << r.error;
}

TEST(HostResolver, TcpAnswerThatFitsIsParsed) {
  BigAnswerServer server(/*filler=*/2);
  ASSERT_NE(server.port(), 0);
  HostResolver resolver("127.0.0.1:" + std::to_string(server.port()));
  Resolution r = resolver.resolve("small.example", kTypeA);
  EXPECT_EQ(r.rcode, Rcode::noerror) << r.error;
  ASSERT_EQ(r.addrs.size(), 8u);
  EXPECT_EQ(r.addrs[7].ip.to_string(), "203.0.113.8");
  EXPECT_TRUE(r.error.empty()) << r.error;
}

TEST(Dns, UpstreamParserStaysInsideItsSpan) {
  // The same long answer handed over as a span shorter than its records:
  // nothing past the span is read (ASan would report it).
  std::vector<uint8_t> q = query("big.example", kTypeA);
  std::vector<uint8_t> a(q);
  a[2] = 0x81;
  a[3] = 0x80;
  a[7] = 3;
  for (int i = 0; i < 3; ++i)
    a.insert(a.end(), {0xC0, 0x0C, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 203, 0, 113, uint8_t(i)});
  for (size_t cut = 0; cut <= a.size(); ++cut) {
    auto heap = std::make_unique<uint8_t[]>(cut);  // exactly `cut` bytes: ASan sees any over-read
    std::copy(a.begin(), a.begin() + static_cast<long>(cut), heap.get());
    Resolution r = parse_upstream_answer(std::span<const uint8_t>(heap.get(), cut), kTypeA);
    EXPECT_LE(r.addrs.size(), 3u);
  }
  // Mutated answers (lengths, counts, labels, pointers) in exactly-sized buffers.
  std::mt19937 rng(9);
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> m(a);
    for (int k = 1 + rng() % 6; k > 0; --k) m[rng() % m.size()] = static_cast<uint8_t>(rng());
    m.resize(rng() % (m.size() + 8), 0xC0);
    auto heap = std::make_unique<uint8_t[]>(m.size());
    std::copy(m.begin(), m.end(), heap.get());
    parse_upstream_answer(std::span<const uint8_t>(heap.get(), m.size()), kTypeA);
  }
}

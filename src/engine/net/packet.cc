#include "engine/net/packet.h"

#include <cstring>

namespace airlock::net {

namespace {

uint16_t rd16(const uint8_t* p) { return uint16_t((p[0] << 8) | p[1]); }
uint32_t rd32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3];
}
void wr16(uint8_t* p, uint16_t x) {
  p[0] = x >> 8;
  p[1] = x & 0xff;
}
void wr32(uint8_t* p, uint32_t x) {
  wr16(p, x >> 16);
  wr16(p + 2, x & 0xffff);
}

uint32_t sum_bytes(const uint8_t* p, size_t n, uint32_t acc = 0) {
  for (size_t i = 0; i + 1 < n; i += 2) acc += rd16(p + i);
  if (n & 1) acc += uint32_t(p[n - 1]) << 8;
  return acc;
}
uint16_t fold(uint32_t acc) {
  while (acc >> 16) acc = (acc & 0xffff) + (acc >> 16);
  return static_cast<uint16_t>(~acc);
}

// Builds Ethernet + IP header for `l4` (with its checksum field at `csum_at`
// zeroed, filled here, pseudo-header included unless ICMPv4).
std::vector<uint8_t> wrap(const uint8_t* src_mac, const uint8_t* dst_mac, const IpAddr& src,
                          const IpAddr& dst, uint8_t proto, std::vector<uint8_t> l4,
                          size_t csum_at) {
  bool v4 = src.is_v4();
  std::vector<uint8_t> f(14 + (v4 ? 20 : 40) + l4.size());
  memcpy(f.data(), dst_mac, 6);
  memcpy(f.data() + 6, src_mac, 6);
  wr16(f.data() + 12, v4 ? kEthIPv4 : kEthIPv6);
  uint8_t* ip = f.data() + 14;
  uint32_t pseudo = 0;
  if (v4) {
    ip[0] = 0x45;
    wr16(ip + 2, static_cast<uint16_t>(20 + l4.size()));
    ip[6] = 0x40;  // DF
    ip[8] = 64;
    ip[9] = proto;
    memcpy(ip + 12, src.v4_ptr(), 4);
    memcpy(ip + 16, dst.v4_ptr(), 4);
    wr16(ip + 10, fold(sum_bytes(ip, 20)));
    pseudo = sum_bytes(ip + 12, 8) + proto + l4.size();
  } else {
    ip[0] = 0x60;
    wr16(ip + 4, static_cast<uint16_t>(l4.size()));
    ip[6] = proto;
    ip[7] = 64;
    memcpy(ip + 8, src.bytes.data(), 16);
    memcpy(ip + 24, dst.bytes.data(), 16);
    pseudo = sum_bytes(ip + 8, 32) + proto + l4.size();
  }
  if (proto == kIpICMP) pseudo = 0;
  uint16_t c = fold(sum_bytes(l4.data(), l4.size(), pseudo));
  if (proto == kIpUDP && c == 0) c = 0xffff;
  wr16(l4.data() + csum_at, c);
  memcpy(ip + (v4 ? 20 : 40), l4.data(), l4.size());
  return f;
}

}  // namespace

std::optional<Frame> parse_frame(std::span<const uint8_t> raw) {
  if (raw.size() < 14 || raw.size() > kMaxFrame) return std::nullopt;
  Frame f;
  f.raw = raw;
  const uint8_t* p = raw.data();
  memcpy(f.dst_mac, p, 6);
  memcpy(f.src_mac, p + 6, 6);
  f.ethertype = rd16(p + 12);
  if (f.ethertype != kEthIPv4 && f.ethertype != kEthIPv6) return f;
  size_t n = raw.size();
  const uint8_t* ip = p + 14;
  size_t avail = n - 14;
  size_t ip_total;
  if (f.ethertype == kEthIPv4) {
    if (avail < 20 || (ip[0] >> 4) != 4) return std::nullopt;
    size_t ihl = (ip[0] & 0xF) * 4;
    ip_total = rd16(ip + 2);
    if (ihl < 20 || ip_total < ihl || ip_total > avail) return std::nullopt;
    uint16_t frag = rd16(ip + 6);
    f.fragment = (frag & 0x2000) || (frag & 0x1FFF);
    f.l4 = ip[9];
    f.src = IpAddr::v4_bytes(ip + 12);
    f.dst = IpAddr::v4_bytes(ip + 16);
    f.l4_off = 14 + ihl;
    f.l4_len = ip_total - ihl;
  } else {
    if (avail < 40 || (ip[0] >> 4) != 6) return std::nullopt;
    f.ipv6 = true;
    ip_total = 40 + rd16(ip + 4);
    if (ip_total > avail) return std::nullopt;
    f.l4 = ip[6];
    f.src = IpAddr::v6_bytes(ip + 8);
    f.dst = IpAddr::v6_bytes(ip + 24);
    f.l4_off = 14 + 40;
    f.l4_len = ip_total - 40;
    if (f.l4 != kIpTCP && f.l4 != kIpUDP && f.l4 != kIpICMPv6) f.l4 = 0xff;
  }
  if (f.fragment) return f;
  const uint8_t* l4 = p + f.l4_off;
  switch (f.l4) {
    case kIpTCP: {
      if (f.l4_len < 20) return std::nullopt;
      size_t doff = (l4[12] >> 4) * 4;
      if (doff < 20 || doff > f.l4_len) return std::nullopt;
      f.sport = rd16(l4);
      f.dport = rd16(l4 + 2);
      f.seq = rd32(l4 + 4);
      f.ack = rd32(l4 + 8);
      f.tcp_flags = l4[13];
      f.payload_off = f.l4_off + doff;
      f.payload_len = f.l4_len - doff;
      break;
    }
    case kIpUDP: {
      if (f.l4_len < 8) return std::nullopt;
      size_t ulen = rd16(l4 + 4);
      if (ulen < 8 || ulen > f.l4_len) return std::nullopt;
      f.sport = rd16(l4);
      f.dport = rd16(l4 + 2);
      f.payload_off = f.l4_off + 8;
      f.payload_len = ulen - 8;
      break;
    }
    case kIpICMP:
    case kIpICMPv6: {
      if (f.ipv6 != (f.l4 == kIpICMPv6)) {
        f.l4 = 0xff;
        break;
      }
      if (f.l4_len < 8) return std::nullopt;
      f.icmp_type = l4[0];
      f.icmp_code = l4[1];
      f.icmp_id = rd16(l4 + 4);
      f.payload_off = f.l4_off + 8;
      f.payload_len = f.l4_len - 8;
      break;
    }
    default:
      break;
  }
  return f;
}

std::vector<uint8_t> make_tcp(const Endpoint& from, const Endpoint& to, uint32_t seq, uint32_t ack,
                              uint8_t flags) {
  std::vector<uint8_t> t(20);
  wr16(t.data(), from.port);
  wr16(t.data() + 2, to.port);
  wr32(t.data() + 4, seq);
  wr32(t.data() + 8, ack);
  t[12] = 5 << 4;
  t[13] = flags;
  wr16(t.data() + 14, (flags & kTcpRst) ? 0 : 65535);
  return wrap(from.mac, to.mac, from.ip, to.ip, kIpTCP, std::move(t), 16);
}

std::vector<uint8_t> make_rst_reply(const Frame& f) {
  Endpoint from{{}, f.dst, f.dport}, to{{}, f.src, f.sport};
  memcpy(from.mac, f.dst_mac, 6);
  memcpy(to.mac, f.src_mac, 6);
  if (f.tcp_flags & kTcpAck) return make_tcp(from, to, f.ack, 0, kTcpRst);
  uint32_t len = static_cast<uint32_t>(f.payload_len) + ((f.tcp_flags & kTcpSyn) ? 1 : 0) +
                 ((f.tcp_flags & kTcpFin) ? 1 : 0);
  return make_tcp(from, to, 0, f.seq + len, kTcpRst | kTcpAck);
}

std::vector<uint8_t> make_unreachable(const Frame& f) {
  // Quote the offending packet: IPv4 up to 576 total, IPv6 up to 1280 (RFCs 1812, 4443).
  size_t ip_len = f.l4_off - 14 + f.l4_len;
  size_t quote = std::min(ip_len, f.ipv6 ? size_t(1280 - 48) : size_t(576 - 28));
  std::vector<uint8_t> m(8 + quote);
  if (f.ipv6) {
    m[0] = 1;  // destination unreachable
    m[1] = 1;  // administratively prohibited
  } else {
    m[0] = 3;
    m[1] = 13;  // communication administratively prohibited
  }
  memcpy(m.data() + 8, f.raw.data() + 14, quote);
  // From the address the guest tried to reach, as a router on the path would.
  return wrap(f.dst_mac, f.src_mac, f.dst, f.src, f.ipv6 ? kIpICMPv6 : kIpICMP, std::move(m), 2);
}

std::vector<uint8_t> make_udp(const Endpoint& from, const Endpoint& to,
                              std::span<const uint8_t> payload) {
  std::vector<uint8_t> u(8 + payload.size());
  wr16(u.data(), from.port);
  wr16(u.data() + 2, to.port);
  wr16(u.data() + 4, static_cast<uint16_t>(u.size()));
  memcpy(u.data() + 8, payload.data(), payload.size());
  return wrap(from.mac, to.mac, from.ip, to.ip, kIpUDP, std::move(u), 6);
}

std::vector<uint8_t> make_icmp_echo(const Endpoint& from, const Endpoint& to, bool reply,
                                    uint16_t id, uint16_t seq) {
  bool v6 = !from.ip.is_v4();
  std::vector<uint8_t> m(16, 0x42);
  m[0] = v6 ? (reply ? 129 : 128) : (reply ? 0 : 8);
  m[1] = 0;
  wr16(m.data() + 2, 0);
  wr16(m.data() + 4, id);
  wr16(m.data() + 6, seq);
  return wrap(from.mac, to.mac, from.ip, to.ip, v6 ? kIpICMPv6 : kIpICMP, std::move(m), 2);
}

}  // namespace airlock::net

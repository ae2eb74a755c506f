// Ethernet/IPv4/IPv6/TCP/UDP/ICMP parsing and crafting for the helper's
// frame filter. Parsing is bounds-checked on every field and never trusts a
// length inside the packet beyond the frame; crafting computes checksums.
//
// IPv4 fragments and IPv6 extension headers are reported as such
// (Frame::fragment / l4 == 0xff): the filter cannot see their ports, so it
// drops them.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "engine/net/policy.h"

namespace airlock::net {

constexpr size_t kMaxFrame = 65536 + 14;

enum : uint16_t { kEthIPv4 = 0x0800, kEthARP = 0x0806, kEthIPv6 = 0x86DD };
enum : uint8_t { kIpICMP = 1, kIpTCP = 6, kIpUDP = 17, kIpICMPv6 = 58 };
enum : uint8_t { kTcpFin = 0x01, kTcpSyn = 0x02, kTcpRst = 0x04, kTcpPsh = 0x08, kTcpAck = 0x10 };

struct Frame {
  std::span<const uint8_t> raw;
  uint8_t dst_mac[6]{}, src_mac[6]{};
  uint16_t ethertype = 0;
  // IP (ethertype IPv4/IPv6 only)
  bool ipv6 = false;
  IpAddr src, dst;
  size_t l3_off = 14;
  bool fragment = false;  // IPv4 MF or offset != 0
  uint8_t l4 = 0;         // protocol / next header; 0xff: unparsable (extension header)
  size_t l4_off = 0;
  size_t l4_len = 0;  // bytes of L4 header + payload, per the IP length
  // TCP/UDP
  uint16_t sport = 0, dport = 0;
  // TCP
  uint32_t seq = 0, ack = 0;
  uint8_t tcp_flags = 0;
  size_t payload_len = 0;  // TCP/UDP payload
  size_t payload_off = 0;
  // ICMP / ICMPv6
  uint8_t icmp_type = 0, icmp_code = 0;
  uint16_t icmp_id = 0;
};

// nullopt if the frame is malformed (truncated headers, bad lengths).
std::optional<Frame> parse_frame(std::span<const uint8_t> frame);

struct Endpoint {
  uint8_t mac[6];
  IpAddr ip;
  uint16_t port;
};

// A TCP segment from `from` to `to` with the given seq/ack/flags and no payload.
std::vector<uint8_t> make_tcp(const Endpoint& from, const Endpoint& to, uint32_t seq, uint32_t ack,
                              uint8_t flags);
// The RST answering segment `f` (RFC 793: seq = its ack if it had ACK, else
// 0 with ACK of seq+len(+SYN/FIN)), addressed back to f's sender.
std::vector<uint8_t> make_rst_reply(const Frame& f);
// ICMP(v6) "administratively prohibited" for packet `f`, back to its sender
// (v4: type 3 code 13; v6: type 1 code 1), quoting as much of f as allowed.
std::vector<uint8_t> make_unreachable(const Frame& f);
// A UDP datagram.
std::vector<uint8_t> make_udp(const Endpoint& from, const Endpoint& to,
                              std::span<const uint8_t> payload);
// An ICMP/ICMPv6 echo request (for tests) or reply.
std::vector<uint8_t> make_icmp_echo(const Endpoint& from, const Endpoint& to, bool reply,
                                    uint16_t id, uint16_t seq);

}  // namespace airlock::net

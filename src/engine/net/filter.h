// The helper's frame filter: every Ethernet frame from the guest passes
// through Filter::from_guest() BEFORE libslirp sees it, every frame slirp
// sends to the guest through from_net(). No libslirp in here, so the whole
// decision logic is unit-tested with hand-built frames.
//
// Guest → network:
//   - ARP, DHCP (UDP 68→67 to slirp's own address or 255.255.255.255 only:
//     the two slirp answers itself) and IPv6 neighbour discovery go to slirp,
//     which opens no host socket for them; a 68→67 datagram to any other
//     address is an ordinary UDP flow, decided by the policy;
//   - UDP to the virtual DNS server (10.0.2.3 / fec0::3 port 53) is answered
//     here (dns.h), never by slirp: A/AAAA of allowed names are resolved on
//     the host (Output::resolve → the caller resolves → dns_resolved());
//     everything else gets NXDOMAIN/NOERROR-empty/FORMERR at once;
//   - the first packet of a flow (TCP SYN, UDP datagram to a new
//     destination, ICMP echo with a new id) is decided (pinning.h
//     decide_pinned); allowed → tracked and passed to slirp (which then opens
//     the host socket), denied TCP → RST to the guest, denied UDP/ICMP → ICMP
//     administratively-prohibited to the guest. Later packets of a tracked
//     flow pass; TCP segments of no tracked flow get a RST;
//   - IPv4 fragments, IPv6 extension headers, other ethertypes and malformed
//     frames are dropped.
// Network → guest: everything is delivered (except an inbound SYN beyond the
// flow cap); frames of tracked flows are counted (payload bytes each way) and
// TCP FIN/RST end the flow.
//
// Inbound (port forwards, add_inbound): slirp's SYN to a forwarded guest port
// starts an inbound flow (recorded like the others, with "direction": "in"),
// so the guest's SYN-ACK and the rest pass. Inbound flows are not subject to
// the egress policy (their remote is slirp's host alias 10.0.2.2, always
// denied for egress); removing the forward cuts them.
//
// Bounded: at most max_flows tracked flows (beyond: denied with rule "flow
// table full"), max_pending_tcp TCP flows in their handshake (beyond: rule
// "too many pending connections"), max_dns_inflight resolutions, and events
// are rate limited per kind (events_per_second of each of net_dns,
// net_dns_denied, net_flow, net_flow_denied, net_flow_end; the rest counted
// in a "net_suppressed" event) so a flood cannot fill memory or the event
// socket. The daemon enforces its own limit on top (intake.h).
//
// Events (EventSink, one JSON object each; the helper reports them to the
// daemon, which stamps them: no "ts" here):
//   {"event":"net_dns","name","qtype","allowed","rule","rcode","answers":[..],"dropped":[{"ip","rule"}]}
//   {"event":"net_flow","proto","src_port","dst","port","name","rule","allowed"}
//   {"event":"net_flow_end","proto","src_port","dst","port","name","rule",
//    "bytes_out","bytes_in","duration_ms","reason":"fin|rst|idle|policy|port closed|helper exit"}
//   {"event":"net_suppressed","count","counts":{"net_dns":N,...}}
//   inbound flows: {"event":"net_flow","direction":"in","proto":"tcp","dst":<guest ip>,
//    "port":<guest port>,"src_port":<slirp's port>,"host_port","name":"","rule":"port
//    127.0.0.1:N","allowed"} (net_flow_end alike; bytes_in = host → guest)
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <vector>

#include "engine/net/dns.h"
#include "engine/net/packet.h"
#include "engine/net/pinning.h"
#include "engine/net/policy.h"

namespace airlock::net {

struct FilterConfig {
  IpAddr dns_v4 = IpAddr::v4(0x0A000203);  // libslirp's default virtual DNS, 10.0.2.3
  IpAddr dns_v6 = *IpAddr::parse("fec0::3");
  // libslirp's own address (vhost), where its DHCP server answers. libslirp
  // 4.7 (udp.c) serves BOOTP only for datagrams to port 67 of this address
  // or of 255.255.255.255; to any other address it opens a host socket.
  IpAddr dhcp_server = IpAddr::v4(0x0A000202);  // 10.0.2.2
  // Each allowed TCP flow costs ~400 KiB in slirp (measured: its socket
  // buffers), so the caps bound the helper's memory: flows in all, and TCP
  // flows still in their handshake (what a SYN flood creates).
  size_t max_flows = 512;
  size_t max_pending_tcp = 64;
  size_t max_dns_inflight = 64;
  std::chrono::seconds tcp_handshake_timeout{30};
  std::chrono::seconds tcp_idle_timeout{3600};
  std::chrono::seconds udp_idle_timeout{60};
  std::chrono::seconds icmp_idle_timeout{10};
  std::chrono::seconds linger{10};  // closed TCP flows still pass their last ACKs
  size_t events_per_second = 1000;  // per kind
};

using EventSink = std::function<void(nlohmann::json)>;

struct DnsRequest {
  DnsQuery query;
  std::string name;        // normalised
  Endpoint server, guest;  // for the reply datagram
};

class Filter {
 public:
  Filter(NetworkPolicy policy, FilterConfig config, EventSink sink,
         Clock clock = steady_clock_fn());

  struct Output {
    bool to_slirp = false;                       // hand the frame to slirp_input
    std::vector<std::vector<uint8_t>> to_guest;  // frames to send to the guest now
    std::optional<DnsRequest> resolve;           // resolve, then call dns_resolved()
  };
  Output from_guest(std::span<const uint8_t> frame);

  // A frame slirp sends to the guest: accounting, and the start of inbound
  // flows. Returns false if the frame must not be delivered (an inbound SYN
  // beyond the flow cap).
  bool from_net(std::span<const uint8_t> frame);

  // The answer frame for a finished resolution (pins its addresses first).
  std::vector<uint8_t> dns_resolved(const DnsRequest& request, const Resolution& result);

  struct Cut {
    std::vector<std::vector<uint8_t>> to_guest, to_slirp;
  };
  // Lets slirp's connections to guest TCP port `guest_port` (a port forward
  // from host loopback port `host_port`) through as inbound flows.
  void add_inbound(uint16_t guest_port, uint16_t host_port);
  // Stops that; the port's open inbound flows are cut (RST both ways).
  Cut remove_inbound(uint16_t guest_port);
  // Replaces the policy; flows it no longer allows are cut (RST both ways).
  Cut set_policy(NetworkPolicy policy);
  // Expires idle flows (cutting TCP ones) and pins; call about once a second.
  Cut tick();
  // Ends every flow (helper shutdown), recording them (and what the rate
  // limit still holds).
  void close_all(const std::string& reason);

  const NetworkPolicy& policy() const { return policy_; }
  size_t flow_count() const { return flows_.size(); }
  const PinTable& pins() const { return pins_; }
  nlohmann::json stats() const;

 private:
  struct Key {
    uint8_t proto;
    IpAddr guest;
    uint16_t gport;  // ICMP: echo id
    IpAddr remote;
    uint16_t rport;  // ICMP: 0
    auto operator<=>(const Key&) const = default;
  };
  struct Flow {
    Proto proto;
    std::string name, rule;
    std::chrono::steady_clock::time_point start, last;
    std::optional<std::chrono::steady_clock::time_point> closed;
    uint64_t bytes_out = 0, bytes_in = 0;
    uint8_t guest_mac[6], gw_mac[6];
    bool established = false, fin_guest = false, fin_net = false;
    bool inbound = false;                        // started by a port forward (slirp's SYN)
    uint16_t host_port = 0;                      // inbound: the forwarded host loopback port
    uint32_t guest_nxt = 0, net_nxt = 0;         // next seq each side will send
    std::optional<uint32_t> guest_ack, net_ack;  // what each side expects next
  };

  Output handle_dns(const Frame& f);
  Output new_flow(const Frame& f, const Key& key, Proto proto);
  void end_flow(const Key& key, Flow& flow, const std::string& reason);
  void cut_tcp(const Key& key, const Flow& flow, Cut& out);
  void emit(nlohmann::json event);
  void flush_suppressed();
  nlohmann::json flow_fields(const Key& key, const Flow& flow) const;

  NetworkPolicy policy_;
  FilterConfig config_;
  EventSink sink_;
  Clock clock_;
  PinTable pins_;
  std::map<Key, Flow> flows_;
  std::map<uint16_t, uint16_t> inbound_;  // guest port -> host port
  size_t dns_inflight_ = 0;
  // rate limiting, per kind
  std::chrono::steady_clock::time_point window_start_{};
  std::map<std::string, size_t> window_counts_, suppressed_;
  uint64_t malformed_ = 0, dropped_ = 0;
};

}  // namespace airlock::net

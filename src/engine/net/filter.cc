#include "engine/net/filter.h"

#include <cstring>
#include <ctime>

namespace airlock::net {

namespace {

// Guest-chosen names go into the journal: printable ASCII only, bounded.
std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s.substr(0, 300)) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[8];
      snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

bool seq_after(uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b) > 0; }

}  // namespace

Filter::Filter(NetworkPolicy policy, FilterConfig config, EventSink sink, Clock clock)
    : policy_(std::move(policy)),
      config_(config),
      sink_(std::move(sink)),
      clock_(clock),
      pins_(clock) {}

void Filter::emit(nlohmann::json event) {
  auto now = clock_();
  if (now - window_start_ >= std::chrono::seconds(1)) {
    flush_suppressed();
    window_start_ = now;
    window_counts_.clear();
  }
  // Per kind, so a flood of one (denied SYNs) does not hide another (the
  // allowed flows). The daemon enforces its own, stricter limit
  // (intake.h); this one only keeps a flood off the event socket.
  std::string kind = event.value("event", "");
  if (event.contains("allowed") && !event["allowed"].get<bool>()) kind += "_denied";
  if (++window_counts_[kind] > config_.events_per_second) {
    ++suppressed_[kind];
    return;
  }
  sink_(std::move(event));
}

void Filter::flush_suppressed() {
  if (suppressed_.empty()) return;
  size_t total = 0;
  nlohmann::json counts = nlohmann::json::object();
  for (auto& [k, n] : suppressed_) {
    counts[k] = n;
    total += n;
  }
  suppressed_.clear();
  sink_({{"event", "net_suppressed"}, {"count", total}, {"counts", counts}});
}

nlohmann::json Filter::flow_fields(const Key& key, const Flow& flow) const {
  if (flow.inbound) {
    return {{"proto", "tcp"},    {"direction", "in"},     {"dst", key.guest.to_string()},
            {"port", key.gport}, {"src_port", key.rport}, {"host_port", flow.host_port},
            {"name", ""},        {"rule", flow.rule}};
  }
  nlohmann::json j{{"proto", to_string(flow.proto)},
                   {"dst", key.remote.to_string()},
                   {"name", flow.name},
                   {"rule", flow.rule}};
  if (flow.proto == Proto::icmp) {
    j["icmp_id"] = key.gport;
  } else {
    j["src_port"] = key.gport;
    j["port"] = key.rport;
  }
  return j;
}

Filter::Output Filter::from_guest(std::span<const uint8_t> raw) {
  Output out;
  auto parsed = parse_frame(raw);
  if (!parsed) {
    ++malformed_;
    return out;
  }
  const Frame& f = *parsed;
  if (f.ethertype == kEthARP) {
    out.to_slirp = true;
    return out;
  }
  if ((f.ethertype != kEthIPv4 && f.ethertype != kEthIPv6) || f.fragment || f.l4 == 0xff) {
    ++dropped_;
    return out;
  }
  // slirp's own services that open no host socket.
  if (!f.ipv6 && f.l4 == kIpUDP && f.sport == 68 && f.dport == 67 &&
      (f.dst == config_.dhcp_server || f.dst == IpAddr::v4(0xFFFFFFFF))) {
    out.to_slirp = true;
    return out;
  }
  if (f.ipv6 && f.l4 == kIpICMPv6 && f.icmp_type >= 133 && f.icmp_type <= 137) {
    out.to_slirp = true;
    return out;
  }
  if (f.l4 == kIpUDP && f.dport == 53 && (f.dst == config_.dns_v4 || f.dst == config_.dns_v6))
    return handle_dns(f);

  auto now = clock_();
  switch (f.l4) {
    case kIpTCP: {
      Key key{kIpTCP, f.src, f.sport, f.dst, f.dport};
      auto it = flows_.find(key);
      if (it == flows_.end()) {
        if ((f.tcp_flags & (kTcpSyn | kTcpAck | kTcpRst)) == kTcpSyn)
          return new_flow(f, key, Proto::tcp);
        // A segment of no flow we allowed: the guest must not believe it is
        // connected to anything.
        if (!(f.tcp_flags & kTcpRst)) out.to_guest.push_back(make_rst_reply(f));
        return out;
      }
      Flow& fl = it->second;
      if (fl.closed && (f.tcp_flags & (kTcpSyn | kTcpAck | kTcpRst)) == kTcpSyn) {
        flows_.erase(it);  // the port is reused for a new connection: decide it anew
        return new_flow(f, key, Proto::tcp);
      }
      out.to_slirp = true;
      if (fl.closed) return out;  // lingering: last ACKs
      fl.last = now;
      fl.bytes_out += f.payload_len;
      uint32_t end = f.seq + static_cast<uint32_t>(f.payload_len) +
                     ((f.tcp_flags & (kTcpSyn | kTcpFin)) ? 1 : 0);
      // An inbound flow learns the guest's sequence numbers from its SYN-ACK.
      if (seq_after(end, fl.guest_nxt) || (fl.inbound && (f.tcp_flags & kTcpSyn)))
        fl.guest_nxt = end;
      if (f.tcp_flags & kTcpAck) {
        fl.guest_ack = f.ack;
        if (!(f.tcp_flags & kTcpSyn)) fl.established = true;
      }
      if (f.tcp_flags & kTcpRst) {
        end_flow(key, fl, "rst");
      } else if (f.tcp_flags & kTcpFin) {
        fl.fin_guest = true;
        if (fl.fin_net) end_flow(key, fl, "fin");
      }
      return out;
    }
    case kIpUDP: {
      Key key{kIpUDP, f.src, f.sport, f.dst, f.dport};
      auto it = flows_.find(key);
      if (it == flows_.end()) return new_flow(f, key, Proto::udp);
      it->second.last = now;
      it->second.bytes_out += f.payload_len;
      out.to_slirp = true;
      return out;
    }
    case kIpICMP:
    case kIpICMPv6: {
      bool echo = f.ipv6 ? f.icmp_type == 128 : f.icmp_type == 8;
      if (!echo) {  // errors/replies from the guest: nothing on the host needs them
        ++dropped_;
        return out;
      }
      Key key{f.l4, f.src, f.icmp_id, f.dst, 0};
      auto it = flows_.find(key);
      if (it == flows_.end()) return new_flow(f, key, Proto::icmp);
      it->second.last = now;
      it->second.bytes_out += f.payload_len;
      out.to_slirp = true;
      return out;
    }
    default:
      ++dropped_;
      return out;
  }
}

Filter::Output Filter::new_flow(const Frame& f, const Key& key, Proto proto) {
  Output out;
  std::string name;
  Decision d;
  if (flows_.size() >= config_.max_flows) tick();  // reclaim expired ones first
  size_t pending = 0;
  if (proto == Proto::tcp) {
    for (const auto& [k, fl] : flows_)
      pending += fl.proto == Proto::tcp && !fl.established && !fl.closed;
  }
  if (flows_.size() >= config_.max_flows) {
    d = {false, "flow table full"};
  } else if (pending >= config_.max_pending_tcp) {
    d = {false, "too many pending connections"};
  } else {
    d = decide_pinned(policy_, pins_, f.dst, proto == Proto::icmp ? 0 : f.dport, proto, &name);
  }
  nlohmann::json ev{{"event", "net_flow"},      {"proto", to_string(proto)},
                    {"dst", f.dst.to_string()}, {"name", name},
                    {"rule", d.rule},           {"allowed", d.allowed}};
  if (proto == Proto::icmp) {
    ev["icmp_id"] = f.icmp_id;
  } else {
    ev["src_port"] = f.sport;
    ev["port"] = f.dport;
  }
  emit(std::move(ev));
  if (!d.allowed) {
    if (proto == Proto::tcp) {
      out.to_guest.push_back(make_rst_reply(f));
    } else {
      out.to_guest.push_back(make_unreachable(f));
    }
    return out;
  }
  auto now = clock_();
  Flow fl{};
  fl.proto = proto;
  fl.name = name;
  fl.rule = d.rule;
  fl.start = fl.last = now;
  memcpy(fl.guest_mac, f.src_mac, 6);
  memcpy(fl.gw_mac, f.dst_mac, 6);
  fl.guest_nxt = f.seq + 1;
  fl.bytes_out = proto == Proto::tcp ? 0 : f.payload_len;
  flows_.emplace(key, std::move(fl));
  out.to_slirp = true;
  return out;
}

bool Filter::from_net(std::span<const uint8_t> raw) {
  auto parsed = parse_frame(raw);
  if (!parsed || parsed->fragment) return true;
  const Frame& f = *parsed;
  Key key;
  if (f.l4 == kIpTCP || f.l4 == kIpUDP) {
    key = Key{f.l4, f.dst, f.dport, f.src, f.sport};
  } else if ((f.l4 == kIpICMP && f.icmp_type == 0) || (f.l4 == kIpICMPv6 && f.icmp_type == 129)) {
    key = Key{f.l4, f.dst, f.icmp_id, f.src, 0};
  } else {
    return true;
  }
  auto it = flows_.find(key);
  if (f.l4 == kIpTCP && (f.tcp_flags & (kTcpSyn | kTcpAck | kTcpRst)) == kTcpSyn &&
      (it == flows_.end() || it->second.closed)) {
    // slirp only sends a SYN for a port forward (slirp_add_hostfwd).
    auto in = inbound_.find(f.dport);
    if (in == inbound_.end()) return true;
    if (it != flows_.end()) flows_.erase(it);
    if (flows_.size() >= config_.max_flows) tick();
    std::string rule = "port 127.0.0.1:" + std::to_string(in->second);
    if (flows_.size() >= config_.max_flows) {
      emit({{"event", "net_flow"},
            {"direction", "in"},
            {"proto", "tcp"},
            {"dst", f.dst.to_string()},
            {"port", f.dport},
            {"src_port", f.sport},
            {"host_port", in->second},
            {"name", ""},
            {"rule", "flow table full"},
            {"allowed", false}});
      return false;  // slirp retransmits; the host client waits or gives up
    }
    Flow fl{};
    fl.proto = Proto::tcp;
    fl.rule = rule;
    fl.inbound = true;
    fl.host_port = in->second;
    fl.start = fl.last = clock_();
    memcpy(fl.guest_mac, f.dst_mac, 6);
    memcpy(fl.gw_mac, f.src_mac, 6);
    it = flows_.emplace(key, std::move(fl)).first;
    auto ev = flow_fields(key, it->second);
    ev["event"] = "net_flow";
    ev["allowed"] = true;
    emit(std::move(ev));
  }
  if (it == flows_.end() || it->second.closed) return true;
  Flow& fl = it->second;
  fl.last = clock_();
  fl.bytes_in += f.payload_len;
  if (f.l4 != kIpTCP) return true;
  uint32_t end =
      f.seq + static_cast<uint32_t>(f.payload_len) + ((f.tcp_flags & (kTcpSyn | kTcpFin)) ? 1 : 0);
  if (!fl.net_ack || seq_after(end, fl.net_nxt)) fl.net_nxt = end;
  if (f.tcp_flags & kTcpAck) fl.net_ack = f.ack;
  if (f.tcp_flags & kTcpRst) {
    end_flow(key, fl, "rst");
  } else if (f.tcp_flags & kTcpFin) {
    fl.fin_net = true;
    if (fl.fin_guest) end_flow(key, fl, "fin");
  }
  return true;
}

void Filter::add_inbound(uint16_t guest_port, uint16_t host_port) {
  inbound_[guest_port] = host_port;
}

Filter::Cut Filter::remove_inbound(uint16_t guest_port) {
  inbound_.erase(guest_port);
  Cut out;
  for (auto it = flows_.begin(); it != flows_.end();) {
    Flow& fl = it->second;
    if (!fl.inbound || it->first.gport != guest_port || fl.closed) {
      ++it;
      continue;
    }
    cut_tcp(it->first, fl, out);
    end_flow(it->first, fl, "port closed");
    it = flows_.erase(it);
  }
  return out;
}

void Filter::end_flow(const Key& key, Flow& fl, const std::string& reason) {
  if (fl.closed) return;
  auto now = clock_();
  fl.closed = now;
  auto j = flow_fields(key, fl);
  j["event"] = "net_flow_end";
  j["bytes_out"] = fl.bytes_out;
  j["bytes_in"] = fl.bytes_in;
  j["duration_ms"] = std::chrono::duration_cast<std::chrono::milliseconds>(now - fl.start).count();
  j["reason"] = reason;
  emit(std::move(j));
}

void Filter::cut_tcp(const Key& key, const Flow& fl, Cut& out) {
  Endpoint guest{{}, key.guest, key.gport}, remote{{}, key.remote, key.rport};
  memcpy(guest.mac, fl.guest_mac, 6);
  memcpy(remote.mac, fl.gw_mac, 6);
  // Sequence numbers each receiver expects next (RFC 5961 accepts exactly these).
  uint32_t to_guest_seq = fl.guest_ack.value_or(fl.net_nxt);
  uint32_t to_net_seq = fl.net_ack.value_or(fl.guest_nxt);
  out.to_guest.push_back(make_tcp(remote, guest, to_guest_seq, 0, kTcpRst));
  out.to_slirp.push_back(make_tcp(guest, remote, to_net_seq, 0, kTcpRst));
}

Filter::Cut Filter::set_policy(NetworkPolicy policy) {
  policy_ = std::move(policy);
  Cut out;
  for (auto it = flows_.begin(); it != flows_.end();) {
    Flow& fl = it->second;
    // Inbound flows come from a port forward, not the egress policy.
    if (fl.closed || fl.inbound) {
      ++it;
      continue;
    }
    Decision d = policy_.decide(it->first.remote, it->first.rport, fl.proto,
                                fl.name.empty() ? nullptr : &fl.name);
    if (d.allowed) {
      ++it;
      continue;
    }
    if (fl.proto == Proto::tcp) cut_tcp(it->first, fl, out);
    fl.rule = d.rule;
    end_flow(it->first, fl, "policy");
    it = flows_.erase(it);
  }
  return out;
}

Filter::Cut Filter::tick() {
  Cut out;
  auto now = clock_();
  pins_.expire();
  for (auto it = flows_.begin(); it != flows_.end();) {
    Flow& fl = it->second;
    if (fl.closed) {
      if (now - *fl.closed >= config_.linger) {
        it = flows_.erase(it);
      } else {
        ++it;
      }
      continue;
    }
    std::chrono::seconds limit = fl.proto == Proto::udp    ? config_.udp_idle_timeout
                                 : fl.proto == Proto::icmp ? config_.icmp_idle_timeout
                                 : fl.established          ? config_.tcp_idle_timeout
                                                           : config_.tcp_handshake_timeout;
    if (now - fl.last < limit) {
      ++it;
      continue;
    }
    if (fl.proto == Proto::tcp) cut_tcp(it->first, fl, out);
    end_flow(it->first, fl, "idle");
    it = flows_.erase(it);
  }
  return out;
}

void Filter::close_all(const std::string& reason) {
  for (auto& [key, fl] : flows_) end_flow(key, fl, reason);
  flows_.clear();
  flush_suppressed();
}

Filter::Output Filter::handle_dns(const Frame& f) {
  Output out;
  Endpoint server{{}, f.dst, 53}, guest{{}, f.src, f.sport};
  memcpy(server.mac, f.dst_mac, 6);
  memcpy(guest.mac, f.src_mac, 6);
  auto payload = f.raw.subspan(f.payload_off, f.payload_len);
  Rcode err;
  auto q = parse_query(payload, &err);
  if (!q) {
    auto reply = build_error(payload, err);
    if (!reply.empty()) out.to_guest.push_back(make_udp(server, guest, reply));
    emit({{"event", "net_dns"},
          {"name", ""},
          {"allowed", false},
          {"rule", "malformed query"},
          {"rcode", to_string(err)}});
    return out;
  }
  Decision d = policy_.decide_name(q->qname);
  bool addr_type = q->qtype == kTypeA || q->qtype == kTypeAAAA;
  if (d.allowed && addr_type) {
    if (dns_inflight_ >= config_.max_dns_inflight) {
      out.to_guest.push_back(make_udp(server, guest, build_answer(*q, Rcode::servfail, {})));
      emit({{"event", "net_dns"},
            {"name", printable(q->qname)},
            {"qtype", qtype_name(q->qtype)},
            {"allowed", false},
            {"rule", "too many queries in flight"},
            {"rcode", "SERVFAIL"}});
      return out;
    }
    ++dns_inflight_;
    out.resolve = DnsRequest{*q, *normalize_name(q->qname), server, guest};
    return out;
  }
  // Denied names never leave the host: NXDOMAIN without asking upstream.
  // Allowed names of other types: NOERROR, no records (nothing forwarded).
  Rcode rc = d.allowed ? Rcode::noerror : Rcode::nxdomain;
  out.to_guest.push_back(make_udp(server, guest, build_answer(*q, rc, {})));
  emit({{"event", "net_dns"},
        {"name", printable(q->qname)},
        {"qtype", qtype_name(q->qtype)},
        {"allowed", d.allowed},
        {"rule", d.rule},
        {"rcode", to_string(rc)}});
  return out;
}

std::vector<uint8_t> Filter::dns_resolved(const DnsRequest& req, const Resolution& res) {
  if (dns_inflight_) --dns_inflight_;
  nlohmann::json ev{
      {"event", "net_dns"}, {"name", req.name}, {"qtype", qtype_name(req.query.qtype)}};
  // The policy may have changed while the resolution ran.
  Decision d = policy_.decide_name(req.name);
  ev["allowed"] = d.allowed;
  ev["rule"] = d.rule;
  if (!d.allowed) {
    ev["rcode"] = "NXDOMAIN";
    emit(std::move(ev));
    return make_udp(req.server, req.guest, build_answer(req.query, Rcode::nxdomain, {}));
  }
  Rcode rc = res.rcode;
  std::vector<ResolvedAddr> kept;
  nlohmann::json answers = nlohmann::json::array(), dropped = nlohmann::json::array();
  if (rc == Rcode::noerror) {
    PinResult pr = pin_answers(policy_, pins_, req.name, res.addrs);
    kept = std::move(pr.kept);
    for (auto& a : kept) answers.push_back(a.ip.to_string());
    for (auto& [a, why] : pr.dropped)
      dropped.push_back({{"ip", a.ip.to_string()}, {"rule", why.rule}});
  }
  ev["rcode"] = to_string(rc);
  ev["answers"] = answers;
  if (!dropped.empty()) ev["dropped"] = dropped;
  if (!res.error.empty()) ev["error"] = res.error;
  emit(std::move(ev));
  return make_udp(req.server, req.guest, build_answer(req.query, rc, kept));
}

nlohmann::json Filter::stats() const {
  return {{"flows", flows_.size()},        {"pins", pins_.size()},
          {"dns_inflight", dns_inflight_}, {"malformed_frames", malformed_},
          {"dropped_frames", dropped_},    {"policy", policy_.to_json()}};
}

}  // namespace airlock::net

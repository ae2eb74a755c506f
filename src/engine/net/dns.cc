#include "engine/net/dns.h"

#include <arpa/inet.h>
#include <netdb.h>

#include <algorithm>
#include <cstring>

namespace airlock::net {

namespace {

uint16_t rd16(const uint8_t* p) { return uint16_t((p[0] << 8) | p[1]); }
uint32_t rd32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3];
}
void put16(std::vector<uint8_t>& v, uint16_t x) {
  v.push_back(x >> 8);
  v.push_back(x & 0xff);
}
void put32(std::vector<uint8_t>& v, uint32_t x) {
  put16(v, x >> 16);
  put16(v, x & 0xffff);
}

// Skips a (possibly compressed) name at `off`; returns the offset after it
// or 0 if it runs past `len`. Never follows pointers, so it cannot loop.
size_t skip_name(const uint8_t* p, size_t len, size_t off) {
  for (int labels = 0; labels < 128 && off < len; ++labels) {
    uint8_t l = p[off];
    if (l == 0) return off + 1;
    if ((l & 0xC0) == 0xC0) return off + 2 <= len ? off + 2 : 0;
    if (l & 0xC0) return 0;
    off += 1 + l;
  }
  return 0;
}

}  // namespace

const char* to_string(Rcode rc) {
  switch (rc) {
    case Rcode::noerror:
      return "NOERROR";
    case Rcode::formerr:
      return "FORMERR";
    case Rcode::servfail:
      return "SERVFAIL";
    case Rcode::nxdomain:
      return "NXDOMAIN";
    case Rcode::notimp:
      return "NOTIMP";
    case Rcode::refused:
      return "REFUSED";
  }
  return "?";
}

std::string qtype_name(uint16_t t) {
  switch (t) {
    case 1:
      return "A";
    case 2:
      return "NS";
    case 5:
      return "CNAME";
    case 6:
      return "SOA";
    case 12:
      return "PTR";
    case 15:
      return "MX";
    case 16:
      return "TXT";
    case 28:
      return "AAAA";
    case 33:
      return "SRV";
    case 64:
      return "SVCB";
    case 65:
      return "HTTPS";
    case 255:
      return "ANY";
  }
  return "TYPE" + std::to_string(t);
}

std::optional<DnsQuery> parse_query(std::span<const uint8_t> pkt, Rcode* error) {
  *error = Rcode::formerr;
  if (pkt.size() < 2) {
    *error = Rcode::noerror;  // no id to answer to
    return std::nullopt;
  }
  if (pkt.size() < 12 || pkt.size() > kMaxDnsPacket) return std::nullopt;
  const uint8_t* p = pkt.data();
  DnsQuery q;
  q.id = rd16(p);
  uint16_t flags = rd16(p + 2);
  if (flags & 0x8000) {  // a response: never answer (no reflection loops)
    *error = Rcode::noerror;
    return std::nullopt;
  }
  if (((flags >> 11) & 0xF) != 0) {
    *error = Rcode::notimp;
    return std::nullopt;
  }
  q.recursion_desired = flags & 0x0100;
  if (rd16(p + 4) != 1 || rd16(p + 6) != 0 || rd16(p + 8) != 0 || rd16(p + 10) > 1)
    return std::nullopt;
  size_t off = 12;
  size_t wire = 0;
  for (;;) {
    if (off >= pkt.size()) return std::nullopt;
    uint8_t l = p[off];
    if (l & 0xC0) return std::nullopt;  // pointers/extended labels: not in a plain question
    wire += 1 + l;
    if (wire > 255) return std::nullopt;
    if (l == 0) {
      ++off;
      break;
    }
    if (off + 1 + l > pkt.size()) return std::nullopt;
    if (!q.qname.empty()) q.qname.push_back('.');
    for (size_t i = 0; i < l; ++i) {
      uint8_t c = p[off + 1 + i];
      if (c <= 0x20 || c >= 0x7f || c == '.') q.qname_printable = false;
      q.qname.push_back(static_cast<char>(c));
    }
    off += 1 + l;
  }
  if (off + 4 > pkt.size()) return std::nullopt;
  q.qtype = rd16(p + off);
  q.qclass = rd16(p + off + 2);
  q.question.assign(p + 12, p + off + 4);
  off += 4;
  if (rd16(p + 10) == 1) {
    // Additional: only EDNS OPT (root name, type 41) is understood.
    if (off + 11 > pkt.size() || p[off] != 0 || rd16(p + off + 1) != 41) return std::nullopt;
    q.edns_udp_size = rd16(p + off + 3);
    size_t rdlen = rd16(p + off + 9);
    if (off + 11 + rdlen > pkt.size()) return std::nullopt;
  }
  if (q.qclass != kClassIN) {
    *error = Rcode::refused;
    return std::nullopt;
  }
  if (q.qname.empty()) {  // the root: nothing a sandbox needs
    *error = Rcode::refused;
    return std::nullopt;
  }
  return q;
}

std::vector<uint8_t> build_answer(const DnsQuery& q, Rcode rcode,
                                  const std::vector<ResolvedAddr>& addrs) {
  size_t limit = std::clamp<size_t>(q.edns_udp_size, 512, 1232);
  std::vector<uint8_t> out;
  put16(out, q.id);
  put16(out, 0x8000 | (q.recursion_desired ? 0x0100 : 0) | 0x0080 | static_cast<uint8_t>(rcode));
  put16(out, 1);
  put16(out, 0);  // ancount, patched below
  put16(out, 0);
  put16(out, 0);
  out.insert(out.end(), q.question.begin(), q.question.end());
  uint16_t count = 0;
  for (const auto& a : addrs) {
    bool v4 = a.ip.is_v4();
    if ((q.qtype == kTypeA) != v4 || (q.qtype != kTypeA && q.qtype != kTypeAAAA)) continue;
    size_t rdlen = v4 ? 4 : 16;
    if (out.size() + 12 + rdlen > limit) break;
    put16(out, 0xC00C);  // the question's name
    put16(out, q.qtype);
    put16(out, kClassIN);
    put32(out, a.ttl);
    put16(out, rdlen);
    const uint8_t* d = v4 ? a.ip.v4_ptr() : a.ip.bytes.data();
    out.insert(out.end(), d, d + rdlen);
    ++count;
  }
  out[6] = count >> 8;
  out[7] = count & 0xff;
  return out;
}

std::vector<uint8_t> build_error(std::span<const uint8_t> pkt, Rcode rcode) {
  if (pkt.size() < 2 || rcode == Rcode::noerror) return {};
  if (pkt.size() >= 3 && (pkt[2] & 0x80)) return {};  // never answer a response
  std::vector<uint8_t> out = {pkt[0], pkt[1]};
  uint8_t opcode_rd = pkt.size() >= 3 ? (pkt[2] & 0x79) : 0;
  out.push_back(0x80 | opcode_rd);
  out.push_back(0x80 | static_cast<uint8_t>(rcode));
  for (int i = 0; i < 8; ++i) out.push_back(0);
  return out;
}

Resolution parse_upstream_answer(std::span<const uint8_t> pkt, uint16_t qtype) {
  Resolution r;
  const uint8_t* p = pkt.data();
  size_t len = std::min(pkt.size(), size_t(65535));
  if (len < 12) {
    r.error = "short upstream answer";
    return r;
  }
  r.rcode = static_cast<Rcode>(p[3] & 0xF);
  if (r.rcode != Rcode::noerror && r.rcode != Rcode::nxdomain) {
    r.error = std::string("upstream ") + to_string(r.rcode);
    r.rcode = Rcode::servfail;
    return r;
  }
  size_t qd = rd16(p + 4), an = rd16(p + 6);
  size_t off = 12;
  for (size_t i = 0; i < qd; ++i) {
    off = skip_name(p, len, off);
    if (!off || off + 4 > len) {
      r.rcode = Rcode::servfail;
      r.error = "malformed upstream question";
      return r;
    }
    off += 4;
  }
  for (size_t i = 0; i < an && r.addrs.size() < 32; ++i) {
    off = skip_name(p, len, off);
    if (!off || off + 10 > len) break;
    uint16_t type = rd16(p + off), cls = rd16(p + off + 2);
    uint32_t ttl = rd32(p + off + 4);
    size_t rdlen = rd16(p + off + 8);
    off += 10;
    if (off + rdlen > len) break;
    if (cls == kClassIN && type == qtype) {
      if (type == kTypeA && rdlen == 4) r.addrs.push_back({IpAddr::v4_bytes(p + off), ttl});
      if (type == kTypeAAAA && rdlen == 16) {
        IpAddr a = IpAddr::v6_bytes(p + off);
        r.addrs.push_back({a, ttl});
      }
    }
    off += rdlen;
  }
  return r;
}

HostResolver::HostResolver(const std::string& upstream) {
  if (res_ninit(&state_) != 0) {
    // No usable configuration: resolve() will SERVFAIL; not fatal for the helper.
  }
  state_.retrans = 2;
  state_.retry = 2;
  state_.options &= ~(RES_DNSRCH | RES_DEFNAMES);
  if (!upstream.empty()) {
    std::string host = upstream;
    uint16_t port = 53;
    if (auto c = upstream.rfind(':'); c != std::string::npos) {
      host = upstream.substr(0, c);
      port = static_cast<uint16_t>(std::stoi(upstream.substr(c + 1)));
    }
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_port = htons(port);
    inet_pton(AF_INET, host.c_str(), &sin.sin_addr);
    for (int i = 0; i < MAXNS; ++i) {
      // glibc prefers its IPv6 copies over nsaddr_list; drop them.
      if (state_._u._ext.nsaddrs[i]) {
        free(state_._u._ext.nsaddrs[i]);
        state_._u._ext.nsaddrs[i] = nullptr;
      }
    }
    state_.nsaddr_list[0] = sin;
    state_.nscount = 1;
  }
}

HostResolver::~HostResolver() { res_nclose(&state_); }

Resolution HostResolver::resolve(const std::string& name, uint16_t qtype) {
  std::vector<uint8_t> buf(kMaxDnsPacket);
  int n = res_nquery(&state_, name.c_str(), ns_c_in, qtype, buf.data(), buf.size());
  if (n < 0) {
    Resolution r;
    switch (state_.res_h_errno) {
      case HOST_NOT_FOUND:
        r.rcode = Rcode::nxdomain;
        break;
      case NO_DATA:
        r.rcode = Rcode::noerror;
        break;
      default:
        r.rcode = Rcode::servfail;
        r.error = "upstream resolver failed (h_errno " + std::to_string(state_.res_h_errno) + ")";
    }
    return r;
  }
  // res_nquery returns the answer's full length even when it kept only the
  // first buf.size() bytes (a TCP answer longer than the buffer): parse
  // what is in the buffer, never past it.
  size_t got = std::min(static_cast<size_t>(n), buf.size());
  Resolution r = parse_upstream_answer(std::span(buf.data(), got), qtype);
  if (static_cast<size_t>(n) > buf.size()) {
    if (!r.error.empty()) r.error += "; ";
    r.error += "upstream answer of " + std::to_string(n) + " bytes truncated to " +
               std::to_string(buf.size());
  }
  return r;
}

}  // namespace airlock::net

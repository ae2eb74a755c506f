// The helper's DNS server for its guest: parses the guest's queries, builds
// answers, and resolves allowed names on the host.
//
// Only plain queries are served: QR=0, opcode QUERY, exactly one question of
// class IN, no answer/authority records, a name of uncompressed labels.
// Everything else gets FORMERR (malformed), NOTIMP (other opcodes) or REFUSED
// (other classes); a packet too short to carry an id gets no answer. The
// parser reads at most kMaxDnsPacket bytes and never follows pointers, so it
// is safe on any input (fuzz target: parse_query).
//
// Answers: A and AAAA for allowed names with the (pinned) addresses and their
// TTLs; NOERROR without records for other types of allowed names (the helper
// never forwards TXT/MX/...: no side channel through record data); NXDOMAIN
// for names the policy does not allow — without asking upstream, so random
// subdomains of a denied zone never leave the host.
//
// Resolution uses the C library's resolver (libresolv res_nquery), which
// reads the host's resolver configuration (/etc/resolv.conf) and returns
// TTLs; or, with an explicit upstream server, that server only.
//
//   auto q = parse_query(bytes, &rcode);
//   if (!q) send(build_error(bytes, rcode)); else ...
//   send(build_answer(*q, Rcode::noerror, addrs));
#pragma once

#include <resolv.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/net/pinning.h"

namespace airlock::net {

constexpr size_t kMaxDnsPacket = 4096;

enum class Rcode : uint8_t {
  noerror = 0,
  formerr = 1,
  servfail = 2,
  nxdomain = 3,
  notimp = 4,
  refused = 5
};
const char* to_string(Rcode rc);

enum : uint16_t { kTypeA = 1, kTypeAAAA = 28, kClassIN = 1 };
std::string qtype_name(uint16_t qtype);  // "A", "AAAA", "TXT", else "TYPE65"

struct DnsQuery {
  uint16_t id = 0;
  bool recursion_desired = false;
  std::string qname;            // raw labels joined by '.', bytes as sent (may be invalid)
  bool qname_printable = true;  // false if a label holds '.', or bytes outside 0x21..0x7e
  uint16_t qtype = 0;
  uint16_t qclass = 0;
  std::vector<uint8_t> question;  // the question section as sent, echoed back
  uint16_t edns_udp_size = 0;     // from an OPT record, 0 if none
};

// Parses a guest query. On failure returns nullopt and sets *error to the
// rcode to answer with (formerr/notimp/refused), or to noerror when the
// packet is too short to answer at all.
std::optional<DnsQuery> parse_query(std::span<const uint8_t> packet, Rcode* error);

// A response to `q` with `rcode` and A/AAAA records (those matching qtype)
// for the question name. Records beyond the guest's UDP size (512, or its
// EDNS size up to 1232) are left out rather than truncating (TC): a TCP
// retry would be refused anyway.
std::vector<uint8_t> build_answer(const DnsQuery& q, Rcode rcode,
                                  const std::vector<ResolvedAddr>& addrs);

// An error response echoing the id (and the question if it could be parsed)
// of a packet parse_query rejected; empty if the packet had no id.
std::vector<uint8_t> build_error(std::span<const uint8_t> packet, Rcode rcode);

// Parses an upstream answer (res_nquery's output): the A/AAAA records of the
// answer section (CNAME chains followed by the resolver) and the rcode.
struct Resolution {
  Rcode rcode = Rcode::servfail;
  std::vector<ResolvedAddr> addrs;
  std::string error;  // why, when rcode is servfail; or that the answer was truncated
};
Resolution parse_upstream_answer(std::span<const uint8_t> packet, uint16_t qtype);

// A blocking resolver for one thread: res_ninit at construction (so the
// resolver configuration is read before the helper's seccomp filter is in
// place), then resolve() as often as needed. Not thread-safe: one per worker.
class HostResolver {
 public:
  // `upstream_v4`: "a.b.c.d" or "a.b.c.d:port" to use instead of the host's
  // configured servers (tests, or a deliberate choice); empty for the host's.
  explicit HostResolver(const std::string& upstream_v4 = {});
  ~HostResolver();
  HostResolver(const HostResolver&) = delete;
  HostResolver& operator=(const HostResolver&) = delete;

  // Resolves `name` (normalised) for qtype A or AAAA. Timeouts: 2 s per try, 2 tries.
  Resolution resolve(const std::string& name, uint16_t qtype);

 private:
  struct __res_state state_ {};
};

}  // namespace airlock::net

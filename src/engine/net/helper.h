// airlock-net: the per-sandbox network helper process (see docs/network.md).
//
// One process per sandbox. It listens on a unix socket for QEMU's
// `-netdev stream` connection (QEMU is the client), runs libslirp as the
// guest's network, and passes every guest frame through the Filter
// (filter.h) before slirp sees it. It answers the guest's DNS itself
// (resolver worker threads, res_nquery), reports every DNS question and
// flow decision as a JSON line on its event socket (the daemon connects,
// checks each report and appends it to the journal: intake.h; the helper
// never opens a file after start-up and cannot reach the journal), and
// takes policy updates on a control socket:
//   → {"policy": {"mode": "allowlist", "allow": [...]}}
//   ← {"ok": true, "policy": {...normalised...}, "flows_cut": 1}
//   → {"stats": true}
//   ← {"ok": true, "stats": {"flows": 3, "pins": 5, ...}}
//   ← {"error": {"code": "invalid_argument", "message": "...", "field": "network.allow[0]"}}
//
// Inbound port forwards (slirp_add_hostfwd on 127.0.0.1, to guest 10.0.2.15):
//   → {"port_add": {"guest_port": 8080, "host_port": 0}}   (0 = a free port)
//   ← {"ok": true, "host": "127.0.0.1", "host_port": 40123, "guest_port": 8080}
//   → {"port_remove": {"host_port": 40123}}  ← {"ok": true, ..., "flows_cut": 0}
//   → {"ports": true}  ← {"ok": true, "ports": [{"host", "host_port", "guest_port"}]}
// Errors carry code conflict (port in use / already forwarded), not_found,
// invalid_argument with the field. The daemon records each change (net_port,
// net_policy) from these replies.
//
// Lifecycle: sockets are created and listening, then the helper enters its
// own user + mount namespaces (enter_namespaces) with an empty root
// (hide_filesystem), then prints
// {"ready": true, "pid": N, "confined": {...}} on stdout; the engine starts QEMU after that line.
// The helper accepts one QEMU connection (within accept_timeout), removes the listening socket
// file, drops privileges (no_new_privs, no capabilities, seccomp allowlist) and serves until QEMU
// closes the connection, then records the end of every open flow and exits 0. Exit 2 for bad
// options, 1 for a runtime failure (message on stderr).
//
// QEMU's stream framing: each frame is preceded by its length as a 4-byte
// big-endian integer, both directions.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/net/filter.h"

namespace airlock::net {

struct HelperOptions {
  std::string qemu_socket;     // path to listen on for QEMU
  std::string control_socket;  // path to listen on for control clients ("" = none)
  std::string events_socket;   // path to listen on for the daemon's event stream ("" = none)
  nlohmann::json policy;       // initial policy, the NetworkPolicy JSON form
  std::string dns_upstream;    // "a.b.c.d[:port]" instead of the host's resolv.conf
  bool seccomp = true;
  bool namespaces = true;  // own user + mount namespaces (enter_namespaces)
  int accept_timeout_s = 60;
  int resolver_threads = 4;
  FilterConfig filter;
};

// Splits QEMU's length-prefixed stream into frames.
class StreamDecoder {
 public:
  void append(const uint8_t* data, size_t n);
  // The next complete frame, nullopt if more bytes are needed. Throws
  // Error(protocol_error) for a length of 0 or above kMaxFrame (the stream
  // is out of sync; nothing after it can be trusted).
  std::optional<std::vector<uint8_t>> next();

 private:
  std::vector<uint8_t> buf_;
  size_t pos_ = 0;
};

// Runs the helper; returns the process exit code.
int run_helper(const HelperOptions& options);

// Moves the (still single-threaded) helper into its own user and mount
// namespaces and makes every mount read-only there. Returns what it got,
// {"userns", "mountns", "readonly_mounts"}; when the kernel refuses
// (unprivileged user namespaces disabled, nested limits) it logs a note on
// stderr and the helper continues with no_new_privs + seccomp only. The
// network namespace is NOT changed: slirp needs the host's network.
nlohmann::json enter_namespaces();

// Makes an empty read-only tmpfs the root of the helper's own mount
// namespace (after enter_namespaces, once nothing needs a file any more), so
// no host file (the audit journal, the data directory) is reachable by
// path. False, with a note on stderr, if the kernel refuses.
bool hide_filesystem();

// Installs the helper's seccomp allowlist (all threads) after setting
// no_new_privs and dropping capabilities. Throws Error(internal) on failure.
void lock_down();

}  // namespace airlock::net

// airlock-net: the per-sandbox network helper. See helper.h and docs/network.md.
//
//   airlock-net --qemu-socket RUN/net.sock --control-socket RUN/net-ctl.sock
//               --events-socket RUN/net-events.sock --policy
//               '{"mode":"allowlist","allow":["*.a.com"]}'
#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>
#include <sstream>

#include "common/error.h"
#include "engine/net/helper.h"

int main(int argc, char** argv) {
  CLI::App app{"airlock-net: per-sandbox network helper (libslirp behind an egress policy)"};
  airlock::net::HelperOptions o;
  std::string policy_text, policy_file;
  size_t max_flows = o.filter.max_flows;
  bool no_seccomp = false, no_namespaces = false;
  app.add_option("--qemu-socket", o.qemu_socket, "unix socket to listen on for QEMU -netdev stream")
      ->required();
  app.add_option("--control-socket", o.control_socket,
                 "unix socket for policy updates (JSON lines)");
  app.add_option("--events-socket", o.events_socket,
                 "unix socket to listen on for the daemon's JSON-line event stream");
  app.add_option("--policy", policy_text, "the policy as JSON");
  app.add_option("--policy-file", policy_file, "read the policy JSON from this file");
  app.add_option("--dns-upstream", o.dns_upstream,
                 "resolve with this IPv4 server[:port] instead of the host's resolv.conf");
  app.add_option("--accept-timeout", o.accept_timeout_s, "seconds to wait for QEMU to connect");
  app.add_option("--max-flows", max_flows, "tracked flows at most (beyond: denied)");
  app.add_option("--resolver-threads", o.resolver_threads, "resolver worker threads");
  app.add_flag("--no-seccomp", no_seccomp, "do not install the seccomp filter (debugging)");
  app.add_flag("--no-namespaces", no_namespaces,
               "stay in the caller's user/mount namespaces (debugging)");
  CLI11_PARSE(app, argc, argv);
  o.seccomp = !no_seccomp;
  o.namespaces = !no_namespaces;
  o.filter.max_flows = max_flows;
  try {
    if (!policy_file.empty()) {
      std::ifstream in(policy_file);
      if (!in) throw airlock::Error(airlock::Errc::not_found, "cannot read " + policy_file);
      std::stringstream ss;
      ss << in.rdbuf();
      policy_text = ss.str();
    }
    if (policy_text.empty()) policy_text = R"({"mode":"none"})";
    try {
      o.policy = nlohmann::json::parse(policy_text);
    } catch (const nlohmann::json::exception& e) {
      throw airlock::Error(airlock::Errc::invalid_argument,
                           std::string("--policy is not JSON: ") + e.what(), "network");
    }
    return airlock::net::run_helper(o);
  } catch (const airlock::Error& e) {
    std::cerr << "airlock-net: " << e.what() << "\n";
    return e.code() == airlock::Errc::invalid_argument ? 2 : 1;
  }
}

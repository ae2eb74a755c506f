// The host side of the network helper's process: where its binary is, its
// detached start (it outlives a daemon restart with its VM), the ready line,
// the pid-reuse-safe stop and what identifies it again after a restart.
#include "engine/net/host/helper.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>

#include "common/error.h"
#include "common/process.h"
#include "common/spawn.h"
#include "engine/channel/guest_client.h"
#include "engine/net/policy.h"

namespace airlock::engine::nethost {

namespace fs = std::filesystem;
using SteadyClock = std::chrono::steady_clock;

namespace {

constexpr auto kReadyTimeout = std::chrono::seconds(5);
constexpr auto kKillTimeout = std::chrono::seconds(5);

fs::path net_pid_file(const fs::path& run_dir) { return run_dir / "net.pid"; }
fs::path net_log(const fs::path& run_dir) { return run_dir / "net.log"; }

std::string read_capped(const fs::path& p, size_t cap) {
  std::string s = read_file_capped(p, cap);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

// The helper binary: $AIRLOCK_NET_HELPER, else beside the guest agent (both
// live in build/bin or the install's bin), else beside this executable.
fs::path binary(const fs::path& guest_agent) {
  if (const char* env = std::getenv("AIRLOCK_NET_HELPER"); env && *env) return env;
  std::error_code ec;
  fs::path exe_dir = fs::read_symlink("/proc/self/exe", ec).parent_path();
  for (const fs::path& cand : {guest_agent.parent_path() / "airlock-net", exe_dir / "airlock-net",
                               exe_dir / ".." / "bin" / "airlock-net"}) {
    if (::access(cand.c_str(), X_OK) == 0) return cand.lexically_normal();
  }
  throw Error(Errc::unavailable, "the network helper airlock-net was not found beside " +
                                     guest_agent.parent_path().string() +
                                     " (set AIRLOCK_NET_HELPER)");
}

nlohmann::json normalize(const nlohmann::json& policy) {
  // parse() names the offending entry ("network.allow[2]") in its Error.
  return net::NetworkPolicy::parse(policy).to_json();
}

bool enabled(const nlohmann::json& policy) {
  return policy.is_object() && policy.value("mode", "none") != "none";
}

std::string mac_for(const std::string& id) {
  // 52:54:00 is QEMU's prefix; the rest from the id's random hex digits, so
  // every sandbox has a stable, distinct-enough MAC (it only matters inside
  // the sandbox's own one-host network).
  std::string hex;
  for (char c : id)
    if (std::isxdigit(static_cast<unsigned char>(c))) hex += c;
  while (hex.size() < 6) hex = "0" + hex;
  hex = hex.substr(hex.size() - 6);
  return "52:54:00:" + hex.substr(0, 2) + ":" + hex.substr(2, 2) + ":" + hex.substr(4, 2);
}

bool is_ours(pid_t pid, const fs::path& run_dir) {
  // Pid-reuse guard: the helper's command line names this run_dir's control socket.
  return alive_with_arg(pid, (run_dir / "net-ctl.sock").string());
}

pid_t read_pid(const fs::path& run_dir) {
  std::string s = read_capped(net_pid_file(run_dir), 32);
  try {
    return s.empty() ? 0 : static_cast<pid_t>(std::stoi(s));
  } catch (const std::exception&) {
    return 0;
  }
}

void stop(pid_t pid, const fs::path& run_dir) {
  if (pid <= 0) pid = read_pid(run_dir);
  if (pid > 0) {
    if (is_ours(pid, run_dir)) ::kill(pid, SIGKILL);
    if (!wait_gone(pid, kKillTimeout))
      spdlog::error("network helper pid {} did not exit within 5 s of SIGKILL", pid);
  }
  std::error_code ec;
  for (const char* f : {"net.sock", "net-ctl.sock", "net-events.sock", "net.pid"})
    fs::remove(run_dir / f, ec);
}

pid_t start(const fs::path& guest_agent, const fs::path& run_dir, const nlohmann::json& policy) {
  std::string exe = binary(guest_agent).string();
  std::error_code ec;
  for (const char* f : {"net.sock", "net-ctl.sock", "net-events.sock"}) fs::remove(run_dir / f, ec);
  // No journal path: the helper reports on net-events.sock and the daemon
  // appends (EventReader); the helper cannot reach the journal at all.
  std::vector<std::string> argv = {exe,
                                   "--qemu-socket",
                                   (run_dir / "net.sock").string(),
                                   "--control-socket",
                                   (run_dir / "net-ctl.sock").string(),
                                   "--events-socket",
                                   (run_dir / "net-events.sock").string(),
                                   "--policy",
                                   policy.dump()};
  // Lets a deployment (or a test's private namespace) point the helper's
  // resolver at a chosen server instead of the host's resolv.conf.
  if (const char* up = std::getenv("AIRLOCK_NET_DNS_UPSTREAM"); up && *up)
    argv.insert(argv.end(), {"--dns-upstream", up});
  // Created afresh without following a name the jail may have planted.
  int log = create_file_nofollow(net_log(run_dir), 0640);
  int out[2] = {-1, -1};
  auto close_all = [&] {
    for (int fd : {log, out[0], out[1]})
      if (fd >= 0) ::close(fd);
  };
  if (log < 0 || ::pipe2(out, O_CLOEXEC) != 0) {
    int err = errno;
    close_all();
    throw Error(Errc::internal,
                std::string("cannot set up the network helper: ") + std::strerror(err));
  }
  // Detached like QEMU (common/spawn.h): the helper must outlive a daemon
  // restart together with its VM. Its stdout is the ready line's pipe.
  pid_t pid = 0;
  try {
    pid = spawn_detached({.argv = argv, .fds = {{1, out[1]}, {2, log}}});
  } catch (const Error&) {
    close_all();
    throw;
  }
  ::close(out[1]);
  out[1] = -1;

  // The ready line (or EOF when the helper exits: bad policy, socket error).
  std::string line;
  auto deadline = SteadyClock::now() + kReadyTimeout;
  bool ready = false;
  while (pid > 0 && !ready) {
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
    if (left.count() <= 0) break;
    pollfd p{out[0], POLLIN, 0};
    int rc = ::poll(&p, 1, static_cast<int>(left.count()));
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) break;
    char buf[256];
    ssize_t r = ::read(out[0], buf, sizeof buf);
    if (r <= 0) break;
    line.append(buf, static_cast<size_t>(r));
    auto nl = line.find('\n');
    if (nl == std::string::npos) continue;
    try {
      ready = nlohmann::json::parse(line.substr(0, nl)).value("ready", false);
    } catch (const nlohmann::json::exception&) {
    }
    break;
  }
  close_all();
  if (!ready) {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      wait_gone(pid, kKillTimeout);
    }
    std::string why = read_capped(net_log(run_dir), 2048);
    for (const char* f : {"net.sock", "net-ctl.sock", "net-events.sock", "net.log"})
      fs::remove(run_dir / f, ec);
    throw Error(Errc::internal,
                "the network helper did not start" + (why.empty() ? std::string() : ": " + why));
  }
  // Recorded so a restarted daemon can find (and later kill) the helper.
  std::ofstream(net_pid_file(run_dir)) << pid << "\n";
  return pid;
}

nlohmann::json hello_network(const std::string& id) {
  // slirp's fixed addresses (the helper's virtual network), IPv4 and IPv6,
  // and the MAC: a VM restored from a template keeps the template's MAC
  // unless the agent sets this one.
  return channel::hello_network_json({.address = "10.0.2.15/24",
                                      .gateway = "10.0.2.2",
                                      .dns = "10.0.2.3",
                                      .address6 = "fec0::15/64",
                                      .gateway6 = "fec0::2",
                                      .mac = mac_for(id)});
}

}  // namespace airlock::engine::nethost

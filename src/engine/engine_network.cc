// The engine's side of a sandbox's network (issue 4, docs/network.md): the
// policy check at create, the airlock-net helper process (detached start,
// ready line, pid-reuse-safe kill, re-adoption), its event stream (read,
// checked and journaled here: NetEventReader), its control socket
// (set_network, ports) and the net_* records of the journal (network_events).
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>

#include "common/error.h"
#include "common/process.h"
#include "common/spawn.h"
#include "engine/channel/guest_client.h"
#include "engine/engine.h"
#include "engine/engine_impl.h"
#include "engine/net/intake.h"
#include "engine/net/policy.h"

namespace airlock::engine {

namespace fs = std::filesystem;
using SteadyClock = std::chrono::steady_clock;

namespace {

constexpr auto kReadyTimeout = std::chrono::seconds(5);
constexpr auto kControlTimeout = std::chrono::seconds(5);
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
fs::path net_helper_binary(const Config& cfg) {
  if (const char* env = std::getenv("AIRLOCK_NET_HELPER"); env && *env) return env;
  std::error_code ec;
  fs::path exe_dir = fs::read_symlink("/proc/self/exe", ec).parent_path();
  for (const fs::path& cand : {cfg.guest_agent.parent_path() / "airlock-net",
                               exe_dir / "airlock-net", exe_dir / ".." / "bin" / "airlock-net"}) {
    if (::access(cand.c_str(), X_OK) == 0) return cand.lexically_normal();
  }
  throw Error(Errc::unavailable, "the network helper airlock-net was not found beside " +
                                     cfg.guest_agent.parent_path().string() +
                                     " (set AIRLOCK_NET_HELPER)");
}

nlohmann::json normalize_network(const nlohmann::json& policy) {
  // parse() names the offending entry ("network.allow[2]") in its Error.
  return net::NetworkPolicy::parse(policy).to_json();
}

bool network_enabled(const nlohmann::json& policy) {
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

bool is_our_net_helper(pid_t pid, const fs::path& run_dir) {
  // Pid-reuse guard: the helper's command line names this run_dir's control socket.
  return alive_with_arg(pid, (run_dir / "net-ctl.sock").string());
}

pid_t read_net_pid(const fs::path& run_dir) {
  std::string s = read_capped(net_pid_file(run_dir), 32);
  try {
    return s.empty() ? 0 : static_cast<pid_t>(std::stoi(s));
  } catch (const std::exception&) {
    return 0;
  }
}

void kill_net_helper(pid_t pid, const fs::path& run_dir) {
  if (pid <= 0) pid = read_net_pid(run_dir);
  if (pid > 0) {
    if (is_our_net_helper(pid, run_dir)) ::kill(pid, SIGKILL);
    if (!wait_gone(pid, kKillTimeout))
      spdlog::error("network helper pid {} did not exit within 5 s of SIGKILL", pid);
  }
  std::error_code ec;
  for (const char* f : {"net.sock", "net-ctl.sock", "net-events.sock", "net.pid"})
    fs::remove(run_dir / f, ec);
}

pid_t start_net_helper(const Config& cfg, const std::string& /*id*/, const fs::path& run_dir,
                       const nlohmann::json& policy) {
  std::string exe = net_helper_binary(cfg).string();
  std::error_code ec;
  for (const char* f : {"net.sock", "net-ctl.sock", "net-events.sock"}) fs::remove(run_dir / f, ec);
  // No journal path: the helper reports on net-events.sock and the daemon
  // appends (NetEventReader); the helper cannot reach the journal at all.
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

// ---- the helper's event stream (docs/network.md "Event intake") ----

class NetEventReader {
 public:
  NetEventReader(AuditJournal& journal, std::string id, fs::path run_dir, pid_t pid,
                 EngineMetrics* metrics)
      : journal_(journal),
        metrics_(metrics),
        id_(std::move(id)),
        run_dir_(std::move(run_dir)),
        pid_(pid) {
    if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) throw_errno("pipe2");
    thread_ = std::thread([this] { run(); });
  }
  ~NetEventReader() {
    stop_ = true;
    char c = 1;
    (void)!::write(wake_[1], &c, 1);
    thread_.join();
    ::close(wake_[0]);
    ::close(wake_[1]);
  }
  std::atomic<uint64_t> bytes_out{0}, bytes_in{0};  // of ended flows (stats)
  NetEventReader(const NetEventReader&) = delete;
  NetEventReader& operator=(const NetEventReader&) = delete;

 private:
  // A connection to the helper's event socket, or -1. The peer must be the
  // helper process itself (SO_PEERCRED): a socket file someone else put in
  // the run dir is refused.
  int connect_checked() {
    fs::path path = run_dir_ / "net-events.sock";
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (path.string().size() >= sizeof addr.sun_path) return -1;
    std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      ::close(fd);
      return -1;
    }
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.pid != pid_) {
      if (!warned_peer_)
        spdlog::warn("sandbox {}: {} is served by pid {}, not its network helper {}: ignored", id_,
                     path.string(), cred.pid, pid_);
      warned_peer_ = true;
      ::close(fd);
      return -1;
    }
    return fd;
  }

  void append(const std::vector<net::EventIntake::Record>& records) {
    for (const auto& r : records) {
      try {
        if (metrics_) metrics_->net_event(r.event, r.fields);  // checked records only
        if (r.event == "net_flow_end") {
          auto num = [&](const char* k) {
            auto it = r.fields.find(k);
            return it != r.fields.end() && it->is_number_unsigned() ? it->get<uint64_t>() : 0;
          };
          bytes_out += num("bytes_out");
          bytes_in += num("bytes_in");
        }
        journal_.append(id_, r.event, r.fields);
      } catch (const std::exception& e) {
        spdlog::error("sandbox {}: cannot journal {}: {}", id_, r.event, e.what());
      }
    }
  }

  // Reads what `fd` has now; false at EOF/error.
  bool read_some(int fd, bool nonblocking) {
    char buf[65536];
    ssize_t n = ::recv(fd, buf, sizeof buf, nonblocking ? MSG_DONTWAIT : 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
    if (n <= 0) return false;
    append(intake_.feed(std::string_view(buf, static_cast<size_t>(n))));
    return true;
  }

  void run() {
    int fd = -1;
    bool gone = false;  // the helper is dead: nothing more will come
    while (!stop_) {
      if (fd < 0 && !gone) {
        fd = connect_checked();
        if (fd < 0 && !is_our_net_helper(pid_, run_dir_)) gone = true;
      }
      pollfd p[2] = {{wake_[0], POLLIN, 0}, {fd, POLLIN, 0}};
      int rc = ::poll(p, fd >= 0 ? 2 : 1, fd >= 0 ? 1000 : 200);
      if (stop_) break;
      if (rc > 0 && fd >= 0 && (p[1].revents & (POLLIN | POLLHUP | POLLERR)) &&
          !read_some(fd, false)) {
        // The helper exited, or a newer connection replaced this one.
        ::close(fd);
        fd = -1;
      }
      append(intake_.tick());
    }
    // Teardown killed the helper first: what it wrote before is still in
    // the socket; take it (bounded), then the final summary.
    if (fd >= 0) {
      for (int i = 0; i < 256 && read_some(fd, true);) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 0) <= 0) break;
        ++i;
      }
      ::close(fd);
    }
    append(intake_.flush());
  }

  AuditJournal& journal_;
  EngineMetrics* metrics_;  // may be null (tests)
  std::string id_;
  fs::path run_dir_;
  pid_t pid_;
  net::EventIntake intake_;
  int wake_[2] = {-1, -1};
  std::atomic<bool> stop_{false};
  bool warned_peer_ = false;
  std::thread thread_;
};

std::pair<uint64_t, uint64_t> net_flow_bytes(const NetEventReader& reader) {
  return {reader.bytes_out.load(), reader.bytes_in.load()};
}

std::shared_ptr<NetEventReader> attach_net_events(AuditJournal& journal, const std::string& id,
                                                  const fs::path& run_dir, pid_t helper_pid,
                                                  EngineMetrics* metrics) {
  if (helper_pid <= 0) return nullptr;
  return std::make_shared<NetEventReader>(journal, id, run_dir, helper_pid, metrics);
}

nlohmann::json net_control(const fs::path& run_dir, const nlohmann::json& request) {
  fs::path path = run_dir / "net-ctl.sock";
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw_errno("socket");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    int err = errno;
    ::close(fd);
    throw Error(Errc::unavailable, "the sandbox's network helper is not reachable: " +
                                       std::string(std::strerror(err)));
  }
  std::string msg = request.dump() + "\n";
  size_t done = 0;
  while (done < msg.size()) {
    ssize_t n = ::send(fd, msg.data() + done, msg.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      throw Error(Errc::unavailable, "the network helper closed its control socket");
    }
    done += static_cast<size_t>(n);
  }
  std::string reply;
  auto deadline = SteadyClock::now() + kControlTimeout;
  while (reply.find('\n') == std::string::npos) {
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
    pollfd p{fd, POLLIN, 0};
    int rc = left.count() > 0 ? ::poll(&p, 1, static_cast<int>(left.count())) : 0;
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) {
      ::close(fd);
      throw Error(Errc::timeout, "the network helper did not answer within 5 s");
    }
    char buf[4096];
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) {
      ::close(fd);
      throw Error(Errc::unavailable, "the network helper closed its control socket");
    }
    reply.append(buf, static_cast<size_t>(n));
    if (reply.size() > (1 << 20)) break;
  }
  ::close(fd);
  try {
    return nlohmann::json::parse(reply.substr(0, reply.find('\n')));
  } catch (const nlohmann::json::exception& e) {
    throw Error(Errc::internal, std::string("the network helper's reply is not JSON: ") + e.what());
  }
}

bool net_helper_alive(const Live& sb) {
  // Mode none has no helper; a re-adopted sandbox whose helper was already
  // gone has net_pid 0 and was recorded then (adopted.net_pid = null).
  pid_t pid;
  {
    std::lock_guard lock(const_cast<Live&>(sb).mu);
    pid = sb.net_pid;
  }
  if (pid <= 0 || !sb.networked) return true;
  return is_our_net_helper(pid, sb.run_dir());
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

namespace {

// The helper's error reply as an Error with the same code and field.
[[noreturn]] void throw_helper_error(const nlohmann::json& e, const std::string& fallback) {
  std::string code = e.value("code", "internal");
  Errc c = Errc::internal;
  for (Errc x : {Errc::invalid_argument, Errc::not_found, Errc::conflict, Errc::unavailable})
    if (code == to_string(x)) c = x;
  throw Error(c, e.value("message", fallback), e.value("field", std::string()));
}

// Conflict naming why if the sandbox has no network.
std::shared_ptr<Live> networked(std::shared_ptr<Live> sb, const std::string& id, const char* what) {
  if (!sb->networked)
    throw Error(Errc::conflict, "sandbox " + id +
                                    " was created with network mode \"none\": it has no network "
                                    "interface to " +
                                    what);
  return sb;
}

// Whether nothing holds 127.0.0.1:port right now (a hint: the helper's own
// bind decides).
bool loopback_port_free(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
  ::close(fd);
  return ok;
}

// Asks the helper for one forward; the reply (an error included).
nlohmann::json port_add_request(Live& sb, int guest_port, int host_port) {
  return net_control(sb.run_dir(),
                     {{"port_add", {{"guest_port", guest_port}, {"host_port", host_port}}}});
}

}  // namespace

nlohmann::json Engine::add_port(const std::string& id, int guest_port, int host_port) {
  if (guest_port < 1 || guest_port > 65535)
    throw Error(Errc::invalid_argument,
                "guest_port must be 1..65535, got " + std::to_string(guest_port), "guest_port");
  const int lo = impl_->cfg.port_forward_min, hi = impl_->cfg.port_forward_max;
  const std::string range = std::to_string(lo) + "-" + std::to_string(hi);
  if (host_port != 0 && (host_port < lo || host_port > hi))
    throw Error(Errc::invalid_argument,
                "host_port must be in this daemon's forward range " + range +
                    " (airlockd --port-forward-range) or 0 (a free port there), got " +
                    std::to_string(host_port),
                "host_port");
  auto sb = networked(impl_->running(id), id, "forward a port to");
  std::lock_guard net_lock(sb->net_mu);
  nlohmann::json reply;
  if (host_port != 0) {
    reply = port_add_request(*sb, guest_port, host_port);
  } else {
    // A free port of the range, never one the kernel would pick anywhere:
    // from a random place in it, the ports that look free, a few tries.
    int span = hi - lo + 1, tries = 0;
    int start =
        static_cast<int>(std::chrono::steady_clock::now().time_since_epoch().count() % span);
    for (int i = 0; i < span && tries < 8; ++i) {
      int candidate = lo + (start + i) % span;
      if (!loopback_port_free(candidate)) continue;
      ++tries;
      reply = port_add_request(*sb, guest_port, candidate);
      // Taken meanwhile, or forwarded already by this sandbox: the next one.
      if (!reply.contains("error") || reply["error"].value("field", "") != "host_port") break;
    }
    if (reply.is_null() ||
        (reply.contains("error") && reply["error"].value("field", "") == "host_port"))
      throw Error(Errc::unavailable, "no free host port left in the forward range " + range +
                                         " (airlockd --port-forward-range)");
  }
  if (reply.contains("error")) throw_helper_error(reply["error"], "the network helper refused");
  auto port = reply.find("host_port");
  if (port == reply.end() || !port->is_number_integer() || *port < 1024 || *port > 65535 ||
      (host_port != 0 && *port != host_port))
    throw Error(Errc::internal, "the network helper's port_add reply has no valid host_port");
  int chosen = port->get<int>();
  // Recorded by the daemon (what it asked for and the port it got), not the helper.
  impl_->journal.append(id, "net_port",
                        {{"action", "add"},
                         {"host", "127.0.0.1"},
                         {"host_port", chosen},
                         {"guest_port", guest_port}});
  return {{"host", "127.0.0.1"}, {"host_port", chosen}, {"guest_port", guest_port}};
}

nlohmann::json Engine::list_ports(const std::string& id) {
  auto sb = networked(impl_->running(id), id, "forward ports to");
  std::lock_guard net_lock(sb->net_mu);
  auto reply = net_control(sb->run_dir(), {{"ports", true}});
  if (reply.contains("error")) throw_helper_error(reply["error"], "the network helper refused");
  return reply.value("ports", nlohmann::json::array());
}

void Engine::remove_port(const std::string& id, int host_port) {
  if (host_port < 1 || host_port > 65535)
    throw Error(Errc::invalid_argument, "host_port must be 1..65535", "host_port");
  auto sb = networked(impl_->running(id), id, "forward ports to");
  std::lock_guard net_lock(sb->net_mu);
  auto reply = net_control(sb->run_dir(), {{"port_remove", {{"host_port", host_port}}}});
  if (reply.contains("error")) throw_helper_error(reply["error"], "the network helper refused");
  nlohmann::json rec{{"action", "remove"}, {"host", "127.0.0.1"}, {"host_port", host_port}};
  if (auto g = reply.find("guest_port"); g != reply.end() && g->is_number_unsigned() && *g <= 65535)
    rec["guest_port"] = *g;
  if (auto c = reply.find("flows_cut"); c != reply.end() && c->is_number_unsigned())
    rec["flows_cut"] = *c;
  impl_->journal.append(id, "net_port", rec);
}

nlohmann::json Engine::set_network(const std::string& id, const nlohmann::json& policy) {
  auto& impl = *impl_;
  auto sb = impl.running(id);
  nlohmann::json normal = normalize_network(policy);  // field-named errors before any change
  std::lock_guard net_lock(sb->net_mu);               // one policy change at a time per sandbox
  if (!sb->networked)
    throw Error(Errc::conflict, "sandbox " + id +
                                    " was created with network mode \"none\": it has no network "
                                    "interface to apply a policy to");
  nlohmann::json reply = net_control(sb->run_dir(), {{"policy", normal}});
  if (reply.contains("error")) {
    const auto& e = reply["error"];
    std::string code = e.value("code", "internal");
    throw Error(code == "invalid_argument" ? Errc::invalid_argument : Errc::internal,
                e.value("message", std::string("the network helper refused the policy")),
                e.value("field", std::string()));
  }
  // The policy the daemon validated, not the helper's echo of it.
  auto cut = reply.find("flows_cut");
  nlohmann::json result{
      {"policy", normal},
      {"flows_cut", cut != reply.end() && cut->is_number_unsigned() ? cut->get<uint64_t>() : 0}};
  sb->set_network(result["policy"]);
  // Only the spec column is written, never the state: a sandbox destroyed
  // while the helper answered stays deleted (and the caller hears so).
  if (State st = sb->state(); st != State::running)
    throw Error(Errc::conflict,
                "sandbox " + id + " was stopped (" + to_string(st) + ") during the policy change");
  impl.registry.set_spec(id, sb->info().spec);
  // net_policy for the network events stream, network_changed for the
  // lifecycle; both written by the daemon, from the policy it validated.
  impl.journal.append(id, "net_policy", {{"policy", result["policy"]}});
  impl.journal.append(id, "network_changed", result, Durability::sync);
  return result;
}

// The net_* records through a JournalReader: one pass, from its offset on
// (audit/journal.h), so a follower never re-reads the journal.
std::unique_ptr<RecordFollower> Engine::follow_network_events(const std::string& id) {
  auto reader = std::make_unique<JournalReader>(impl_->journal.reader(id, "net_"));
  // A sandbox that exists but has not written a journal line yet follows
  // from nothing; an id that names neither is not_found.
  if (!reader->exists() && !impl_->registry.get(id))
    throw Error(Errc::not_found, "no audit journal for sandbox " + id, "id");
  return reader;
}

std::vector<nlohmann::json> Engine::network_events(const std::string& id, size_t skip) {
  std::vector<nlohmann::json> out = follow_network_events(id)->next();
  out.erase(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(std::min(skip, out.size())));
  return out;
}

}  // namespace airlock::engine

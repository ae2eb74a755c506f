// The engine's network operations (docs/network.md): a running sandbox's
// policy change and port forwards, through the helper's control socket
// (net/host/control.h), and the net_* records of the journal.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>

#include "common/error.h"
#include "engine/engine.h"
#include "engine/engine_impl.h"
#include "engine/net/host/control.h"
#include "engine/net/host/helper.h"

namespace airlock::engine {

namespace {

// Conflict naming why if the sandbox has no network.
std::shared_ptr<Sandbox> networked(std::shared_ptr<Sandbox> sb, const std::string& id,
                                   const char* what) {
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
  auto sb = networked(impl_->table.running(id), id, "forward a port to");
  std::lock_guard net_lock(sb->net_mu);
  nethost::Control control(sb->run_dir());
  int chosen = 0;
  if (host_port != 0) {
    chosen = control.add_port(guest_port, host_port);
    if (chosen != host_port)
      throw Error(Errc::internal, "the network helper's port_add reply has no valid host_port");
  } else {
    // A free port of the range, never one the kernel would pick anywhere:
    // from a random place in it, the ports that look free, a few tries.
    int span = hi - lo + 1, tries = 0;
    int start =
        static_cast<int>(std::chrono::steady_clock::now().time_since_epoch().count() % span);
    for (int i = 0; i < span && tries < 8 && chosen == 0; ++i) {
      int candidate = lo + (start + i) % span;
      if (!loopback_port_free(candidate)) continue;
      ++tries;
      try {
        chosen = control.add_port(guest_port, candidate);
      } catch (const Error& e) {
        // Taken meanwhile, or forwarded already by this sandbox: the next one.
        if (e.field() != "host_port") throw;
      }
    }
    if (chosen == 0)
      throw Error(Errc::unavailable, "no free host port left in the forward range " + range +
                                         " (airlockd --port-forward-range)");
  }
  // Recorded by the daemon (what it asked for and the port it got), not the helper.
  impl_->journal.append(id, "net_port",
                        {{"action", "add"},
                         {"host", "127.0.0.1"},
                         {"host_port", chosen},
                         {"guest_port", guest_port}});
  return {{"host", "127.0.0.1"}, {"host_port", chosen}, {"guest_port", guest_port}};
}

nlohmann::json Engine::list_ports(const std::string& id) {
  auto sb = networked(impl_->table.running(id), id, "forward ports to");
  std::lock_guard net_lock(sb->net_mu);
  return nethost::Control(sb->run_dir()).ports();
}

void Engine::remove_port(const std::string& id, int host_port) {
  if (host_port < 1 || host_port > 65535)
    throw Error(Errc::invalid_argument, "host_port must be 1..65535", "host_port");
  auto sb = networked(impl_->table.running(id), id, "forward ports to");
  std::lock_guard net_lock(sb->net_mu);
  nethost::PortRemoved removed = nethost::Control(sb->run_dir()).remove_port(host_port);
  nlohmann::json rec{{"action", "remove"}, {"host", "127.0.0.1"}, {"host_port", host_port}};
  if (removed.guest_port) rec["guest_port"] = *removed.guest_port;
  if (removed.flows_cut) rec["flows_cut"] = *removed.flows_cut;
  impl_->journal.append(id, "net_port", rec);
}

nlohmann::json Engine::set_network(const std::string& id, const nlohmann::json& policy) {
  auto& impl = *impl_;
  auto sb = impl.table.running(id);
  nlohmann::json normal = nethost::normalize(policy);  // field-named errors before any change
  std::lock_guard net_lock(sb->net_mu);                // one policy change at a time per sandbox
  if (!sb->networked)
    throw Error(Errc::conflict, "sandbox " + id +
                                    " was created with network mode \"none\": it has no network "
                                    "interface to apply a policy to");
  uint64_t cut = nethost::Control(sb->run_dir()).set_policy(normal);
  // The policy the daemon validated, not the helper's echo of it.
  nlohmann::json result{{"policy", normal}, {"flows_cut", cut}};
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

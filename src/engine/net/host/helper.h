// The host side of the airlock-net helper process (docs/network.md): one
// detached helper per networked sandbox, started before its QEMU, found
// again by a restarted daemon through run_dir/net.pid, stopped pid-reuse
// safely. The engine's lifecycle, pause and pool call these; the helper's
// wire formats stay in this folder (control.h, events.h).
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

namespace airlock::engine::nethost {

// The policy in its normalised form; Error(invalid_argument, field
// "network.allow[i]" ...) for a bad one.
nlohmann::json normalize(const nlohmann::json& policy);
// True if `policy` (normalised) gives the VM a NIC (mode != none).
bool enabled(const nlohmann::json& policy);
// The airlock-net binary ($AIRLOCK_NET_HELPER, else beside the guest agent
// `guest_agent` or this executable); Error(unavailable) if it cannot be found.
std::filesystem::path binary(const std::filesystem::path& guest_agent);
// The sandbox's NIC MAC, derived from its id.
std::string mac_for(const std::string& id);
// hello's "network" object for a networked sandbox: slirp's IPv4 and IPv6
// addresses and the NIC's MAC (mac_for(id)); see api/guest-protocol.md.
nlohmann::json hello_network(const std::string& id);
// Starts airlock-net detached (it survives a daemon restart) for the sandbox
// whose run dir is `run_dir` and waits for its ready line (5 s). Writes
// run_dir/net.pid. On failure nothing is left and Error says why (with the
// helper's stderr). The helper has no access to the journal: its events
// come through attach_events (events.h).
pid_t start(const std::filesystem::path& guest_agent, const std::filesystem::path& run_dir,
            const nlohmann::json& policy);
// True if `pid` is alive and is the helper of `run_dir` (pid-reuse safe).
bool is_ours(pid_t pid, const std::filesystem::path& run_dir);
// run_dir/net.pid, 0 if none.
pid_t read_pid(const std::filesystem::path& run_dir);
// SIGKILLs the helper (`pid`, or net.pid's if 0) if it is still ours, waits
// until it is gone, removes its sockets and pid file. Never throws.
void stop(pid_t pid, const std::filesystem::path& run_dir);

}  // namespace airlock::engine::nethost

// The jail of a running process as read back from /proc (and its cgroup
// files), not as it was intended: what `airlock inspect ID --posture` shows.
//
//   nlohmann::json p = read_posture(vm->pid());
//   p["missing"]   // e.g. ["uid", "cgroup_memory"]: protections not in force
//
// Read as the daemon: the namespaces are compared with the daemon's own
// (/proc/self/ns), the root with the daemon's "/".
#pragma once

#include <sys/types.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace airlock::vmm {

// {"pid", "uid": {"real","effective"}, "gid": {...},
//  "capabilities": {"effective","permitted","bounding","ambient"} (hex strings as in /proc),
//  "seccomp": 0|1|2, "no_new_privs": bool,
//  "namespaces": {"mnt": {"id": "mnt:[...]", "own": bool}, ...pid, ipc, uts, net, user, cgroup},
//  "root": {"own": bool, "entries": [top-level names]},
//  "cgroup": read_cgroup_limits(pid),
//  "rlimits": {"core": {"soft","hard"}, "nofile", "nproc", "fsize"} (null = unlimited),
//  "missing": posture_missing(...)}
// Error(not_found) if the process is gone.
nlohmann::json read_posture(pid_t pid);

// The protections a posture (read_posture's form, without "missing") lacks:
// "uid" (runs as root), "capabilities" (CapEff != 0), "capability_bounding_set",
// "seccomp" (mode != 2), "no_new_privs", "<ns>_namespace" for mnt/pid/ipc/
// uts/net shared with the daemon, "root" (sees the host's /), "cgroup_memory",
// "cgroup_pids", "cgroup_cpu" (no limit), "rlimit_core", "rlimit_nofile",
// "rlimit_fsize" (unlimited). Pure: unit-tested on hand-made postures.
std::vector<std::string> posture_missing(const nlohmann::json& posture);

}  // namespace airlock::vmm

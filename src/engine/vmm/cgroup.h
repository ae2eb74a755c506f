// Per-sandbox control groups for the jailed QEMU: memory, pids and cpu
// limits, on cgroup v2 or (hybrid hosts) the v1 hierarchies.
//
// Layout: one directory per sandbox under a daemon-owned "airlock" parent.
//   v2: <unified mount>/airlock/<id>             (memory.max, pids.max, cpu.max)
//   v1: <mount of each controller>/<the daemon's own cgroup there>/airlock/<id>
//       (memory.limit_in_bytes, pids.max, cpu.cfs_quota_us/cpu.cfs_period_us)
// On v1 the parent sits inside the daemon's own cgroup so whatever limits
// the daemon itself lives under still bound its sandboxes; v2 forbids
// processes in inner nodes, so there the parent is at the root.
//
//   auto dirs = create_sandbox_cgroup("sb1", {.memory_bytes = 512 << 20, .pids = 512, .cpus = 2});
//   // the child writes "0" into <dir>/cgroup.procs of each before exec
//   remove_cgroup_dirs(dirs);                    // after the process is gone
//   nlohmann::json j = read_cgroup_limits(pid);   // what is in force, read back
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace airlock::vmm {

struct CgroupLimits {
  uint64_t memory_bytes = 0;  // memory.max (v1: memory.limit_in_bytes); 0 = no limit
  int pids = 0;               // pids.max; 0 = no limit
  int cpus = 0;               // cpu.max = cpus * period; 0 = no limit
  // Share of the CPU against the other sandboxes when the CPU is contended,
  // on cgroup v2's scale (cpu.weight: 1..10000, default 100; v1:
  // cpu.shares = weight * 1024 / 100); 0 = the default.
  int cpu_weight = 0;
};

inline constexpr int kDefaultCpuWeight = 100;

// Which of memory/pids/cpu this host can limit (cached); empty if none
// (no cgroup filesystem, or not writable by us).
std::vector<std::string> cgroup_controllers_available();

// Creates the sandbox's cgroup directory in every hierarchy that has one of
// memory/pids/cpu and writes the limits. Returns the directories (each has a
// cgroup.procs). A leftover directory of the same id is reused if empty.
// Throws Error(unavailable) naming the file that could not be written; then
// nothing is left.
std::vector<std::filesystem::path> create_sandbox_cgroup(const std::string& id,
                                                         const CgroupLimits& limits);

// Sets the cpu weight (CgroupLimits::cpu_weight's scale, 1..10000) of
// sandbox `id`'s cgroup: a warm-pool member waits at a low weight and gets
// the default at hand-out (one write). Error(invalid_argument) for a weight
// out of range or a bad id, Error(unavailable) if the file cannot be
// written; false (nothing done) where no cpu controller is ours.
bool set_sandbox_cpu_weight(const std::string& id, int weight);

// rmdir each (retrying up to 2 s: a killed task leaves its cgroup a moment
// after it is reaped). Never throws; returns the ones that could not go.
std::vector<std::filesystem::path> remove_cgroup_dirs(
    const std::vector<std::filesystem::path>& dirs);

// The cgroup of `pid` and its limits as read from the cgroup files:
// {"version": 1|2, "paths": {"memory": "/sys/fs/cgroup/...", ...},
//  "memory_max": bytes|null, "pids_max": n|null, "cpu_max": "quota period"|null,
//  "cpu_weight": 1..10000|null (v1: from cpu.shares)}
// null = no limit ("max") or the controller is not mounted.
nlohmann::json read_cgroup_limits(pid_t pid);

}  // namespace airlock::vmm

// The bounds of the public API, in one table: what validation enforces and
// what every door states (api/openapi.yaml, the MCP tools' input schemas,
// the E2B layer, GET /v1/info's "limits"). A test (test_spec.py, "limits")
// reads the schemas and checks they say exactly what this table says, so a
// bound is changed here and nowhere else.
//
//   check_range(spec.cpus, limits::kCpus, "cpus");      // validate.cc
//   {"maximum", limits::kCpus.max}                      // tool_defs.cc
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

namespace airlock::engine::limits {

struct Range {
  int64_t min, max;
  constexpr bool contains(int64_t v) const { return v >= min && v <= max; }
};

// A sandbox's shape and lifetime (create, the pool, E2B, MCP).
inline constexpr Range kCpus{1, 16};
inline constexpr Range kMemoryMb{64, 65536};
inline constexpr Range kDiskMb{1, 1048576};
inline constexpr Range kTimeoutS{1, 604800};      // one week
inline constexpr Range kIdleTimeoutS{0, 604800};  // 0 = never
// One exec: its timeout (0 = none) and a terminal's size.
inline constexpr Range kExecTimeoutS{0, 604800};
inline constexpr Range kPtyCells{1, 4096};  // cols and rows each
// An exec's own cgroup ("limits": pids.max, memory.max).
inline constexpr Range kExecPids{1, 1048576};
inline constexpr Range kExecMemoryMb{1, 1048576};
// Warm pool members per image.
inline constexpr Range kPoolSize{0, 64};

// Sizes of free-form input.
inline constexpr size_t kMaxMapEntries = 128;  // env, metadata
inline constexpr size_t kMaxKeyBytes = 256;
inline constexpr size_t kMaxEnvValueBytes = 32 * 1024;
inline constexpr size_t kMaxMetadataValueBytes = 1024;
inline constexpr size_t kMaxArgvBytes = 256 * 1024;  // argv + env of one exec
inline constexpr size_t kMaxPathBytes = 4096;

struct Named {
  std::string_view name;  // the field as the native API names it
  Range range;
};
inline constexpr std::array kRanges = {
    Named{"cpus", kCpus},
    Named{"memory_mb", kMemoryMb},
    Named{"disk_mb", kDiskMb},
    Named{"timeout", kTimeoutS},
    Named{"idle_timeout", kIdleTimeoutS},
    Named{"exec_timeout", kExecTimeoutS},
    Named{"pty_cells", kPtyCells},
    Named{"exec_pids", kExecPids},
    Named{"exec_memory_mb", kExecMemoryMb},
    Named{"pool_size", kPoolSize},
};

// {"cpus": {"min": 1, "max": 16}, ..., "max_map_entries": 128, ...}: the
// table as GET /v1/info shows it.
inline nlohmann::json to_json() {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& n : kRanges)
    j[std::string(n.name)] = {{"min", n.range.min}, {"max", n.range.max}};
  j["max_map_entries"] = kMaxMapEntries;
  j["max_key_bytes"] = kMaxKeyBytes;
  j["max_env_value_bytes"] = kMaxEnvValueBytes;
  j["max_metadata_value_bytes"] = kMaxMetadataValueBytes;
  j["max_argv_bytes"] = kMaxArgvBytes;
  j["max_path_bytes"] = kMaxPathBytes;
  return j;
}

}  // namespace airlock::engine::limits

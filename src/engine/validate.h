// Checks of caller input done before the engine creates or touches anything.
// Each failure is Error(invalid_argument, message naming the limit, field).
//
//   validate_spec(spec);                 // ranges, names, bounded maps
//   validate_disk_fits(spec, image);     // disk_mb >= the image's rootfs
//   validate_exec(request, life_s);      // argv xor cmd, cwd, env, timeout
//   validate_guest_path(path);           // absolute, no NUL, bounded
#pragma once

#include <cstdint>
#include <string>

#include "engine/api/limits.h"
#include "engine/api/types.h"

namespace airlock::engine {

// The bounds themselves are one table, api/limits.h; these names stay for
// the code that checks them.
using limits::kMaxArgvBytes;
using limits::kMaxEnvValueBytes;
using limits::kMaxKeyBytes;
using limits::kMaxMapEntries;
using limits::kMaxMetadataValueBytes;
using limits::kMaxPathBytes;

void validate_spec(const SandboxSpec& spec);
// The smallest disk_mb that holds an image whose rootfs has `rootfs_bytes`.
int min_disk_mb(uint64_t rootfs_bytes);
void validate_disk_fits(const SandboxSpec& spec, uint64_t rootfs_bytes);
void validate_exec(const ExecRequest& request);
// cols and rows of a terminal: 1 .. 4096 each (field "cols"/"rows").
void validate_pty_size(int cols, int rows);
void validate_guest_path(const std::string& path, const char* field = "path");

}  // namespace airlock::engine

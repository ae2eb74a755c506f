#include "engine/validate.h"

#include "common/error.h"
#include "engine/storage/image_name.h"

namespace airlock::engine {
namespace {

void check_range(int64_t v, limits::Range r, const char* field) {
  if (!r.contains(v))
    throw Error(Errc::invalid_argument,
                std::string(field) + " must be between " + std::to_string(r.min) + " and " +
                    std::to_string(r.max) + ", got " + std::to_string(v),
                field);
}

void check_map(const std::map<std::string, std::string>& m, const char* field, size_t max_value,
               bool env) {
  if (m.size() > kMaxMapEntries)
    throw Error(Errc::invalid_argument,
                std::string(field) + " has " + std::to_string(m.size()) + " entries; at most " +
                    std::to_string(kMaxMapEntries) + " are allowed",
                field);
  for (const auto& [k, v] : m) {
    std::string f = std::string(field) + "." + k;
    if (k.empty())
      throw Error(Errc::invalid_argument, std::string(field) + " keys must not be empty", field);
    if (k.size() > kMaxKeyBytes)
      throw Error(
          Errc::invalid_argument,
          std::string(field) + " key longer than " + std::to_string(kMaxKeyBytes) + " bytes",
          field);
    // An env name with '=' or NUL would smuggle another variable.
    if (env && (k.find('=') != std::string::npos || k.find('\0') != std::string::npos))
      throw Error(Errc::invalid_argument,
                  std::string(field) + " key '" + k + "' must not contain '=' or NUL", f);
    if (env && v.find('\0') != std::string::npos)
      throw Error(Errc::invalid_argument,
                  std::string(field) + " value of '" + k + "' must not contain NUL", f);
    if (v.size() > max_value)
      throw Error(Errc::invalid_argument,
                  std::string(field) + " value of '" + k + "' is longer than " +
                      std::to_string(max_value) + " bytes",
                  f);
  }
}

}  // namespace

void validate_spec(const SandboxSpec& spec) {
  storage::check_image_name(spec.image, "image");
  check_range(spec.cpus, limits::kCpus, "cpus");
  check_range(spec.memory_mb, limits::kMemoryMb, "memory_mb");
  check_range(spec.disk_mb, limits::kDiskMb, "disk_mb");
  check_range(spec.timeout_s, limits::kTimeoutS, "timeout");
  // 0 = no idle timeout.
  check_range(spec.idle_timeout_s, limits::kIdleTimeoutS, "idle_timeout");
  if (spec.on_idle != "destroy" && spec.on_idle != "pause")
    throw Error(Errc::invalid_argument, "on_idle must be \"pause\" or \"destroy\"", "on_idle");
  check_map(spec.env, "env", kMaxEnvValueBytes, true);
  check_map(spec.metadata, "metadata", kMaxMetadataValueBytes, false);
}

int min_disk_mb(uint64_t rootfs_bytes) {
  return static_cast<int>((rootfs_bytes + (1 << 20) - 1) >> 20);
}

void validate_disk_fits(const SandboxSpec& spec, uint64_t rootfs_bytes) {
  int need = min_disk_mb(rootfs_bytes);
  if (spec.disk_mb < need)
    throw Error(Errc::invalid_argument,
                "disk_mb must be at least " + std::to_string(need) + " (the size of image '" +
                    spec.image + "'), got " + std::to_string(spec.disk_mb),
                "disk_mb");
}

void validate_pty_size(int cols, int rows) {
  check_range(cols, limits::kPtyCells, "cols");
  check_range(rows, limits::kPtyCells, "rows");
}

void validate_exec(const ExecRequest& r) {
  if (r.pty) {
    validate_pty_size(r.pty->cols, r.pty->rows);
    if (r.stdin_data)
      throw Error(Errc::invalid_argument, "a pty exec takes its input as terminal input", "stdin");
    if (r.background)
      throw Error(Errc::invalid_argument, "a background exec takes no pty", "background");
  }
  // A pty exec may give neither: the user's login shell.
  if (r.pty && r.argv.empty() && r.cmd.empty()) {
  } else if (r.argv.empty() == r.cmd.empty())
    throw Error(Errc::invalid_argument, "give exactly one of argv or cmd",
                r.argv.empty() ? "argv" : "cmd");
  size_t total = r.cmd.size();
  if (!r.argv.empty() && r.argv[0].empty())
    throw Error(Errc::invalid_argument, "argv[0] must not be empty", "argv");
  for (const auto& a : r.argv) {
    if (a.find('\0') != std::string::npos)
      throw Error(Errc::invalid_argument, "argv elements must not contain NUL", "argv");
    total += a.size();
  }
  if (r.cmd.find('\0') != std::string::npos)
    throw Error(Errc::invalid_argument, "cmd must not contain NUL", "cmd");
  check_map(r.env, "env", kMaxEnvValueBytes, true);
  for (const auto& [k, v] : r.env) total += k.size() + v.size();
  if (total > kMaxArgvBytes)
    throw Error(Errc::invalid_argument,
                "argv/cmd and env together exceed " + std::to_string(kMaxArgvBytes) + " bytes",
                r.argv.empty() ? "cmd" : "argv");
  if (!r.cwd.empty()) validate_guest_path(r.cwd, "cwd");
  if (r.user.size() > 64 || r.user.find('\0') != std::string::npos)
    throw Error(Errc::invalid_argument, "user must be a name or uid of at most 64 bytes", "user");
  if (!(r.timeout_s >= limits::kExecTimeoutS.min) || r.timeout_s > limits::kExecTimeoutS.max)
    throw Error(Errc::invalid_argument,
                "timeout must be between 0 (none) and " +
                    std::to_string(limits::kExecTimeoutS.max) + " seconds",
                "timeout");
}

void validate_guest_path(const std::string& path, const char* field) {
  if (path.empty() || path[0] != '/')
    throw Error(Errc::invalid_argument, std::string(field) + " must be an absolute path", field);
  if (path.size() > kMaxPathBytes)
    throw Error(Errc::invalid_argument,
                std::string(field) + " is longer than " + std::to_string(kMaxPathBytes) + " bytes",
                field);
  if (path.find('\0') != std::string::npos)
    throw Error(Errc::invalid_argument, std::string(field) + " must not contain NUL", field);
}

}  // namespace airlock::engine

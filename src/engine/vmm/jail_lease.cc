// The uid leases of jail_ids.h: one file per uid offset in kLeaseDir.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/vmm/cgroup.h"
#include "engine/vmm/jail_ids.h"

namespace airlock::vmm {
namespace fs = std::filesystem;
namespace {

const fs::path kLeaseDir = "/run/airlock/jail-leases";

std::vector<std::string> read_lines(const fs::path& p) {
  std::vector<std::string> out;
  std::ifstream in(p);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(line);
  return out;
}

}  // namespace

// O_EXCL file creation makes a lease exclusive across daemons; a lease
// whose run_dir is gone is stale (its sandbox was torn down without
// release) and is reclaimed.
uint32_t lease_jail_uid(const fs::path& run_dir) {
  const uint32_t kUidRange = jail_ids().count;
  std::error_code ec;
  fs::create_directories(kLeaseDir, ec);
  ::chmod(kLeaseDir.c_str(), 0700);
  uint32_t start = static_cast<uint32_t>(std::hash<std::string>{}(run_dir.string()) % kUidRange);
  for (uint32_t i = 0; i < kUidRange; ++i) {
    uint32_t n = (start + i) % kUidRange;
    fs::path lease = kLeaseDir / std::to_string(n);
    for (int attempt = 0; attempt < 2; ++attempt) {
      int fd = ::open(lease.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      if (fd >= 0) {
        std::string line = run_dir.string() + "\n";
        bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
        ::close(fd);
        if (!ok) {
          fs::remove(lease, ec);
          throw_errno("write " + lease.string());
        }
        return n;
      }
      if (errno != EEXIST) throw_errno("create " + lease.string());
      auto lines = read_lines(lease);
      if (lines.empty() || fs::exists(lines[0], ec)) break;  // in use (or being written)
      std::vector<fs::path> cgs(lines.begin() + 1, lines.end());
      if (!remove_cgroup_dirs(cgs).empty()) break;
      fs::remove(lease, ec);  // stale: retry this n once
    }
  }
  throw Error(Errc::unavailable, "jail: no free uid in " + std::to_string(jail_ids().base) + "..+" +
                                     std::to_string(kUidRange));
}

void write_jail_lease(uint32_t n, const fs::path& run_dir, const std::vector<fs::path>& cgroups) {
  std::string body = run_dir.string() + "\n";
  for (const auto& c : cgroups) body += c.string() + "\n";
  fs::path lease = kLeaseDir / std::to_string(n);
  std::ofstream(lease, std::ios::trunc) << body;
}

std::vector<std::string> release_jail_leases(const fs::path& run_dir) {
  std::vector<std::string> left;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(kLeaseDir, ec)) {
    auto lines = read_lines(e.path());
    if (lines.empty() || lines[0] != run_dir.string()) continue;
    std::vector<fs::path> cgs(lines.begin() + 1, lines.end());
    auto stuck = remove_cgroup_dirs(cgs);
    for (const auto& c : stuck) left.push_back(c.string());
    if (stuck.empty()) fs::remove(e.path(), ec);  // keep the lease while its cgroup lives
  }
  return left;
}

}  // namespace airlock::vmm

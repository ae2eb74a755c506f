#include "engine/vmm/ram_prefault.h"

#include <sys/uio.h>

#include <sstream>
#include <vector>

#include "common/process.h"

namespace airlock::vmm {

std::optional<std::pair<uint64_t, uint64_t>> find_ram_mapping(const std::string& maps,
                                                              uint64_t ram_bytes) {
  std::optional<std::pair<uint64_t, uint64_t>> found;
  std::istringstream in(maps);
  std::string line;
  while (std::getline(in, line)) {
    // "start-end perms offset dev inode [path]", addresses in hex.
    std::istringstream f(line);
    std::string range, perms;
    if (!(f >> range >> perms) || perms.size() < 4) continue;
    size_t dash = range.find('-');
    if (dash == std::string::npos) continue;
    uint64_t start = 0, end = 0;
    try {
      start = std::stoull(range.substr(0, dash), nullptr, 16);
      end = std::stoull(range.substr(dash + 1), nullptr, 16);
    } catch (const std::exception&) {
      continue;
    }
    if (end <= start || end - start != ram_bytes) continue;
    if (perms[0] != 'r' || perms[1] != 'w' || perms[3] != 'p') continue;
    if (found) return std::nullopt;  // ambiguous: touch nothing
    found = std::make_pair(start, end);
  }
  return found;
}

uint64_t prefault_guest_ram(pid_t pid, uint64_t ram_bytes) {
  // /proc/<pid>/maps is the kernel's account of the process: QEMU (or the
  // jail) can name its mappings but cannot make us read anything but its
  // own memory, into a buffer we throw away.
  std::string maps = read_file_capped("/proc/" + std::to_string(pid) + "/maps", size_t{1} << 20);
  auto range = find_ram_mapping(maps, ram_bytes);
  if (!range) return 0;
  constexpr size_t kChunk = size_t{4} << 20;
  std::vector<char> buf(kChunk);
  uint64_t done = 0;
  for (uint64_t at = range->first; at < range->second;) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, range->second - at));
    iovec local{buf.data(), n};
    iovec remote{reinterpret_cast<void*>(at), n};
    ssize_t r = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (r <= 0) break;  // gone, not ours to read, or unmapped meanwhile
    done += static_cast<uint64_t>(r);
    at += static_cast<uint64_t>(r);
  }
  return done;
}

}  // namespace airlock::vmm

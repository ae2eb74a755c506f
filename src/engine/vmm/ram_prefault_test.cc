#include "engine/vmm/ram_prefault.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

namespace airlock::vmm {
namespace {

TEST(RamPrefault, FindsTheOneWritablePrivateMappingOfTheSize) {
  const uint64_t mib = 1 << 20;
  std::string maps =
      "55d0c0000000-55d0c0400000 r--p 00000000 08:01 123 /usr/bin/qemu-system-x86_64\n"
      "7f0000000000-7f0010000000 rw-p 00000000 00:01 77 /memfd:airlock-template-ram (deleted)\n"
      "7f0020000000-7f0030000000 r--p 00000000 00:00 0 \n"           // not writable
      "7f0040000000-7f0050000000 rw-s 00000000 00:01 78 /memfd:x\n"  // shared
      "garbage line\n"
      "7f0060000000-7f0060100000 rw-p 00000000 00:00 0 \n";
  auto r = find_ram_mapping(maps, 256 * mib);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->first, 0x7f0000000000u);
  EXPECT_EQ(r->second, 0x7f0010000000u);
  EXPECT_FALSE(find_ram_mapping(maps, 512 * mib).has_value());
  // Two candidates: which is guest RAM is not known, so neither.
  maps += "7f0070000000-7f0080000000 rw-p 00000000 00:00 0 \n";
  EXPECT_FALSE(find_ram_mapping(maps, 256 * mib).has_value());
}

// Resident KiB of the mapping starting at `start` in process `pid`.
long rss_kib(pid_t pid, uintptr_t start) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/smaps");
  std::string line;
  bool inside = false;
  std::ostringstream want;
  want << std::hex << start << "-";
  while (std::getline(in, line)) {
    if (line.find('-') != std::string::npos && line.find(':') > line.find(' ') &&
        std::isxdigit(static_cast<unsigned char>(line[0])))
      inside = line.rfind(want.str(), 0) == 0;
    else if (inside && line.rfind("Rss:", 0) == 0)
      return std::stol(line.substr(4));
  }
  return -1;
}

// A process with a private mapping of a memfd it never touched (a clone's
// RAM before its first save): after prefault_guest_ram all of it is mapped,
// its contents unchanged, the process none the wiser.
TEST(RamPrefault, MapsEveryPageOfAnUntouchedPrivateMapping) {
  const size_t size = (40u << 20) + 3 * 4096;  // a size nothing else here has
  int ready[2], hold[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(hold), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(ready[0]);
    ::close(hold[1]);  // else the read below never sees the parent's close
    int fd = ::memfd_create("prefault-test", MFD_CLOEXEC);
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(size)) != 0) ::_exit(1);
    if (::pwrite(fd, "mark", 4, 4096) != 4) ::_exit(1);
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) ::_exit(1);
    uintptr_t at = reinterpret_cast<uintptr_t>(p);
    (void)!::write(ready[1], &at, sizeof at);
    char c;
    (void)!::read(hold[0], &c, 1);  // until the parent is done
    ::_exit(std::memcmp(static_cast<char*>(p) + 4096, "mark", 4) == 0 ? 0 : 2);
  }
  ::close(ready[1]);
  ::close(hold[0]);
  uintptr_t at = 0;
  ASSERT_EQ(::read(ready[0], &at, sizeof at), static_cast<ssize_t>(sizeof at));
  EXPECT_LT(rss_kib(child, at), 1024);
  EXPECT_EQ(prefault_guest_ram(child, size), size);
  EXPECT_GE(rss_kib(child, at), static_cast<long>(size / 1024));
  // No such mapping: nothing read.
  EXPECT_EQ(prefault_guest_ram(child, size + 4096), 0u);
  ::close(hold[1]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  ::close(ready[0]);
}

}  // namespace
}  // namespace airlock::vmm

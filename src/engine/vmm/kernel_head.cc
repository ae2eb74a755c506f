#include "engine/vmm/kernel_head.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "common/error.h"
#include "common/process.h"
#include "common/unique_fd.h"

namespace airlock::vmm {

namespace {

// The x86 boot protocol (Documentation/arch/x86/boot.rst): setup_sects at
// 0x1f1 (0 means 4), the "HdrS" magic at 0x202.
constexpr size_t kSetupSectsOffset = 0x1f1;
constexpr size_t kMagicOffset = 0x202;
constexpr char kMagic[] = {'H', 'd', 'r', 'S'};

// Reads up to n bytes at the start of fd; fewer only at end of file.
std::string read_prefix(int fd, size_t n) {
  std::string buf(n, '\0');
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::pread(fd, buf.data() + got, n - got, static_cast<off_t>(got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  buf.resize(got);
  return buf;
}

}  // namespace

std::string kernel_head(const std::filesystem::path& bzimage) {
  UniqueFd fd{::open(bzimage.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.fd < 0) return {};
  // The most setup there can be (255 sectors + the boot sector) and a page.
  std::string head = read_prefix(fd.fd, 256 * 512 + kKernelHeadPayload);
  if (head.size() < kMagicOffset + sizeof kMagic ||
      std::memcmp(head.data() + kMagicOffset, kMagic, sizeof kMagic) != 0)
    return {};
  size_t sects = static_cast<uint8_t>(head[kSetupSectsOffset]);
  size_t setup = ((sects == 0 ? 4 : sects) + 1) * 512;
  // A header that claims more setup than the file has is no kernel.
  if (head.size() <= setup) return {};
  head.resize(std::min(head.size(), setup + kKernelHeadPayload));
  return head;
}

std::filesystem::path write_kernel_head(const std::filesystem::path& bzimage,
                                        const std::filesystem::path& dest) {
  std::string head = kernel_head(bzimage);
  if (head.empty()) return {};
  UniqueFd fd{create_file_nofollow(dest, 0644)};
  if (fd.fd < 0) throw_errno("create " + dest.string());
  size_t done = 0;
  while (done < head.size()) {
    ssize_t n = ::write(fd.fd, head.data() + done, head.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw_errno("write " + dest.string());
    done += static_cast<size_t>(n);
  }
  return dest;
}

}  // namespace airlock::vmm

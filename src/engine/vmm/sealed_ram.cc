#include "engine/vmm/sealed_ram.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/process.h"
#include "common/unique_fd.h"

namespace airlock::vmm {

namespace {

constexpr unsigned kSeals = F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

}  // namespace

std::shared_ptr<SealedRam> SealedRam::copy_of(const std::filesystem::path& file) {
  // Only the daemon's own regular file, never through a link.
  UniqueFd in{open_regular_nofollow(file)};
  if (in.fd < 0) throw_errno("open template RAM " + file.string());
  struct stat st {};
  if (::fstat(in.fd, &st) != 0) throw_errno("stat " + file.string());
  UniqueFd mem{::memfd_create("airlock-template-ram", MFD_CLOEXEC | MFD_ALLOW_SEALING)};
  if (mem.fd < 0) throw_errno("memfd_create");
  if (::ftruncate(mem.fd, st.st_size) != 0) throw_errno("size template RAM memfd");
  std::vector<char> buf(1 << 20);
  for (off_t off = 0; off < st.st_size;) {
    ssize_t n = ::pread(in.fd, buf.data(), buf.size(), off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno("read " + file.string());
    if (n == 0) throw Error(Errc::internal, "template RAM " + file.string() + " shrank while read");
    // All-zero chunks stay holes: most of a fresh guest's RAM is untouched.
    bool zero =
        buf[0] == 0 && std::memcmp(buf.data(), buf.data() + 1, static_cast<size_t>(n - 1)) == 0;
    for (ssize_t done = 0; !zero && done < n;) {
      ssize_t w = ::pwrite(mem.fd, buf.data() + done, static_cast<size_t>(n - done), off + done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) throw_errno("write template RAM memfd");
      done += w;
    }
    off += n;
  }
  if (::fcntl(mem.fd, F_ADD_SEALS, kSeals) != 0) throw_errno("seal template RAM memfd");
  return std::shared_ptr<SealedRam>(
      new SealedRam(mem.release(), static_cast<uint64_t>(st.st_size)));
}

std::shared_ptr<SealedRam> SealedRam::seal(int fd, uint64_t size) {
  UniqueFd mem{fd};
  if (::fcntl(mem.fd, F_ADD_SEALS, kSeals) != 0) throw_errno("seal RAM memfd");
  return std::shared_ptr<SealedRam>(new SealedRam(mem.release(), size));
}

SealedRam::~SealedRam() { ::close(fd_); }

bool is_write_sealed(int fd) {
  int seals = ::fcntl(fd, F_GET_SEALS);
  return seals >= 0 && (seals & F_SEAL_WRITE) != 0;
}

bool template_ram_sealed(pid_t pid, int fd) {
  std::string link = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  char target[256];
  ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
  if (n <= 0) return false;
  if (std::string(target, static_cast<size_t>(n)).rfind("/memfd:", 0) != 0) return false;
  int f = ::open(link.c_str(), O_RDONLY | O_CLOEXEC);
  if (f < 0) return false;
  bool sealed = is_write_sealed(f);
  ::close(f);
  return sealed;
}

}  // namespace airlock::vmm

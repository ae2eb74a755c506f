// Template RAM that clones cannot write (docs/design.md, "Templates and
// clones"). QEMU 7.2 opens a memory-backend-file's mem-path O_RDWR even with
// share=off, so handing a clone the template's RAM *file* lets a compromised
// clone write pages every other clone of that template still shares. A
// memfd sealed with F_SEAL_WRITE (plus SHRINK, GROW and SEAL) refuses
// write(2), truncation and shared writable mappings to everyone, yet still
// allows the private copy-on-write mapping a clone needs. The clone's QEMU
// gets it as fd jail's kInheritedFd and maps mem-path=/proc/self/fd/4
// (verified with QEMU 7.2: /dev/fdset/N is not accepted there).
//
//   auto ram = SealedRam::copy_of(tpl.ram);        // one copy per template
//   vc.memory_fd = ram->fd();                      // every clone maps it
//   ... template_ram_sealed(qemu_pid) ...          // posture's read-back
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <memory>

namespace airlock::vmm {

class SealedRam {
 public:
  // A sealed memfd with the contents of `file` (read once, in 1 MiB
  // chunks). Error(internal) naming the step on failure; nothing left.
  static std::shared_ptr<SealedRam> copy_of(const std::filesystem::path& file);
  // Seals memfd `fd` (made with MFD_ALLOW_SEALING, no writable mapping
  // left) and takes it over; on error it is closed.
  static std::shared_ptr<SealedRam> seal(int fd, uint64_t size);
  ~SealedRam();
  SealedRam(const SealedRam&) = delete;
  SealedRam& operator=(const SealedRam&) = delete;

  int fd() const { return fd_; }
  uint64_t size() const { return size_; }

 private:
  SealedRam(int fd, uint64_t size) : fd_(fd), size_(size) {}
  int fd_;
  uint64_t size_;
};

// True if `fd` carries F_SEAL_WRITE (and so nobody can change its pages).
bool is_write_sealed(int fd);

// Read back from /proc: true if process `pid` holds a write-sealed memfd at
// `fd` (the clone's template RAM). Needs the rights to open its fds (root,
// or the same uid).
bool template_ram_sealed(pid_t pid, int fd = 4);

}  // namespace airlock::vmm

// One owner of a file descriptor: closed on every path out of its scope,
// or at reset(); -1 means none. The one scope guard for raw fds (host and
// guest), instead of a small struct per file.
#pragma once

#include <unistd.h>

#include <utility>

namespace airlock {

struct UniqueFd {
  int fd = -1;
  UniqueFd() = default;
  explicit UniqueFd(int f) : fd(f) {}
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  UniqueFd(UniqueFd&& o) noexcept : fd(std::exchange(o.fd, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) reset(std::exchange(o.fd, -1));
    return *this;
  }
  ~UniqueFd() { reset(); }
  void reset(int f = -1) {
    if (fd >= 0) ::close(fd);
    fd = f;
  }
  // Gives the fd up without closing it.
  int release() { return std::exchange(fd, -1); }
};

}  // namespace airlock

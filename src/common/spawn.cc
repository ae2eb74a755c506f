#include "common/spawn.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/error.h"
#include "common/process.h"
#include "common/signals.h"

namespace airlock {
namespace {

constexpr int kMaxTarget = 1024;

// What the grandchild reports on the pipe: its pid, then (only if exec
// failed) the errno of execv.
struct Report {
  pid_t pid = -1;
  int exec_errno = 0;
};

// Reads what the grandchild wrote until the pipe closes (exec closes it,
// O_CLOEXEC): sizeof(pid_t) bytes on success, a whole Report on failure.
size_t read_report(int fd, Report& r) {
  std::array<char, sizeof(pid_t) + sizeof(int)> buf{};
  size_t got = 0;
  while (got < buf.size()) {
    ssize_t n = ::read(fd, buf.data() + got, buf.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  if (got >= sizeof(pid_t)) std::memcpy(&r.pid, buf.data(), sizeof(pid_t));
  if (got == buf.size()) std::memcpy(&r.exec_errno, buf.data() + sizeof(pid_t), sizeof(int));
  return got;
}

// In the grandchild; async-signal-safe calls only (no allocation: every
// array was filled before fork).
[[noreturn]] void become(char* const* argv, const std::pair<int, int>* fds, size_t n, int devnull,
                         int report) {
  reset_signals();
  int top = std::max(devnull, report);
  for (size_t i = 0; i < n; ++i) top = std::max({top, fds[i].first, fds[i].second});
  // First every source above every target, so placing one cannot clobber
  // another that is still to be placed.
  std::array<int, kMaxTarget> moved{};
  for (size_t i = 0; i < n; ++i) {
    moved[i] = ::fcntl(fds[i].second, F_DUPFD, top + 1);
    if (moved[i] < 0) ::_exit(126);
  }
  int rep = ::fcntl(report, F_DUPFD_CLOEXEC, top + 1);
  int null = ::fcntl(devnull, F_DUPFD, top + 1);
  if (rep < 0 || null < 0) ::_exit(126);
  int max_target = 2;
  bool placed[kMaxTarget] = {};
  for (size_t i = 0; i < n; ++i) {
    if (::dup2(moved[i], fds[i].first) < 0) ::_exit(126);
    placed[fds[i].first] = true;
    max_target = std::max(max_target, fds[i].first);
  }
  for (int fd = 0; fd <= 2; ++fd)
    if (!placed[fd] && ::dup2(null, fd) < 0) ::_exit(126);
  for (int fd = 3; fd <= max_target; ++fd)
    if (!placed[fd]) ::close(fd);
  // The report pipe just above the program's descriptors, closed by exec;
  // everything else of ours goes now.
  if (::dup3(rep, max_target + 1, O_CLOEXEC) < 0) ::_exit(126);
  rep = max_target + 1;
  ::close_range(static_cast<unsigned>(rep) + 1, ~0U, 0);
  pid_t self = ::getpid();
  (void)!::write(rep, &self, sizeof self);
  ::execv(argv[0], argv);
  int err = errno;
  (void)!::write(rep, &err, sizeof err);
  ::_exit(127);
}

}  // namespace

pid_t spawn_detached(const Detached& d) {
  if (d.argv.empty() || d.argv[0].empty())
    throw Error(Errc::invalid_argument, "spawn_detached: no program given", "argv");
  std::vector<std::pair<int, int>> fds = d.fds;
  for (const auto& [target, source] : fds) {
    auto same = std::count_if(fds.begin(), fds.end(), [&](auto& f) { return f.first == target; });
    if (target < 0 || target >= kMaxTarget || source < 0 || same != 1)
      throw Error(Errc::invalid_argument,
                  "spawn_detached: descriptor " + std::to_string(target) + " given badly", "fds");
  }
  std::vector<std::string> args = d.argv;
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  int devnull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull < 0) throw_errno("open /dev/null");
  int report[2] = {-1, -1};
  if (::pipe2(report, O_CLOEXEC) != 0) {
    ::close(devnull);
    throw_errno("pipe2");
  }
  pid_t child = ::fork();
  if (child == 0) {
    ::setsid();
    pid_t grandchild = ::fork();
    if (grandchild != 0) ::_exit(grandchild < 0 ? 1 : 0);
    become(argv.data(), fds.data(), fds.size(), devnull, report[1]);
  }
  int fork_errno = errno;
  ::close(devnull);
  ::close(report[1]);
  if (child < 0) {
    ::close(report[0]);
    errno = fork_errno;
    throw_errno("fork for " + d.argv[0]);
  }
  while (::waitpid(child, nullptr, 0) < 0 && errno == EINTR) {
  }
  Report r;
  size_t got = read_report(report[0], r);
  ::close(report[0]);
  if (got < sizeof(pid_t) || r.pid <= 0)
    throw Error(Errc::internal, "could not start " + d.argv[0] + " (the double fork failed)");
  if (r.exec_errno != 0) {
    wait_gone(r.pid, std::chrono::seconds(5));
    throw Error(Errc::unavailable,
                "cannot execute " + d.argv[0] + ": " + std::strerror(r.exec_errno));
  }
  return r.pid;
}

}  // namespace airlock

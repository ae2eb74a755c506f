#include "common/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace airlock {

std::optional<std::string> find_in_path(const std::string& binary) {
  if (binary.find('/') != std::string::npos) return binary;
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "/usr/local/bin:/usr/bin:/bin");
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    std::filesystem::path cand = std::filesystem::path(dir.empty() ? "." : dir) / binary;
    if (::access(cand.c_str(), X_OK) == 0) return cand.string();
  }
  return std::nullopt;
}

int open_regular_nofollow(const std::filesystem::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return -1;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    errno = EINVAL;
    return -1;
  }
  return fd;
}

int create_file_nofollow(const std::filesystem::path& path, mode_t mode, int extra_flags) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return -1;
  return ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | extra_flags,
                mode);
}

std::string read_file_capped(const std::filesystem::path& path, size_t cap) {
  int fd = open_regular_nofollow(path);
  if (fd < 0) return {};
  std::string s(cap, '\0');
  size_t got = 0;
  while (got < cap) {
    ssize_t n = ::read(fd, s.data() + got, cap - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  s.resize(got);
  return s;
}

char proc_state(pid_t pid) {
  std::string stat = read_file_capped("/proc/" + std::to_string(pid) + "/stat", 4096);
  // comm may contain spaces and ')': the state follows the last ')'.
  auto close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return 0;
  return stat[close + 2];
}

std::vector<std::string> proc_cmdline(pid_t pid) {
  std::string raw = read_file_capped("/proc/" + std::to_string(pid) + "/cmdline", 1 << 16);
  std::vector<std::string> args;
  std::string cur;
  for (char c : raw) {
    if (c == '\0') {
      args.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) args.push_back(cur);
  return args;
}

bool alive_with_arg(pid_t pid, const std::string& arg) {
  if (pid <= 0 || ::kill(pid, 0) != 0) return false;
  char st = proc_state(pid);
  if (st == 0 || st == 'Z' || st == 'X') return false;
  for (const auto& a : proc_cmdline(pid))
    if (a == arg) return true;
  return false;
}

std::vector<pid_t> find_processes(const std::vector<std::string>& needles) {
  std::vector<pid_t> pids;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    std::string name = it->path().filename();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    pid_t pid = std::stoi(name);
    char st = proc_state(pid);  // the process may vanish while we read: then 0
    if (st == 0 || st == 'Z' || st == 'X') continue;
    std::string cmd = read_file_capped(it->path() / "cmdline", 1 << 16);
    bool all = true;
    for (const auto& n : needles) all = all && cmd.find(n) != std::string::npos;
    if (all) pids.push_back(pid);
  }
  return pids;
}

namespace {

// Whether `pid` has no thread left but its leader. A multi-threaded
// process's leader shows 'Z' as soon as it exits itself, while its other
// threads may still be exiting and holding the process's files (QEMU's
// image locks: a qemu-img started then fails to lock the disk).
bool leader_alone(pid_t pid) {
  std::error_code ec;
  int n = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    ++n;
  return n <= 1;
}

}  // namespace

bool wait_gone(pid_t pid, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (::waitpid(pid, nullptr, WNOHANG) == pid) return true;
    char st = proc_state(pid);
    if (st == 0 || st == 'X') return true;
    if (st == 'Z') {
      // Ours to reap (waitpid reports a whole thread group only once every
      // thread is gone)? It fails with ECHILD if not: then gone once the
      // leader is alone.
      pid_t r = ::waitpid(pid, nullptr, WNOHANG);
      if (r == pid) return true;
      if (r < 0 && errno == ECHILD && leader_alone(pid)) return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace airlock

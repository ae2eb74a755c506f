#include "engine/vmm/console.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <deque>

#include "common/error.h"
#include "common/process.h"
#include "engine/vmm/qmp.h"

namespace airlock::vmm {

namespace {

// The jail can create names in run_dir (not replace the daemon's files: the
// sticky bit), so a log is never opened through a link it planted: a fresh
// log replaces whatever has its name; appending reopens only a regular file
// that is not a link, else starts afresh.
int open_log(const std::filesystem::path& log, bool truncate) {
  int fd = -1;
  if (!truncate) {
    fd = ::open(log.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    struct stat st {};
    if (fd >= 0 && (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))) {
      ::close(fd);
      fd = -1;
    }
  }
  if (fd < 0) fd = create_file_nofollow(log, 0640, O_APPEND);
  if (fd < 0) throw_errno("open " + log.string());
  return fd;
}

// Last `max` bytes of the file at `path` ("" if missing, a link or not a
// regular file).
std::string read_last(const std::filesystem::path& path, size_t max) {
  int fd = open_regular_nofollow(path);
  if (fd < 0) return {};
  std::string out;
  struct stat st {};
  if (::fstat(fd, &st) == 0) {
    off_t size = st.st_size;
    off_t start = size > static_cast<off_t>(max) ? size - static_cast<off_t>(max) : 0;
    out.resize(static_cast<size_t>(size - start));
    ssize_t n = ::pread(fd, out.data(), out.size(), start);
    out.resize(n > 0 ? static_cast<size_t>(n) : 0);
  }
  ::close(fd);
  return out;
}

}  // namespace

ConsoleCapture::ConsoleCapture(const std::filesystem::path& socket,
                               const std::filesystem::path& log, size_t cap_bytes, bool truncate,
                               std::chrono::steady_clock::time_point deadline)
    : log_(log), half_(std::max<size_t>(cap_bytes / 2, 1)) {
  if (truncate) std::filesystem::remove(log_.string() + ".old");
  log_fd_ = open_log(log_, truncate);
  struct stat st {};
  if (::fstat(log_fd_, &st) == 0) size_ = static_cast<size_t>(st.st_size);
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC);
  if (wake_fd_ < 0) {
    int err = errno;
    ::close(log_fd_);
    errno = err;
    throw_errno("eventfd");
  }
  try {
    sock_ = connect_unix(socket, deadline);
  } catch (...) {
    ::close(log_fd_);
    ::close(wake_fd_);
    throw;
  }
  thread_ = std::thread([this] { run(); });
}

ConsoleCapture::~ConsoleCapture() { stop(); }

void ConsoleCapture::stop() {
  if (thread_.joinable()) {
    uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
    thread_.join();
  }
  for (int* fd : {&sock_, &log_fd_, &wake_fd_}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
}

void ConsoleCapture::run() {
  char buf[16384];
  for (;;) {
    pollfd fds[2] = {{sock_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    int r = ::poll(fds, 2, -1);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 || (fds[1].revents & POLLIN)) return;
    ssize_t n = ::read(sock_, buf, sizeof(buf));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return;  // QEMU closed the console: it exited
    write_capped(buf, static_cast<size_t>(n));
  }
}

void ConsoleCapture::write_capped(const char* data, size_t size) {
  while (size > 0) {
    if (size_ >= half_) {
      // Rotate: the current half becomes .old (dropping the older half).
      std::error_code ec;
      std::filesystem::rename(log_, log_.string() + ".old", ec);
      // Never O_CREAT|O_TRUNC through whatever the jail put at the name
      // between the rename and this open.
      int fd = create_file_nofollow(log_, 0640, O_APPEND);
      if (fd < 0) return;  // disk trouble: drop output rather than grow anything
      ::close(log_fd_);
      log_fd_ = fd;
      size_ = 0;
    }
    size_t chunk = std::min(size, half_ - size_);
    ssize_t n = ::write(log_fd_, data, chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    size_ += static_cast<size_t>(n);
    data += n;
    size -= static_cast<size_t>(n);
  }
}

std::string console_tail(const std::filesystem::path& log, size_t lines) {
  constexpr size_t kWindow = 64 * 1024;
  try {
    std::string text = read_last(log, kWindow);
    if (static_cast<size_t>(std::count(text.begin(), text.end(), '\n')) <= lines)
      text = read_last(log.string() + ".old", kWindow - std::min(kWindow, text.size())) + text;
    // Keep printable text only: console output may carry escape sequences
    // and the tail ends up in JSON error messages and terminals.
    std::deque<std::string> out;
    std::string cur;
    auto flush = [&] {
      if (!cur.empty()) out.push_back(std::move(cur));
      cur.clear();
      if (out.size() > lines) out.pop_front();
    };
    for (char c : text) {
      auto u = static_cast<unsigned char>(c);
      if (c == '\n')
        flush();
      else if (u >= 0x20 || c == '\t')
        cur += c;
    }
    flush();
    std::string result;
    for (auto& l : out) {
      if (!result.empty()) result += '\n';
      result += l;
    }
    return result;
  } catch (...) {
    return {};
  }
}

}  // namespace airlock::vmm

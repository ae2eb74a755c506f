#include "cli/stdin_pump.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "cli/client.h"
#include "common/error.h"

namespace airlock::cli {

bool read_stdin_batch(int fd, int wake, size_t max, StdinBatch& out) {
  out.bytes.clear();
  out.eof = false;
  out.bytes.resize(max);
  size_t filled = 0;
  for (;;) {
    // Block only for the first byte; afterwards take only what is there.
    int timeout = filled == 0 ? -1 : 0;
    pollfd p[2] = {{fd, POLLIN, 0}, {wake, POLLIN, 0}};
    int r = ::poll(p, wake >= 0 ? 2 : 1, timeout);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      out.eof = true;
      break;
    }
    if (wake >= 0 && (p[1].revents & POLLIN)) {
      out.bytes.clear();
      return false;
    }
    if (r == 0) break;  // nothing more right now: send what we have
    ssize_t n = ::read(fd, out.bytes.data() + filled, max - filled);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) {
      out.eof = true;  // end of input (or unreadable: treated as the end)
      break;
    }
    filled += size_t(n);
    if (filled == max) break;
  }
  out.bytes.resize(filled);
  return true;
}

StdinPump::StdinPump(std::filesystem::path socket, std::string id, int fd)
    : socket_(std::move(socket)), id_(std::move(id)), fd_(fd) {
  if (::pipe2(wake_, O_CLOEXEC) != 0) throw_errno("pipe");
}

StdinPump::~StdinPump() {
  stop();
  ::close(wake_[0]);
  ::close(wake_[1]);
}

void StdinPump::start(const std::string& exec_id) {
  if (thread_.joinable()) return;
  thread_ = std::thread([this, exec_id] { run(exec_id); });
}

void StdinPump::stop() {
  if (!thread_.joinable()) return;
  char one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_[1], &one, 1);
  thread_.join();
}

void StdinPump::run(std::string exec_id) {
  StdinSender sender(socket_, id_, exec_id);
  StdinBatch batch;
  // 1 MiB per request: big enough that a bulk stream costs few requests,
  // small enough to keep the CLI's memory flat.
  constexpr size_t kBatch = 1 << 20;
  try {
    while (read_stdin_batch(fd_, wake_[0], kBatch, batch)) {
      sender.send(batch.bytes, batch.eof);
      sent_ += batch.bytes.size();
      if (batch.eof) return;
    }
  } catch (const Error& e) {
    // The exec ended (conflict) or went away: the rest of stdin has no
    // reader, as with a local pipe whose reader exited. Anything else is
    // worth a line, but the exec's own outcome decides the exit code.
    if (e.code() != Errc::conflict && e.code() != Errc::not_found)
      std::fprintf(stderr, "airlock: streaming stdin failed: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "airlock: streaming stdin failed: %s\n", e.what());
  }
}

}  // namespace airlock::cli

#include "cli/stdin_pump.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <optional>

#include "client/client.h"
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

// Sends `batch`, the bytes from `acked` on (what the guest had of this
// exec's stdin before it). If airlockd goes away meanwhile, waits for it
// (up to `patience`, returning early if `wake` becomes readable), asks
// how far the guest got and sends the rest. Returns the guest's new total
// (nullopt: stopped while waiting).
std::optional<uint64_t> send_resuming(const StdinSend& send, const StdinBatch& batch,
                                      uint64_t acked, std::chrono::milliseconds patience,
                                      int wake) {
  auto total_of = [](const nlohmann::json& r, uint64_t fallback) {
    auto t = r.find("stdin_total");
    return t != r.end() && t->is_number_integer() && t->get<int64_t>() >= 0 ? t->get<uint64_t>()
                                                                            : fallback;
  };
  try {
    return total_of(send(batch.bytes, batch.eof), acked + batch.bytes.size());
  } catch (const Error& e) {
    if (e.code() != Errc::unavailable || patience.count() == 0) throw;
  }
  const auto give_up = std::chrono::steady_clock::now() + patience;
  for (int attempt = 0;; ++attempt) {
    pollfd p{wake, POLLIN, 0};
    if (::poll(&p, 1, attempt < 10 ? 200 : 500) > 0) return std::nullopt;
    try {
      // Everything the guest holds was written before this answer.
      uint64_t had = total_of(send({}, false), acked);
      if (had < acked || had > acked + batch.bytes.size())
        throw Error(Errc::internal, "the guest has " + std::to_string(had) +
                                        " bytes of stdin, this client sent " +
                                        std::to_string(acked) + " (+" +
                                        std::to_string(batch.bytes.size()) + " in flight)");
      const size_t skip = static_cast<size_t>(had - acked);
      return total_of(send(std::string_view(batch.bytes).substr(skip), batch.eof),
                      acked + batch.bytes.size());
    } catch (const Error& e) {
      if (e.code() != Errc::unavailable || std::chrono::steady_clock::now() >= give_up) throw;
    }
  }
}

StdinPump::StdinPump(std::filesystem::path socket, std::string id, int fd,
                     std::chrono::milliseconds patience)
    : socket_(std::move(socket)), id_(std::move(id)), fd_(fd), patience_(patience) {
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
  client::StdinSender sender(socket_, id_, exec_id);
  StdinBatch batch;
  // 1 MiB per request: big enough that a bulk stream costs few requests,
  // small enough to keep the CLI's memory flat.
  constexpr size_t kBatch = 1 << 20;
  uint64_t acked = 0;  // the guest's count of this exec's stdin bytes
  try {
    while (read_stdin_batch(fd_, wake_[0], kBatch, batch)) {
      auto total = send_resuming([&](std::string_view b, bool e) { return sender.send(b, e); },
                                 batch, acked, patience_, wake_[0]);
      if (!total) return;  // stop() while waiting for airlockd
      acked = *total;
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

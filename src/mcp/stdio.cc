#include "mcp/stdio.h"

#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>

#include "common/error.h"
#include "mcp/protocol.h"

namespace airlock::mcp {

using nlohmann::json;

namespace {

// A line longer than this is not a message of any client we know; it is
// answered with a parse error and skipped rather than buffered without end.
constexpr size_t kMaxLine = 64 << 20;

sigset_t session_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  sigaddset(&set, SIGINT);
  return set;
}

class Writer {
 public:
  explicit Writer(int fd) : fd_(fd) {}
  // One reply, one line. Output invalid as UTF-8 was already replaced; the
  // handler here only guards against a stray byte in a daemon message.
  void send(const json& reply) {
    std::string line = reply.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
    std::lock_guard lock(mu_);
    std::string_view rest = line;
    while (!rest.empty()) {
      ssize_t n = ::write(fd_, rest.data(), rest.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;  // the client is gone; EOF on stdin follows
      rest.remove_prefix(size_t(n));
    }
  }

 private:
  int fd_;
  std::mutex mu_;
};

// Counts calls running on their own threads, so shutdown can wait for them.
class InFlight {
 public:
  void begin() {
    std::lock_guard lock(mu_);
    ++n_;
  }
  void end() {
    std::lock_guard lock(mu_);
    if (--n_ == 0) cv_.notify_all();
  }
  bool wait_idle(double seconds) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return n_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_ = 0;
};

bool is_tool_call(const json& m) {
  return m.is_object() && m.contains("id") && m.value("method", json()) == "tools/call";
}

}  // namespace

void block_session_signals() {
  sigset_t set = session_signals();
  sigaddset(&set, SIGPIPE);  // a closed stdout is seen as EPIPE
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int serve(Session& session, int in_fd, int out_fd, double drain_s) {
  sigset_t set = session_signals();
  int sfd = ::signalfd(-1, &set, SFD_CLOEXEC);
  if (sfd < 0) throw_errno("signalfd");
  struct SfdGuard {
    int fd;
    ~SfdGuard() { ::close(fd); }
  } sfd_guard{sfd};

  Protocol protocol(session);
  // Both live on the heap, shared with the call threads: after a drain that
  // timed out, a straggler may still finish and write after serve() returned.
  auto writer = std::make_shared<Writer>(out_fd);
  auto inflight = std::make_shared<InFlight>();

  auto handle = [&](std::string_view line) {
    if (line.empty() || line.find_first_not_of(" \t\r") == std::string_view::npos) return;
    json message = json::parse(line, nullptr, false);
    if (is_tool_call(message)) {
      inflight->begin();
      std::thread([&protocol, writer, inflight, message = std::move(message)] {
        auto reply = protocol.handle(message);
        if (reply) writer->send(*reply);
        inflight->end();
      }).detach();
      return;
    }
    if (auto reply = protocol.handle_line(line)) writer->send(*reply);
  };

  int exit_code = 0;
  std::string pending;
  bool overlong = false;
  char buf[65536];
  while (true) {
    pollfd fds[2] = {{in_fd, POLLIN, 0}, {sfd, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      throw_errno("poll");
    }
    if (fds[1].revents & POLLIN) {
      signalfd_siginfo si{};
      if (::read(sfd, &si, sizeof si) == ssize_t(sizeof si)) {
        std::fprintf(stderr, "airlock mcp: signal %u, ending the session\n", si.ssi_signo);
        exit_code = 128 + int(si.ssi_signo);
        break;
      }
    }
    if (!(fds[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    ssize_t n = ::read(in_fd, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) {
      if (!pending.empty() && !overlong) handle(pending);  // a last line without '\n'
      break;
    }
    size_t start = 0;
    std::string_view chunk(buf, size_t(n));
    for (size_t nl; (nl = chunk.find('\n', start)) != std::string_view::npos; start = nl + 1) {
      if (!overlong) {
        pending.append(chunk.substr(start, nl - start));
        handle(pending);
      }
      pending.clear();
      overlong = false;
    }
    if (!overlong) pending.append(chunk.substr(start));
    if (pending.size() > kMaxLine) {
      writer->send(rpc_error(nullptr, kParseError, "message longer than 64 MiB"));
      pending.clear();
      overlong = true;
    }
  }
  // Destroy first: that also ends execs still running in those sandboxes,
  // so the drain below is short. A create that finishes during the drain
  // sees the closed session and destroys its sandbox itself.
  session.close();
  bool idle = inflight->wait_idle(drain_s);
  session.close();
  if (!idle) {
    // A call still runs (a long command in a kept sandbox) and uses this
    // frame's protocol and the caller's session: end the process here
    // rather than unwind under it. The daemon ends the command when our
    // connection to it closes.
    std::fprintf(stderr, "airlock mcp: calls still running after %.0f s; exiting\n", drain_s);
    std::_Exit(exit_code);
  }
  return exit_code;
}

}  // namespace airlock::mcp

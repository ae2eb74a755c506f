#include "engine/vmm/qmp.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "common/error.h"

namespace airlock::vmm {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// Milliseconds left until `deadline`, at least 0, for poll().
int ms_left(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() < 0 ? 0 : static_cast<int>(left.count());
}

}  // namespace

int connect_unix(const std::filesystem::path& path, Clock::time_point deadline,
                 const std::function<std::string()>& give_up) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string p = path.string();
  if (p.size() >= sizeof(addr.sun_path))
    throw Error(Errc::invalid_argument, "socket path too long (" + std::to_string(p.size()) +
                                            " bytes, max " +
                                            std::to_string(sizeof(addr.sun_path) - 1) + "): " + p);
  std::memcpy(addr.sun_path, p.c_str(), p.size() + 1);
  for (;;) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw_errno("socket");
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) return fd;
    int err = errno;
    ::close(fd);
    // ENOENT/ECONNREFUSED: the server has not created or started listening on
    // the socket yet; anything else will not get better by waiting.
    if (err != ENOENT && err != ECONNREFUSED) {
      errno = err;
      throw_errno("connect " + p);
    }
    if (give_up) {
      std::string reason = give_up();
      if (!reason.empty()) throw Error(Errc::internal, reason);
    }
    if (Clock::now() >= deadline)
      throw Error(Errc::timeout, "timed out connecting to " + p + ": " + std::strerror(err));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

QmpClient QmpClient::connect(const std::filesystem::path& socket, std::chrono::milliseconds timeout,
                             const std::function<std::string()>& give_up) {
  auto deadline = Clock::now() + timeout;
  QmpClient client(connect_unix(socket, deadline, give_up));
  client.greeting_ = client.read_message(deadline, "QMP greeting");
  if (!client.greeting_.contains("QMP"))
    throw Error(Errc::internal,
                "unexpected QMP greeting on " + socket.string() + ": " + client.greeting_.dump());
  client.execute("qmp_capabilities", json(),
                 std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
  return client;
}

QmpClient::QmpClient(QmpClient&& other) noexcept
    : fd_(other.fd_),
      buffer_(std::move(other.buffer_)),
      greeting_(std::move(other.greeting_)),
      events_(std::move(other.events_)) {
  other.fd_ = -1;
}

QmpClient& QmpClient::operator=(QmpClient&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.fd_;
    other.fd_ = -1;
    buffer_ = std::move(other.buffer_);
    greeting_ = std::move(other.greeting_);
    events_ = std::move(other.events_);
  }
  return *this;
}

QmpClient::~QmpClient() { close(); }

void QmpClient::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void QmpClient::send(const json& message, Clock::time_point deadline, const std::string& what,
                     int pass_fd) {
  if (fd_ < 0) throw Error(Errc::internal, "QMP " + what + ": connection closed");
  std::string line = message.dump() + "\n";
  size_t off = 0;
  while (off < line.size()) {
    ssize_t n;
    if (pass_fd >= 0 && off == 0) {
      // The descriptor goes with the first byte; QEMU attaches it to the
      // command being read.
      iovec iov{line.data(), line.size()};
      alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int))] = {};
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      msg.msg_control = ctrl;
      msg.msg_controllen = sizeof(ctrl);
      cmsghdr* cm = CMSG_FIRSTHDR(&msg);
      cm->cmsg_level = SOL_SOCKET;
      cm->cmsg_type = SCM_RIGHTS;
      cm->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(cm), &pass_fd, sizeof(int));
      n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    } else {
      n = ::send(fd_, line.data() + off, line.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd pfd{fd_, POLLOUT, 0};
      if (::poll(&pfd, 1, ms_left(deadline)) == 0)
        throw Error(Errc::timeout, "QMP " + what + ": timed out sending");
      continue;
    }
    throw Error(Errc::internal, "QMP " + what + ": send failed: " + std::strerror(errno));
  }
}

json QmpClient::read_message(Clock::time_point deadline, const std::string& what) {
  if (fd_ < 0) throw Error(Errc::internal, "QMP " + what + ": connection closed");
  for (;;) {
    size_t nl = buffer_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      if (line.find_first_not_of(" \r\t") == std::string::npos) continue;
      try {
        return json::parse(line);
      } catch (const json::exception& e) {
        throw Error(Errc::internal, "QMP " + what + ": malformed reply: " + line.substr(0, 200));
      }
    }
    // QMP replies are small; a runaway line means something is badly wrong.
    if (buffer_.size() > (16u << 20))
      throw Error(Errc::internal, "QMP " + what + ": reply larger than 16 MiB");
    pollfd pfd{fd_, POLLIN, 0};
    int r = ::poll(&pfd, 1, ms_left(deadline));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw_errno("poll QMP");
    if (r == 0) throw Error(Errc::timeout, "QMP " + what + ": no reply before the deadline");
    char buf[8192];
    ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw Error(Errc::internal,
                  "QMP " + what + ": connection closed by QEMU" +
                      (n < 0 ? std::string(": ") + std::strerror(errno) : std::string()));
    buffer_.append(buf, static_cast<size_t>(n));
  }
}

json QmpClient::execute(const std::string& command, const json& arguments,
                        std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  json request = {{"execute", command}};
  if (!arguments.is_null()) {
    if (!arguments.is_object())
      throw Error(Errc::invalid_argument, "QMP " + command + ": arguments must be an object",
                  "arguments");
    request["arguments"] = arguments;
  }
  send(request, deadline, command);
  return await_reply(deadline, command);
}

void QmpClient::send_fd(const std::string& name, int fd, std::chrono::milliseconds timeout) {
  if (fd < 0) throw Error(Errc::invalid_argument, "QMP getfd: bad descriptor", "fd");
  auto deadline = Clock::now() + timeout;
  send({{"execute", "getfd"}, {"arguments", {{"fdname", name}}}}, deadline, "getfd", fd);
  await_reply(deadline, "getfd");
}

json QmpClient::await_reply(Clock::time_point deadline, const std::string& command) {
  for (;;) {
    json reply = read_message(deadline, command);
    if (reply.contains("event")) {
      // Bounded: a flood of events while we wait must not grow memory forever.
      if (events_.size() >= 1024) events_.pop_front();
      events_.push_back(std::move(reply));
      continue;
    }
    if (reply.contains("return")) return reply["return"];
    if (reply.contains("error")) {
      const json& err = reply["error"];
      throw Error(Errc::internal, "QMP " + command + " failed: " + err.value("class", "?") + ": " +
                                      err.value("desc", "?"));
    }
    throw Error(Errc::internal, "QMP " + command + ": unexpected reply " + reply.dump());
  }
}

json QmpClient::wait_event(const std::string& name, std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  for (;;) {
    for (auto it = events_.begin(); it != events_.end(); ++it) {
      if (it->value("event", "") == name) {
        json ev = std::move(*it);
        events_.erase(it);
        return ev;
      }
    }
    json msg = read_message(deadline, "waiting for event " + name);
    if (msg.contains("event")) {
      if (events_.size() >= 1024) events_.pop_front();
      events_.push_back(std::move(msg));
    }
  }
}

}  // namespace airlock::vmm

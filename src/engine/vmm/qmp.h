// A small, general QMP (QEMU Machine Protocol) client over a unix socket.
//
// QMP is newline-delimited JSON. On connect QEMU sends a greeting
// ({"QMP": {...}}); the client must send qmp_capabilities before any other
// command. Each command gets exactly one {"return": ...} or {"error": ...};
// asynchronous {"event": ...} messages may arrive in between and are queued.
//
//   auto qmp = QmpClient::connect(run_dir / "qmp.sock", std::chrono::seconds(5));
//   qmp.execute("cont");
//   json status = qmp.execute("query-status");   // {"running": true, ...}
//   qmp.send_fd("state", fd);                      // templates: migrate to fd:state
//   qmp.execute("migrate", {{"uri", "fd:state"}});
//
// Every call has a deadline; a missed deadline, a closed socket, malformed
// JSON or a QMP error all throw airlock::Error (timeout / internal), and the
// message names the command and QMP's error class and description.
// One client per QMP socket at a time (QEMU serves one); not thread-safe.
#pragma once

#include <chrono>
#include <deque>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace airlock::vmm {

class QmpClient {
 public:
  // Connects (retrying while the socket does not exist yet or refuses, until
  // `timeout`), reads the greeting and negotiates capabilities.
  // `give_up` as for connect_unix below (e.g. stop early if QEMU exited).
  static QmpClient connect(const std::filesystem::path& socket, std::chrono::milliseconds timeout,
                           const std::function<std::string()>& give_up = {});

  QmpClient(QmpClient&& other) noexcept;
  QmpClient& operator=(QmpClient&& other) noexcept;
  QmpClient(const QmpClient&) = delete;
  QmpClient& operator=(const QmpClient&) = delete;
  ~QmpClient();

  // Runs `command` with `arguments` (an object, or null for none) and returns
  // the "return" value. Throws Error(internal) naming the QMP error class and
  // description, Error(timeout) if no reply came within `timeout`.
  nlohmann::json execute(const std::string& command,
                         const nlohmann::json& arguments = nlohmann::json(),
                         std::chrono::milliseconds timeout = std::chrono::seconds(10));

  // Hands `fd` to QEMU under `name` (QMP getfd: the descriptor travels as
  // SCM_RIGHTS with the command). Migration uses it ("fd:<name>"): QEMU runs
  // with -sandbox spawn=deny and, jailed, cannot open our files itself.
  // Our copy of `fd` stays open (the caller closes it).
  void send_fd(const std::string& name, int fd,
               std::chrono::milliseconds timeout = std::chrono::seconds(10));

  // Waits for an event named `name` (already queued or arriving within
  // `timeout`) and returns it whole ({"event", "data", "timestamp"}).
  nlohmann::json wait_event(const std::string& name, std::chrono::milliseconds timeout);

  // The greeting QEMU sent ({"QMP": {"version": ..., "capabilities": ...}}).
  const nlohmann::json& greeting() const { return greeting_; }
  // Events received while waiting for replies, oldest first.
  std::deque<nlohmann::json>& events() { return events_; }

  void close();

 private:
  explicit QmpClient(int fd) : fd_(fd) {}
  // Reads one JSON message (one line) before `deadline`.
  nlohmann::json read_message(std::chrono::steady_clock::time_point deadline,
                              const std::string& what);
  // `pass_fd` >= 0 rides along (SCM_RIGHTS) with the message's first byte.
  void send(const nlohmann::json& message, std::chrono::steady_clock::time_point deadline,
            const std::string& what, int pass_fd = -1);
  nlohmann::json await_reply(std::chrono::steady_clock::time_point deadline,
                             const std::string& command);

  int fd_ = -1;
  std::string buffer_;
  nlohmann::json greeting_;
  std::deque<nlohmann::json> events_;
};

// Connects a SOCK_STREAM unix socket to `path`, retrying ENOENT/ECONNREFUSED
// until `deadline`. Throws Error(timeout) naming the path; Error(invalid_argument)
// if the path is too long for sockaddr_un. `give_up` (optional) is polled
// between attempts: when it returns a non-empty reason (e.g. "QEMU exited"),
// connect_unix throws Error(internal) with it instead of waiting on.
// Returns a CLOEXEC fd.
int connect_unix(const std::filesystem::path& path, std::chrono::steady_clock::time_point deadline,
                 const std::function<std::string()>& give_up = {});

}  // namespace airlock::vmm

#include "mcp/guardian.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "client/client.h"
#include "client/text.h"
#include "common/error.h"
#include "mcp/session.h"

namespace airlock::mcp {

using nlohmann::json;

Guardian Guardian::start(const std::filesystem::path& socket, const std::string& tag) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) throw_errno("pipe");
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(p[0]);
    ::close(p[1]);
    throw_errno("fork");
  }
  if (pid == 0) {
    ::close(p[1]);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) ::signal(sig, SIG_IGN);
    // Own stdin/stdout would keep the client waiting for EOF on the server's
    // stdout after the server exited; stderr stays for messages.
    int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null >= 0) {
      ::dup2(null, 0);
      ::dup2(null, 1);
      ::close(null);
    }
    int rc = 0;
    try {
      guard_until_eof(p[0], socket, tag);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "airlock mcp guardian: %s\n", e.what());
      rc = 1;
    }
    ::_exit(rc);
  }
  ::close(p[0]);
  return Guardian(p[1]);
}

Guardian::Guardian(Guardian&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }

Guardian::~Guardian() {
  if (fd_ >= 0) ::close(fd_);
}

void Guardian::note(const std::string& id, bool owned) {
  std::string line = (owned ? "+" : "-") + id + "\n";
  std::lock_guard lock(mu_);
  // Short lines on a pipe are written whole (PIPE_BUF); a failure means the
  // guardian is gone, and then there is nobody left to tell.
  while (::write(fd_, line.data(), line.size()) < 0 && errno == EINTR) {
  }
}

std::string new_session_tag() {
  unsigned char bytes[6] = {};
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_errno("opening /dev/urandom");
  ssize_t n = ::read(fd, bytes, sizeof bytes);
  ::close(fd);
  if (n != ssize_t(sizeof bytes)) throw_errno("reading /dev/urandom");
  char hex[sizeof bytes * 2 + 1];
  for (size_t i = 0; i < sizeof bytes; ++i) std::snprintf(hex + 2 * i, 3, "%02x", bytes[i]);
  return "mcp-" + std::to_string(::getpid()) + "-" + hex;
}

int guard_until_eof(int fd, const std::filesystem::path& socket, const std::string& tag,
                    double wait_s) {
  std::set<std::string> owned;
  std::string pending;
  char buf[4096];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    pending.append(buf, size_t(n));
    size_t start = 0;
    for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1) {
      std::string line = pending.substr(start, nl - start);
      if (line.size() < 2) continue;
      if (line[0] == '+') owned.insert(line.substr(1));
      if (line[0] == '-') owned.erase(line.substr(1));
    }
    pending.erase(0, start);
  }
  ::close(fd);
  client::Client client(socket);
  int destroyed = 0;
  std::set<std::string> done;
  auto destroy = [&](const std::string& id) {  // false: try again later (still starting)
    try {
      client.call("DELETE", "/v1/sandboxes/" + client::url_encode(id));
      ++destroyed;
      std::fprintf(stderr, "airlock mcp guardian: destroyed %s (the server ended without it)\n",
                   id.c_str());
    } catch (const Error& e) {
      if (e.code() == Errc::conflict) return false;
      if (e.code() != Errc::not_found)
        std::fprintf(stderr, "airlock mcp guardian: destroying %s failed: %s\n", id.c_str(),
                     e.what());
    }
    done.insert(id);
    return true;
  };
  for (const auto& id : owned) destroy(id);
  if (tag.empty()) return destroyed;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
  while (true) {
    bool again = false;
    try {
      json live = client.call(
          "GET", "/v1/sandboxes?" + client::url_encode(std::string("metadata.") + kSessionLabel) +
                     "=" + client::url_encode(tag));
      for (const auto& sb : live) {
        std::string id = sb.value("id", "");
        if (!id.empty() && !done.count(id) && !destroy(id)) again = true;
      }
    } catch (const Error& e) {
      std::fprintf(stderr, "airlock mcp guardian: listing the session's sandboxes failed: %s\n",
                   e.what());
    }
    if (!again || std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  return destroyed;
}

}  // namespace airlock::mcp

#include "cli/probe_host.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>

#include "common/error.h"
#include "common/process.h"

namespace airlock::cli {

Listener::Listener() {
  fd_ = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd_ >= 0) {
    int off = 0;
    ::setsockopt(fd_, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) close_fd();
  }
  if (fd_ < 0) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd_ < 0) throw_errno("probe: creating the host listener");
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      close_fd();
      throw_errno("probe: binding the host listener");
    }
  }
  if (::listen(fd_, 64) != 0) {
    close_fd();
    throw_errno("probe: listening");
  }
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  ::getsockname(fd_, reinterpret_cast<sockaddr*>(&ss), &len);
  port_ = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                   : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
}

Listener::~Listener() { close_fd(); }

int Listener::drain() {
  while (true) {
    int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) return accepted_;
    ::close(c);
    ++accepted_;
  }
}

void Listener::close_fd() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::vector<int> pids_mentioning(const std::string& marker) {
  namespace fs = std::filesystem;
  std::vector<int> pids;
  std::error_code ec;
  for (const auto& e :
       fs::directory_iterator("/proc", fs::directory_options::skip_permission_denied, ec)) {
    std::string name = e.path().filename();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    int pid = std::stoi(name);
    if (pid == ::getpid()) continue;
    char state = proc_state(pid);
    if (state == 0 || state == 'Z') continue;  // gone, or a zombie
    std::string cmd;
    for (const auto& a : proc_cmdline(pid)) cmd += a + " ";
    if (cmd.find(marker) != std::string::npos) pids.push_back(pid);
  }
  return pids;
}

}  // namespace airlock::cli

// airlock-guest: the agent inside every sandbox VM (api/guest-protocol.md).
//
//   As PID 1 (no arguments): mount, cgroups, hostname, then serve the
//   virtio-serial port named airlock.0. Never exits.
//   On a development host, for tests:
//     airlock-guest --listen-fd N       serve an inherited socket/fd
//     airlock-guest --socket PATH       connect to a unix socket and serve it
//     [--cgroup-root DIR]               put execs in cgroups under DIR
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "guest/init.h"
#include "guest/log.h"
#include "guest/server.h"

using namespace airlock::guest;

namespace {

int usage() {
  logf("usage: airlock-guest [--listen-fd N | --socket PATH] [--cgroup-root DIR]");
  return 2;
}

int connect_unix(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (fd < 0 || path.size() >= sizeof addr.sun_path) return -1;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// PID 1 must never return: if serving ever fails, log and try again.
[[noreturn]] void serve_as_init() {
  pid1_setup();
  std::string cgroup_root = setup_cgroups();
  if (cgroup_root.empty()) logf("cgroup2 unavailable: exec tree-kill uses process groups");
  for (int attempt = 0;; ++attempt) {
    int fd = open_virtio_port("airlock.0");
    if (fd < 0) {
      if (attempt % 50 == 0) logf("waiting for the virtio-serial port airlock.0");
      usleep(100 * 1000);
      continue;
    }
    try {
      Server server({fd, /*system=*/true, /*exit_on_eof=*/false, cgroup_root});
      logf("ready");
      server.run();
    } catch (const std::exception& e) {
      logf("server failed: %s; restarting", e.what());
    }
    close(fd);
    sleep(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  // A vanished host must surface as EPIPE on write, not kill the agent.
  signal(SIGPIPE, SIG_IGN);
  if (getpid() == 1 && argc == 1) serve_as_init();

  int fd = -1;
  std::string cgroup_root;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--listen-fd" && i + 1 < argc) {
      fd = std::atoi(argv[++i]);
    } else if (a == "--socket" && i + 1 < argc) {
      fd = connect_unix(argv[++i]);
      if (fd < 0) {
        logf("connect %s: %s", argv[i], strerror(errno));
        return 1;
      }
    } else if (a == "--cgroup-root" && i + 1 < argc) {
      cgroup_root = argv[++i];
    } else {
      return usage();
    }
  }
  if (fd < 0) return usage();
  // Like init, adopt orphaned descendants, so their exit is seen (SIGCHLD)
  // and the cgroups of finished execs can be removed.
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  fcntl(fd, F_SETFD, FD_CLOEXEC);
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  try {
    Server server({fd, /*system=*/false, /*exit_on_eof=*/true, cgroup_root});
    logf("ready");
    server.run();
  } catch (const std::exception& e) {
    logf("fatal: %s", e.what());
    return 1;
  }
  return 0;
}

// airlock-fake-vm: the process the fake launcher (fake_launcher.h) starts in
// place of QEMU. It is what QEMU is to the engine, minus the machine: it
// listens on <run_dir>/agent.sock (QEMU's chardev server) and serves each
// connection with the REAL airlock-guest (--listen-fd), one host at a time,
// as the VM's agent serves its virtio port. It survives the engine (a daemon
// restart re-adopts it by pid) and writes <run_dir>/fake.pid once listening.
//
// Test knobs, read at every connection: <run_dir>/fake-hello-delay-ms holds
// a delay before the agent starts (so the hello takes that long). Every
// connection is logged to <run_dir>/fake-vm.log as "accept T0 served T1"
// (CLOCK_MONOTONIC ms), which tests use to count concurrent hellos.
//
//   airlock-fake-vm --run-dir DIR --agent /path/to/airlock-guest
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

namespace {

long long mono_ms() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

int read_int(const std::string& path) {
  std::ifstream in(path);
  int v = 0;
  in >> v;
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::string run_dir, agent;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--run-dir") run_dir = argv[i + 1];
    if (a == "--agent") agent = argv[i + 1];
  }
  if (run_dir.empty() || agent.empty()) {
    std::fprintf(stderr, "usage: airlock-fake-vm --run-dir DIR --agent BIN\n");
    return 2;
  }
  ::setsid();
  ::signal(SIGPIPE, SIG_IGN);
  // Orphans of the agent's execs come back here, so kill() finds the whole
  // tree below this pid.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  std::string sock = run_dir + "/agent.sock";
  ::unlink(sock.c_str());
  int lfd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (lfd < 0 || sock.size() >= sizeof addr.sun_path) return 1;
  std::memcpy(addr.sun_path, sock.c_str(), sock.size() + 1);
  if (::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(lfd, 4) != 0) {
    std::perror("listen");
    return 1;
  }
  std::ofstream(run_dir + "/console.log", std::ios::app) << "fake vm: agent on " << sock << "\n";
  {
    std::string tmp = run_dir + "/fake.pid.tmp";
    std::ofstream(tmp) << ::getpid() << "\n";
    ::rename(tmp.c_str(), (run_dir + "/fake.pid").c_str());
  }
  pid_t agent_pid = -1;
  for (;;) {
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    pollfd p{lfd, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    int conn = ::accept4(lfd, nullptr, nullptr, 0);
    if (conn < 0) continue;
    long long t0 = mono_ms();
    // A new host replaces the old one (a restarted daemon): like the VM's
    // agent, which resynchronises on the same port.
    if (agent_pid > 0) {
      ::kill(agent_pid, SIGKILL);
      ::waitpid(agent_pid, nullptr, 0);
      agent_pid = -1;
    }
    if (int delay = read_int(run_dir + "/fake-hello-delay-ms"); delay > 0) ::usleep(delay * 1000);
    std::string fd = std::to_string(conn);
    agent_pid = ::fork();
    if (agent_pid == 0) {
      ::close(lfd);
      ::execl(agent.c_str(), agent.c_str(), "--listen-fd", fd.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(conn);
    std::ofstream(run_dir + "/fake-vm.log", std::ios::app)
        << "accept " << t0 << " served " << mono_ms() << "\n";
  }
}

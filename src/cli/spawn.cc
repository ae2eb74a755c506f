#include "cli/spawn.h"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/spawn.h"
#include "common/unique_fd.h"
#include "daemon/paths.h"

namespace airlock::cli {

namespace {

std::string tail_of(const std::filesystem::path& file, size_t lines) {
  std::ifstream in(file);
  std::vector<std::string> all;
  for (std::string line; std::getline(in, line);) all.push_back(line);
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i)
    out += "\n  " + all[i];
  return out;
}

}  // namespace

void ensure_daemon(const client::Client& client, const DaemonPaths& paths, double wait_s) {
  if (client.listening()) return;
  auto exe = daemon::exe_dir() / "airlockd";
  if (::access(exe.c_str(), X_OK) != 0)
    throw Error(Errc::unavailable, "no airlockd answers on " + paths.socket.string() +
                                       " and none can be started: " + exe.string() + " is missing");
  std::filesystem::create_directories(paths.data_dir);
  auto log = paths.data_dir / "airlockd.log";

  std::vector<std::string> args = {exe.string(), "--data-dir", paths.data_dir.string(), "--socket",
                                   paths.socket.string()};
  if (!paths.image_dir.empty()) {
    args.push_back("--image-dir");
    args.push_back(paths.image_dir.string());
  }
  // Detached (common/spawn.h): re-parented to init at once, never a zombie
  // of this short-lived CLI, out of our terminal's job control (Ctrl-C on
  // the CLI must not reach it), and with none of our descriptors or ignored
  // signals.
  UniqueFd out(::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
  if (out.fd < 0) throw_errno("open " + log.string());
  spawn_detached({.argv = args, .fds = {{1, out.fd}, {2, out.fd}}});

  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
  while (std::chrono::steady_clock::now() < deadline) {
    if (client.ping()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  throw Error(Errc::unavailable,
              "started airlockd, but it did not answer on " + paths.socket.string() + " within " +
                  std::to_string(int(wait_s)) + " s; see " + log.string() + tail_of(log, 5));
}

sigset_t block_terminating_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

}  // namespace airlock::cli

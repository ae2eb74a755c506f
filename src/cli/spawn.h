// Starting airlockd on demand, so a new user needs no service set-up.
#pragma once

#include <signal.h>

#include <filesystem>

#include "client/client.h"

namespace airlock::cli {

struct DaemonPaths {
  std::filesystem::path data_dir;
  std::filesystem::path socket;
  std::filesystem::path image_dir;  // empty: the daemon's default
};

// Returns at once if a daemon listens on `paths.socket` (Client::listening:
// the connection carries the client's first request). Otherwise starts
// `<exe dir>/airlockd --data-dir .. --socket ..` detached (own session, stdio
// to <data dir>/airlockd.log) and waits up to `wait_s` for it to answer.
// Throws Error(unavailable) naming the log file (and its last lines) if it
// does not.
void ensure_daemon(const client::Client& client, const DaemonPaths& paths, double wait_s = 10);

// Blocks SIGINT, SIGTERM and SIGHUP in the calling thread (and every thread
// it starts after) and returns that set, for one thread to sigwait() on:
// `run` and `probe` clean up their sandboxes there before exiting.
sigset_t block_terminating_signals();

}  // namespace airlock::cli

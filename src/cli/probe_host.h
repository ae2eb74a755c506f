// Host-side instruments of `airlock probe` (probe_battery.cc): what the
// probe observes on the daemon's host rather than asks the daemon.
#pragma once

#include <string>
#include <vector>

namespace airlock::cli {

// Host side of the reach checks: a TCP listener on every address (dual
// stack if the host has IPv6) that counts connections that arrive.
//
//   Listener l;  ... guest connects to l.port() ...  l.drain() == 0
class Listener {
 public:
  Listener();  // Error naming the step if no socket can listen
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;
  int port() const { return port_; }
  // Connections accepted so far (each closed at once).
  int drain();

 private:
  void close_fd();
  int fd_ = -1, port_ = 0, accepted_ = 0;
};

// Live processes (not zombies), other than this one, whose command line
// mentions `marker`.
std::vector<int> pids_mentioning(const std::string& marker);

}  // namespace airlock::cli

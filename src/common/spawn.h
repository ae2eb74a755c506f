// Starting a program detached from this process: the one way airlock starts
// what must outlive it (QEMU without a jail, the network helper, airlockd
// started by the CLI, the test suite's fake VM).
//
// fork, setsid, fork again, exec: the program is re-parented to init (or the
// nearest subreaper) at once, so it never becomes our zombie, survives our
// exit or restart, and is out of our terminal's job control (Ctrl-C on the
// CLI does not reach it). Between the forks and exec it gets exactly the
// descriptors named in `fds` (everything else the parent had open is
// closed: a daemon's sockets, journals and other sandboxes' disks never leak
// into a VM or a helper), the default disposition of every signal and an
// empty mask (exec keeps ignored signals; the daemon ignores SIGPIPE).
//
//   Detached d{.argv = {"/usr/bin/qemu-system-x86_64", ...},
//              .fds = {{1, log_fd}, {2, log_fd}, {4, memory_fd}}};
//   pid_t pid = spawn_detached(d);  // stdin, absent from fds, is /dev/null
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

namespace airlock {

struct Detached {
  // argv[0] is the program's path, executed as is (no PATH search).
  std::vector<std::string> argv;
  // {fd in the program, descriptor of ours it becomes}; 0, 1 and 2 not
  // named are /dev/null. Targets must be distinct and below 1024.
  std::vector<std::pair<int, int>> fds;
};

// The program's pid (the grandchild's), once it has been executed.
// Error(unavailable) naming the program if it could not be executed (it is
// reaped or gone before this returns); Error(internal) if fork failed.
pid_t spawn_detached(const Detached& d);

}  // namespace airlock

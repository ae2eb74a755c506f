#include "common/signals.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <string>

namespace airlock {
namespace {

// A child that inherited ignored and blocked signals, including the two
// glibc keeps for itself, execs with none of them.
TEST(Signals, ResetLeavesNothingIgnoredOrBlockedAcrossExec) {
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const std::array<unsigned long, 4> ign{1, 0, 0, 0};  // SIG_IGN
    for (int s : {SIGPIPE, SIGINT, 32, 33})
      ::syscall(SYS_rt_sigaction, s, ign.data(), nullptr, sizeof(uint64_t));
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGCHLD);
    ::sigprocmask(SIG_BLOCK, &block, nullptr);
    reset_signals();
    ::dup2(out[1], 1);
    ::execl("/bin/grep", "grep", "-E", "^Sig(Blk|Ign)", "/proc/self/status", nullptr);
    ::_exit(127);
  }
  ::close(out[1]);
  std::string got;
  char buf[256];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;) got.append(buf, n);
  ::close(out[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(got, "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n");
}

}  // namespace
}  // namespace airlock

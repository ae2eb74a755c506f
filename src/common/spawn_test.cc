#include "common/spawn.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <string>

#include "common/error.h"
#include "common/process.h"

namespace airlock {
namespace {

// Runs `script` detached with a pipe as its fd 3 and returns what it wrote
// there (until every copy of the pipe is closed: the program has exited).
std::string run(const std::string& script, std::vector<std::pair<int, int>> extra = {}) {
  int p[2];
  EXPECT_EQ(::pipe2(p, O_CLOEXEC), 0);
  extra.emplace_back(3, p[1]);
  pid_t pid = spawn_detached({.argv = {"/bin/sh", "-c", script}, .fds = extra});
  ::close(p[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(p[0], buf, sizeof buf)) > 0;) out.append(buf, n);
  ::close(p[0]);
  EXPECT_TRUE(wait_gone(pid, std::chrono::seconds(10)));
  return out;
}

TEST(SpawnDetached, TheProgramGetsOnlyTheDescriptorsNamed) {
  // A descriptor of ours without O_CLOEXEC (as a daemon's socket or
  // journal could be) must not reach the program.
  int leak = ::open("/dev/null", O_RDONLY);
  ASSERT_GE(leak, 0);
  ASSERT_EQ(::dup2(leak, 7), 7);
  std::string out =
      run("for f in 4 5 6 7 8 9; do test -e /proc/self/fd/$f && echo open $f; done; "
          "echo done >&3");
  ::close(7);
  ::close(leak);
  EXPECT_EQ(out, "done\n");
}

TEST(SpawnDetached, DescriptorsArePlacedWhereAsked) {
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  // Our write end becomes its fd 5; its fd 4 (not named) is closed.
  std::string out = run("echo five >&5; test -e /proc/self/fd/4 || echo no4 >&3", {{5, p[1]}});
  ::close(p[1]);
  char buf[64] = {};
  ssize_t n = ::read(p[0], buf, sizeof buf - 1);
  ::close(p[0]);
  EXPECT_EQ(std::string(buf, n > 0 ? n : 0), "five\n");
  EXPECT_EQ(out, "no4\n");
}

TEST(SpawnDetached, StdinIsDevNullAndSignalsAreReset) {
  struct sigaction ign {
  }, old{};
  ign.sa_handler = SIG_IGN;
  ASSERT_EQ(::sigaction(SIGPIPE, &ign, &old), 0);
  std::string out = run("cat; grep -E '^Sig(Ign|Blk)' /proc/self/status >&3");
  ::sigaction(SIGPIPE, &old, nullptr);
  EXPECT_EQ(out, "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n");
}

TEST(SpawnDetached, ItIsItsOwnSessionAndNotOurChild) {
  std::string out = run("echo $(ps -o sid= -p $$) $$ $PPID >&3");
  int sid = 0, pid = 0, ppid = 0;
  ASSERT_EQ(std::sscanf(out.c_str(), "%d %d %d", &sid, &pid, &ppid), 3) << out;
  // Its session is a new one (the first child's: the program is no session
  // leader, so it can never acquire a controlling terminal).
  EXPECT_NE(sid, ::getsid(0));
  EXPECT_NE(sid, pid);
  EXPECT_NE(ppid, ::getpid());
}

TEST(SpawnDetached, AMissingProgramIsAnErrorNamingIt) {
  try {
    spawn_detached({.argv = {"/nonexistent/prog"}, .fds = {}});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::unavailable);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/prog"), std::string::npos) << e.what();
  }
  EXPECT_THROW(spawn_detached({.argv = {"/bin/true"}, .fds = {{1, 1}, {1, 2}}}), Error);
}

}  // namespace
}  // namespace airlock

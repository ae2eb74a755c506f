#include "common/process.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <thread>

namespace airlock {
namespace {

TEST(Process, SeesItselfAndItsArguments) {
  EXPECT_NE(proc_state(::getpid()), 0);
  auto argv = proc_cmdline(::getpid());
  ASSERT_FALSE(argv.empty());
  EXPECT_TRUE(alive_with_arg(::getpid(), argv[0]));
  EXPECT_FALSE(alive_with_arg(::getpid(), "no-such-argument-xyz"));
}

TEST(Process, ChildIsReapedAndThenGone) {
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::setpgid(0, 0);  // so the test can kill the shell and its sleep together
    ::execlp("sh", "sh", "-c", "sleep 30; true", "marker-arg", nullptr);
    ::_exit(127);
  }
  // Wait until exec has happened so the argument is visible.
  for (int i = 0; i < 200 && !alive_with_arg(pid, "marker-arg"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_TRUE(alive_with_arg(pid, "marker-arg"));
  EXPECT_EQ(find_processes({"sleep 30; true", "marker-arg"}), std::vector<pid_t>{pid});
  EXPECT_FALSE(wait_gone(pid, std::chrono::milliseconds(50)));
  ::kill(-pid, SIGKILL);
  EXPECT_TRUE(wait_gone(pid, std::chrono::seconds(5)));
  EXPECT_EQ(proc_state(pid), 0);
  EXPECT_FALSE(alive_with_arg(pid, "marker-arg"));
  EXPECT_TRUE(find_processes({"sleep 30; true", "marker-arg"}).empty());
}

// Not our child, and its leader exits before its other thread: the leader
// shows 'Z' at once, but the process (and its files) lives on until that
// thread ends.
TEST(Process, ZombieLeaderWithALiveThreadIsNotGone) {
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (::fork() == 0) {  // the grandchild: re-parented once `child` exits
      pid_t self = ::getpid();
      std::thread([] { std::this_thread::sleep_for(std::chrono::milliseconds(600)); }).detach();
      (void)!::write(p[1], &self, sizeof self);
      // The leader thread alone goes (no unwinding through gtest); the
      // process stays with its other thread.
      ::syscall(SYS_exit, 0);
    }
    ::_exit(0);
  }
  ::waitpid(child, nullptr, 0);
  pid_t g = 0;
  ASSERT_EQ(::read(p[0], &g, sizeof g), ssize_t(sizeof g));
  ::close(p[0]);
  ::close(p[1]);
  for (int i = 0; i < 200 && proc_state(g) != 'Z'; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ASSERT_EQ(proc_state(g), 'Z');                               // the leader has exited...
  EXPECT_FALSE(wait_gone(g, std::chrono::milliseconds(100)));  // ...its thread has not
  EXPECT_TRUE(wait_gone(g, std::chrono::seconds(5)));
}

// QEMU (vmm) and the templates' version stamp resolve their binaries the
// same way; the search is done before a fork, never by execvp in the child.
TEST(Process, FindsAnExecutableInPathOrSaysItIsNot) {
  const char* saved = std::getenv("PATH");
  std::string old = saved ? saved : "";
  ASSERT_EQ(::setenv("PATH", "/nonexistent-dir:/bin:/usr/bin", 1), 0);
  auto sh = find_in_path("sh");
  ASSERT_TRUE(sh.has_value());
  EXPECT_EQ(sh->front(), '/');
  EXPECT_EQ(::access(sh->c_str(), X_OK), 0);
  EXPECT_EQ(find_in_path("./relative/x"), "./relative/x");  // a path is taken as given
  EXPECT_FALSE(find_in_path("airlock-no-such-binary-here").has_value());
  ASSERT_EQ(::setenv("PATH", "/nonexistent-dir", 1), 0);
  EXPECT_FALSE(find_in_path("sh").has_value());
  if (saved)
    ::setenv("PATH", old.c_str(), 1);
  else
    ::unsetenv("PATH");
}

TEST(Process, MissingFileReadsEmpty) {
  EXPECT_EQ(read_file_capped("/nonexistent/file", 100), "");
  EXPECT_TRUE(proc_cmdline(-1).empty());
}

}  // namespace
}  // namespace airlock

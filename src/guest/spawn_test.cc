#include "guest/spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

namespace airlock::guest {
namespace {

// Runs argv with the plan's other fields, stdout into a pipe; returns
// {exit status, stdout}. Asserts the spawn itself worked.
struct Ran {
  SpawnResult r;
  int status = -1;
  std::string out;
};

Ran run(SpawnPlan plan, std::vector<std::string> args, std::vector<std::string> env = {}) {
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  if (env.empty()) env = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin"};
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  plan.argv = argv.data();
  plan.envp = envp.data();
  int p[2];
  EXPECT_EQ(pipe2(p, O_CLOEXEC), 0);
  plan.out_fd = p[1];
  Ran ran;
  ran.r = spawn_process(plan);
  close(p[1]);
  char buf[4096];
  ssize_t n;
  while ((n = read(p[0], buf, sizeof buf)) > 0) ran.out.append(buf, n);
  close(p[0]);
  if (ran.r.pid > 0) waitpid(ran.r.pid, &ran.status, 0);
  return ran;
}

const SpawnMethod kMethods[] = {SpawnMethod::automatic, SpawnMethod::fork};

std::string name(SpawnMethod m) { return m == SpawnMethod::fork ? "fork" : "automatic"; }

TEST(Spawn, RunsWithEnvCwdAndDefaultSignals) {
  // The agent blocks SIGCHLD and ignores SIGPIPE; its child must not.
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigset_t old;
  sigprocmask(SIG_BLOCK, &chld, &old);
  auto old_pipe = signal(SIGPIPE, SIG_IGN);
  // A parent may also hand us glibc's own real-time signals ignored (a CI
  // runner did): glibc's signal() cannot reset those, the child must anyway.
  std::array<unsigned long, 4> ign{1, 0, 0, 0};  // SIG_IGN
  std::array<std::array<unsigned long, 4>, 2> old_rt{};
  for (int s : {32, 33})
    ASSERT_EQ(syscall(SYS_rt_sigaction, s, ign.data(), old_rt[s - 32].data(), sizeof(uint64_t)), 0);
  char** env_before = environ;
  for (SpawnMethod m : kMethods) {
    SCOPED_TRACE(name(m));
    SpawnPlan plan;
    plan.method = m;
    plan.cwd = "/tmp";
    plan.cpu_seconds = 7;
    Ran r = run(plan,
                {"sh", "-c",
                 "echo $FOO; pwd; grep -E '^Sig(Blk|Ign)' /proc/self/status; "
                 "awk '/Max cpu time/ {print \"cpu\", $4, $5}' /proc/self/limits; exit 3"},
                {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "FOO=bar"});
    ASSERT_GT(r.r.pid, 0) << static_cast<int>(r.r.stage) << " " << strerror(r.r.err);
    ASSERT_TRUE(WIFEXITED(r.status));
    EXPECT_EQ(WEXITSTATUS(r.status), 3);
    EXPECT_NE(r.out.find("bar\n/tmp\n"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("SigBlk:\t0000000000000000"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("SigIgn:\t0000000000000000"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("cpu 7 8\n"), std::string::npos) << r.out;
  }
  // The agent's own environment and signal state are as they were.
  EXPECT_EQ(environ, env_before);
  sigset_t now;
  sigprocmask(SIG_SETMASK, nullptr, &now);
  EXPECT_TRUE(sigismember(&now, SIGCHLD));
  EXPECT_FALSE(sigismember(&now, SIGTERM));
  sigprocmask(SIG_SETMASK, &old, nullptr);
  signal(SIGPIPE, old_pipe);
  for (int s : {32, 33})
    syscall(SYS_rt_sigaction, s, old_rt[s - 32].data(), nullptr, sizeof(uint64_t));
}

TEST(Spawn, OwnSessionAndStdio) {
  for (SpawnMethod m : kMethods) {
    SCOPED_TRACE(name(m));
    SpawnPlan plan;
    plan.method = m;
    // stdin /dev/null (in_fd -1); stderr onto the same pipe via sh.
    Ran r = run(plan, {"sh", "-c", "cat; echo sid=$(cut -d' ' -f6 /proc/self/stat) pid=$$"});
    ASSERT_GT(r.r.pid, 0);
    EXPECT_EQ(r.out, "sid=" + std::to_string(r.r.pid) + " pid=" + std::to_string(r.r.pid) + "\n");
  }
}

// Unset stdio is /dev/null, read-only for stdin and write-only for the
// others, as if the child had opened it; the agent's own /dev/null
// descriptors (opened once, close-on-exec) never reach the program.
TEST(Spawn, UnsetStdioIsDevNullAndTheAgentsCopiesStayBehind) {
  for (SpawnMethod m : kMethods) {
    SCOPED_TRACE(name(m));
    SpawnPlan plan;
    plan.method = m;
    for (int i = 0; i < 2; ++i) {  // the second spawn reuses the agent's descriptors
      Ran r = run(plan, {"sh", "-c",
                         "readlink /proc/self/fd/0 /proc/self/fd/2; "
                         "awk '/^flags/ {print $2}' /proc/$$/fdinfo/0 /proc/$$/fdinfo/2; "
                         "for f in /proc/$$/fd/?; do readlink $f; done | grep -c /dev/null"});
      ASSERT_GT(r.r.pid, 0);
      std::istringstream in(r.out);
      std::string in_path, err_path, in_flags, err_flags, nulls;
      in >> in_path >> err_path >> in_flags >> err_flags >> nulls;
      EXPECT_EQ(in_path, "/dev/null") << r.out;
      EXPECT_EQ(err_path, "/dev/null") << r.out;
      EXPECT_EQ(std::stoul(in_flags, nullptr, 8) & O_ACCMODE, unsigned{O_RDONLY}) << r.out;
      EXPECT_EQ(std::stoul(err_flags, nullptr, 8) & O_ACCMODE, unsigned{O_WRONLY}) << r.out;
      // Of fds 0-9, only 0 and 2 (the shell keeps its own copies at 10 and up).
      EXPECT_EQ(nulls, "2") << r.out;
    }
  }
}

TEST(Spawn, FailuresBeforeExecNameTheStageAndLeaveNoChild) {
  for (SpawnMethod m : kMethods) {
    SCOPED_TRACE(name(m));
    SpawnPlan plan;
    plan.method = m;
    Ran r = run(plan, {"airlock-no-such-binary"});
    EXPECT_EQ(r.r.pid, -1);
    EXPECT_EQ(r.r.stage, SpawnStage::exec);
    EXPECT_EQ(r.r.err, ENOENT);
    plan.cwd = "/nonexistent-airlock-dir";
    r = run(plan, {"true"});
    EXPECT_EQ(r.r.pid, -1);
    EXPECT_EQ(r.r.stage, SpawnStage::cwd);
    EXPECT_EQ(r.r.err, ENOENT);
    // The failed children were reaped.
    EXPECT_EQ(waitpid(-1, nullptr, WNOHANG), -1);
    EXPECT_EQ(errno, ECHILD);
  }
}

TEST(Spawn, SwitchesUser) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root";
  for (SpawnMethod m : kMethods) {
    SCOPED_TRACE(name(m));
    SpawnPlan plan;
    plan.method = m;
    plan.uid = plan.gid = 65534;
    Ran r = run(plan, {"sh", "-c", "id -u; id -g; id -G"});
    ASSERT_GT(r.r.pid, 0);
    EXPECT_EQ(r.out, "65534\n65534\n65534\n");
  }
}

// The agent runs at oom_score_adj -1000 and its exec'd processes at 0. The
// child shares the agent's memory until exec; the kernel spreads an
// oom_score_adj write to every process sharing the memory, except for a
// vfork child (CLONE_VFORK): the agent must keep its own value.
TEST(Spawn, ChildOomScoreIsZeroAndOursStays) {
  auto read_adj = [] {
    char buf[32] = {};
    int fd = open("/proc/self/oom_score_adj", O_RDONLY | O_CLOEXEC);
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    return n > 0 ? std::string(buf, n) : std::string();
  };
  auto write_adj = [](const std::string& v) {
    int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    bool ok = fd >= 0 && write(fd, v.data(), v.size()) == static_cast<ssize_t>(v.size());
    if (fd >= 0) close(fd);
    return ok;
  };
  const std::string before = read_adj();
  // Raised (allowed without privilege; the agent's -1000 needs it): the
  // child's own write of 0 must not reach us either way.
  ASSERT_TRUE(write_adj("300"));
  for (SpawnMethod m : kMethods) {
    SCOPED_TRACE(name(m));
    SpawnPlan plan;
    plan.method = m;
    Ran r = run(plan, {"cat", "/proc/self/oom_score_adj"});
    ASSERT_GT(r.r.pid, 0);
    EXPECT_EQ(r.out, "0\n");
    EXPECT_EQ(read_adj(), "300\n");
  }
  write_adj(before);
}

// A writable cgroup2 directory of our own, or "".
std::string cgroup_dir(const std::string& leaf) {
  for (const char* m : {"/sys/fs/cgroup/unified", "/sys/fs/cgroup"}) {
    struct statfs f {};
    if (statfs(m, &f) != 0 || f.f_type != 0x63677270) continue;
    std::string dir = std::string(m) + "/airlock-spawn-test-" + std::to_string(getpid()) + leaf;
    if (mkdir(dir.c_str(), 0755) == 0) return dir;
  }
  return "";
}

// With clone3 the process is born in the exec's cgroup: it never joins it
// (a cgroup.procs that cannot be written does not matter), so nothing it
// runs, not even the set-up before exec, is outside the cgroup.
TEST(Spawn, Clone3StartsTheChildInItsCgroup) {
  std::string dir = cgroup_dir("");
  if (dir.empty()) GTEST_SKIP() << "no writable cgroup2 here";
  int fd = open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  SpawnPlan plan;
  plan.method = SpawnMethod::clone3;
  plan.cgroup_fd = fd;
  plan.cgroup_procs = "/nonexistent/cgroup.procs";  // would fail a join
  SpawnTrace t;
  std::vector<std::string> args = {"cat", "/proc/self/cgroup"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::string path = "PATH=/usr/bin:/bin";
  char* envp[] = {path.data(), nullptr};
  plan.argv = argv.data();
  plan.envp = envp;
  int p[2];
  ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
  plan.out_fd = p[1];
  SpawnResult r = spawn_process(plan, &t);
  close(p[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(p[0], buf, sizeof buf)) > 0) out.append(buf, n);
  close(p[0]);
  if (r.pid < 0 && r.stage == SpawnStage::clone && (r.err == ENOSYS || r.err == EPERM)) {
    close(fd);
    rmdir(dir.c_str());
    GTEST_SKIP() << "clone3 refused here: " << strerror(r.err);
  }
  ASSERT_GT(r.pid, 0) << static_cast<int>(r.stage) << " " << strerror(r.err);
  waitpid(r.pid, nullptr, 0);
  std::string leaf = dir.substr(dir.rfind('/'));
  EXPECT_NE(out.find(leaf + "\n"), std::string::npos) << out;
  EXPECT_STREQ(t.method, "clone3");
  // The child wrote its stamps into our memory, in order.
  EXPECT_GT(t.child, 0);
  EXPECT_LE(t.clone, t.child);
  EXPECT_LE(t.child, t.setup);
  EXPECT_LE(t.exec, t.back);
  close(fd);
  EXPECT_EQ(rmdir(dir.c_str()), 0) << strerror(errno);

  // The fork path joins through cgroup.procs instead, and says so when it cannot.
  plan.method = SpawnMethod::fork;
  plan.cgroup_fd = -1;
  plan.out_fd = -1;
  SpawnResult f = spawn_process(plan);
  EXPECT_EQ(f.pid, -1);
  EXPECT_EQ(f.stage, SpawnStage::cgroup);
}

}  // namespace
}  // namespace airlock::guest

// The helper as the daemon starts it (the real airlock-confine from
// build/bin): what a tool it runs can no longer do.
#include "engine/confine/confine.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <thread>

#include "common/error.h"
#include "common/subprocess.h"
#include "engine/confine/lockdown.h"

namespace airlock::engine::confine {
namespace {
namespace fs = std::filesystem;
using namespace std::chrono_literals;

class ConfineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (the helper drops to a leased uid)";
    char tmpl[] = "/tmp/confine-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }
  Result exec(Scratch& s, std::vector<std::string> argv, Limits lim = {}) {
    std::string what = argv[0];
    return run(s.exec(std::move(argv), what, lim));
  }
  fs::path root_only(const std::string& body) {
    fs::path p = dir_ / "secret";
    std::ofstream(p) << body;
    ::chmod(p.c_str(), 0600);
    return p;
  }
  fs::path dir_;
};

TEST_F(ConfineTest, ToolRunsAsLeasedUidWithNoNewPrivsSeccompAndNoCapabilities) {
  Scratch s(dir_);
  auto r = exec(s, {"cat", "/proc/self/status"});
  ASSERT_TRUE(r.ok()) << r.describe();
  EXPECT_NE(r.out.find("Uid:\t" + std::to_string(s.uid())), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("Uid:\t0\t"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("NoNewPrivs:\t1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Seccomp:\t2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("CapEff:\t0000000000000000"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("CapBnd:\t0000000000000000"), std::string::npos) << r.out;
}

TEST_F(ConfineTest, ToolCannotOpenASocket) {
  Scratch s(dir_);
  auto r = exec(s, {"python3", "-c",
                    "import socket\n"
                    "try:\n  socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n"
                    "except PermissionError: print('denied')\n"
                    "else: print('opened')\n"});
  ASSERT_TRUE(r.ok()) << r.describe();
  EXPECT_EQ(r.out, "denied\n");
}

TEST_F(ConfineTest, ToolCannotReadARootOnlyFile) {
  fs::path secret = root_only("hunter2");
  Scratch s(dir_);
  auto r = exec(s, {"cat", secret.string()});
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.out.find("hunter2"), std::string::npos);
  EXPECT_NE(r.err.find("Permission denied"), std::string::npos) << r.describe();
}

TEST_F(ConfineTest, AGivenFileIsReadableAndTheGrantIsUndoneAfter) {
  fs::path secret = root_only("hunter2");
  {
    Scratch s(dir_);
    std::string name = s.give(secret);
    auto r = exec(s, {"cat", name});
    ASSERT_TRUE(r.ok()) << r.describe();
    EXPECT_EQ(r.out, "hunter2");
  }
  struct stat st {};
  ASSERT_EQ(::stat(secret.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_LT(::getxattr(secret.c_str(), "system.posix_acl_access", nullptr, 0), 0)
      << "the ACL entry outlived the Scratch";
}

TEST_F(ConfineTest, TwoJobsOnOneFileEachKeepAccessUntilTheirOwnEnd) {
  // Two `changes` over clones of one template share its disk.
  fs::path secret = root_only("hunter2");
  auto first = std::make_unique<Scratch>(dir_);
  std::string a = first->give(secret);
  {
    Scratch second(dir_);
    std::string b = second.give(secret);
    EXPECT_EQ(exec(second, {"cat", b}).out, "hunter2");
    first.reset();  // the first job ends while the second still runs
    EXPECT_EQ(exec(second, {"cat", b}).out, "hunter2")
        << "the first job's end took the second's access";
  }
  struct stat st {};
  ASSERT_EQ(::stat(secret.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_LT(::getxattr(secret.c_str(), "system.posix_acl_access", nullptr, 0), 0);
}

TEST_F(ConfineTest, ToolSeesNoDescriptorButTheGivenOnes) {
  // A descriptor of the daemon's without O_CLOEXEC (the kind a library
  // opens carelessly) must not reach the tool.
  int leak = ::open(root_only("x").c_str(), O_RDONLY);
  ASSERT_GE(leak, 0);
  ASSERT_EQ(::dup2(leak, 77), 77);
  Scratch s(dir_);
  int mem = ::memfd_create("given", 0);
  ASSERT_GE(mem, 0);
  s.give_fd(mem);
  auto r = exec(s, {"python3", "-c", "import os; print(sorted(os.listdir('/proc/self/fd')))"});
  ::close(77);
  ::close(leak);
  ::close(mem);
  ASSERT_TRUE(r.ok()) << r.describe();
  // 0-2, the given 3, and the directory listdir itself opened.
  EXPECT_EQ(r.out, "['0', '1', '2', '3', '4']\n");
}

TEST_F(ConfineTest, ToolIsKilledAtItsDeadline) {
  Scratch s(dir_);
  Limits lim;
  lim.timeout = 500ms;
  auto t0 = std::chrono::steady_clock::now();
  // A child it forked (no exec needed) is in its process group.
  auto r = exec(s, {"python3", "-c", "import os, time\nos.fork()\ntime.sleep(60)"}, lim);
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_TRUE(r.timed_out);
  EXPECT_LT(took, 10s);
  try {
    r.check();
    FAIL() << "check() did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::timeout);
    EXPECT_NE(std::string(e.what()).find("python3 was killed at its deadline"), std::string::npos)
        << e.what();
  }
  // Killed ones may linger as zombies a moment; a live one would not go.
  SubprocessResult ps;
  for (int i = 0; i < 50; ++i) {
    ps = run_command({"pgrep", "-u", std::to_string(s.uid()), "-r", "R,S,D,T"});
    if (ps.out.empty()) break;
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_EQ(ps.out, "") << "a child of the timed-out tool survived";
}

TEST_F(ConfineTest, ToolHitsItsMemoryLimitWithAnErrorNamingIt) {
  Scratch s(dir_);
  Limits lim;
  lim.memory_bytes = 256ull << 20;
  auto r = run(s.exec({"python3", "-c", "x = bytearray(1 << 30)"}, "python3", lim));
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.err.find("MemoryError"), std::string::npos) << r.describe();
  try {
    r.check();
    FAIL() << "check() did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::unavailable);
    EXPECT_EQ(std::string(e.what()).rfind("python3 exited with status 1", 0), 0u) << e.what();
  }
}

TEST_F(ConfineTest, OutputOverItsBoundIsAFailureNotAPrefix) {
  Scratch s(dir_);
  Limits lim;
  lim.max_output = 4096;
  auto t0 = std::chrono::steady_clock::now();
  auto r = exec(s, {"yes"}, lim);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);  // killed, not waited for
  EXPECT_TRUE(r.out_truncated);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.describe().find("yes sent more output than its bound"), std::string::npos)
      << r.describe();
}

TEST_F(ConfineTest, ToolCannotExecuteAgain) {
  Scratch s(dir_);
  auto r = exec(s, {"sh", "-c", "/bin/true && echo ran || echo refused"});
  EXPECT_EQ(r.out, "refused\n") << r.describe();
}

TEST_F(ConfineTest, ImageOptsNamesBecomeDescriptors) {
  fs::path secret = root_only("x");
  Scratch s(dir_);
  std::string spec = s.give_image_opts(
      R"(json:{"driver":"qcow2","file":{"driver":"file","filename":")" + secret.string() +
      R"("},"backing":{"driver":"raw","file":{"driver":"file","filename":")" + secret.string() +
      R"("}}})");
  EXPECT_EQ(spec.find(secret.string()), std::string::npos) << spec;
  EXPECT_NE(spec.find("/proc/self/fd/3"), std::string::npos) << spec;
  EXPECT_NE(spec.find("/proc/self/fd/4"), std::string::npos) << spec;
}

// The importer's Landlock domain (restrict_paths), in a child of this
// test that is still root with every capability: below its directory it
// works, nothing else is reachable by name, and root's own powers (a
// device node, a hard link to a host file) are of no use.
TEST_F(ConfineTest, LandlockKeepsTheImporterBelowItsDirectory) {
  fs::path box = dir_ / "box";
  fs::create_directories(box);
  fs::path input = dir_ / "input";
  std::ofstream(input) << "archive";
  fs::path host = root_only("host secret");
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int d = ::open(box.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    int f = ::open(input.c_str(), O_RDONLY | O_CLOEXEC);
    if (d < 0 || f < 0 || ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) ::_exit(100);
    if (!restrict_paths(d, f)) ::_exit(101);
    int bad = 0;
    std::string in = "/proc/self/fd/" + std::to_string(f);
    if (::open(in.c_str(), O_RDONLY) < 0) bad |= 1;                            // its input: yes
    if (::openat(d, "made", O_WRONLY | O_CREAT | O_EXCL, 0600) < 0) bad |= 2;  // below: yes
    if (::mkdirat(d, "sub", 0700) != 0) bad |= 4;
    if (::open(host.c_str(), O_RDONLY) >= 0) bad |= 8;  // a host file: no
    if (::open("/etc/hostname", O_RDONLY) >= 0) bad |= 16;
    if (::open(input.c_str(), O_WRONLY) >= 0) bad |= 32;  // its input, to write: no
    if (::mknodat(d, "null", S_IFCHR | 0666, makedev(1, 3)) == 0) bad |= 64;
    if (::linkat(AT_FDCWD, host.c_str(), d, "link", 0) == 0) bad |= 128;
    ::_exit(bad);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "failed checks (bits): " << WEXITSTATUS(status);
  EXPECT_TRUE(fs::exists(box / "made"));
  EXPECT_FALSE(fs::exists(box / "null"));
  EXPECT_FALSE(fs::exists(box / "link"));
}

}  // namespace
}  // namespace airlock::engine::confine

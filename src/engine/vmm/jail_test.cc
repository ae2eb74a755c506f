// Forks real children into the jail and reads their posture back from
// /proc. As root (ctest here) that is the full jail: own uid, namespaces,
// root, cgroup; otherwise what the host allows.
#include "engine/vmm/jail.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <thread>

#include "common/error.h"
#include "common/process.h"
#include "common/subprocess.h"
#include "engine/vmm/jail_ids.h"
#include "engine/vmm/posture.h"

namespace airlock::vmm {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

bool has(const nlohmann::json& arr, const std::string& s) {
  for (const auto& v : arr)
    if (v == s) return true;
  return false;
}

class JailTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/aljailXXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    run_ = dir_ / "run";
    fs::create_directory(run_);
    // Unique per test: ctest may run the cases in parallel.
    spec_.id = "jt-" + std::to_string(::getpid());
    spec_.run_dir = run_;
    spec_.limits = {.memory_bytes = 64ull << 20, .pids = 64, .cpus = 1};
    spec_.fsize_bytes = 1 << 20;
    spec_.pid_file = run_ / "child.pid";
    out_ = ::open((dir_ / "out").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ASSERT_GE(out_, 0);
  }
  void TearDown() override {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      wait_gone(pid_, 5s);
    }
    release_jail(run_);
    ::close(out_);
    fs::remove_all(dir_);
  }
  fs::path dir_, run_;
  JailSpec spec_;
  int out_ = -1;
  pid_t pid_ = -1;
};

TEST_F(JailTest, SleepRunsInTheJailAndItsPostureSaysSo) {
  spec_.exe = "/usr/bin/sleep";
  Jail jail = Jail::prepare(spec_);
  pid_ = jail.spawn({"sleep", "60"}, out_);
  ASSERT_GT(pid_, 1);
  // The host pid, not the namespace's.
  EXPECT_EQ(slurp(spec_.pid_file), std::to_string(pid_) + "\n");
  // Give it a moment to exec (the posture must be sleep's, not the child's).
  for (int i = 0; i < 100 && proc_cmdline(pid_) != std::vector<std::string>{"sleep", "60"}; ++i)
    std::this_thread::sleep_for(20ms);
  nlohmann::json p = read_posture(pid_);
  EXPECT_EQ(p["no_new_privs"], true);
  EXPECT_EQ(p["capabilities"]["effective"], "0000000000000000");
  EXPECT_EQ(p["rlimits"]["core"]["hard"], 0);
  EXPECT_EQ(p["rlimits"]["fsize"]["hard"], 1 << 20);
  EXPECT_EQ(p["rlimits"]["nofile"]["hard"], 4096);
  // sleep has no seccomp filter of its own (QEMU's -sandbox gives that).
  EXPECT_TRUE(has(p["missing"], "seccomp"));
  if (jail.mode() == JailMode::none) GTEST_SKIP() << "no root and no user namespaces here";
  for (const char* ns : {"mnt", "pid", "ipc", "uts", "net"})
    EXPECT_EQ(p["namespaces"][ns]["own"], true) << ns;
  EXPECT_EQ(p["root"]["own"], true);
  // Only what was asked for: the binary's tree, /dev and run_dir's path.
  EXPECT_TRUE(has(p["root"]["entries"], "usr"));
  EXPECT_TRUE(has(p["root"]["entries"], "dev"));
  EXPECT_FALSE(has(p["root"]["entries"], "etc")) << p["root"].dump();
  EXPECT_FALSE(has(p["root"]["entries"], "root")) << p["root"].dump();
  EXPECT_EQ(p["capabilities"]["bounding"], "0000000000000000");
  if (jail.mode() != JailMode::full) GTEST_SKIP() << "not root: no uid, no cgroup";
  EXPECT_GE(p["uid"]["effective"].get<long>(), static_cast<long>(jail_ids().base));
  EXPECT_EQ(p["uid"]["real"], p["uid"]["effective"]);
  EXPECT_EQ(p["gid"]["effective"], p["uid"]["effective"]);
  EXPECT_EQ(jail.uid(), static_cast<uid_t>(p["uid"]["effective"].get<long>()));
  EXPECT_EQ(p["rlimits"]["nproc"]["hard"], 1024);
  EXPECT_EQ(p["cgroup"]["memory_max"], 64ull << 20) << p["cgroup"].dump();
  EXPECT_EQ(p["cgroup"]["pids_max"], 64);
  EXPECT_EQ(p["cgroup"]["cpu_max"], "100000 100000");
  nlohmann::json want_missing = {"seccomp"};
  EXPECT_EQ(p["missing"], want_missing) << p.dump(2);
  EXPECT_TRUE(jail.missing().empty());

  // Killing it and releasing the jail removes the cgroup and the lease.
  std::vector<std::string> cg;
  for (auto& [k, v] : p["cgroup"]["paths"].items()) cg.push_back(v);
  ::kill(pid_, SIGKILL);
  ASSERT_TRUE(wait_gone(pid_, 5s));
  pid_ = -1;
  EXPECT_TRUE(release_jail(run_).empty());
  for (const auto& d : cg) EXPECT_FALSE(fs::exists(d)) << d;
  for (const auto& e : fs::directory_iterator("/run/airlock/jail-leases"))
    EXPECT_NE(slurp(e.path()).rfind(run_.string() + "\n", 0), 0u) << e.path();
  EXPECT_FALSE(fs::exists(run_ / ".jail"));
}

// A warm-pool member starts at a low cpu weight and gets the default at its
// hand-out: both as read back from the process's own cgroup.
TEST_F(JailTest, CpuWeightIsSetAtStartAndChangedLater) {
  if (jail_mode() != JailMode::full) GTEST_SKIP() << "needs root (the full jail's cgroup)";
  auto avail = cgroup_controllers_available();
  if (std::find(avail.begin(), avail.end(), "cpu") == avail.end())
    GTEST_SKIP() << "no cpu controller of ours here";
  spec_.exe = "/usr/bin/sleep";
  spec_.limits.cpu_weight = 10;
  Jail jail = Jail::prepare(spec_);
  pid_ = jail.spawn({"sleep", "60"}, out_);
  ASSERT_GT(pid_, 1);
  EXPECT_EQ(read_cgroup_limits(pid_)["cpu_weight"], 10) << read_cgroup_limits(pid_).dump();
  EXPECT_TRUE(set_sandbox_cpu_weight(spec_.id, kDefaultCpuWeight));
  EXPECT_EQ(read_cgroup_limits(pid_)["cpu_weight"], kDefaultCpuWeight);
  // The quota is a separate knob: untouched.
  EXPECT_EQ(read_cgroup_limits(pid_)["cpu_max"], "100000 100000");
  for (int bad : {0, -1, 10001}) {
    try {
      set_sandbox_cpu_weight(spec_.id, bad);
      ADD_FAILURE() << "weight " << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_argument);
      EXPECT_NE(std::string(e.what()).find(std::to_string(bad)), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(set_sandbox_cpu_weight("../x", 100), Error);
  // A sandbox with no cgroup: the write fails and says which file.
  try {
    set_sandbox_cpu_weight("jt-none-" + std::to_string(::getpid()), 100);
    ADD_FAILURE() << "a missing cgroup was written";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::unavailable);
    EXPECT_NE(std::string(e.what()).find("jt-none-"), std::string::npos) << e.what();
  }
}

TEST_F(JailTest, ShellSeesOnlyItsRootAndCannotReachTheHostsPidFile) {
  if (jail_mode() == JailMode::none) GTEST_SKIP() << "no jail on this host";
  spec_.exe = "/bin/sh";
  Jail jail = Jail::prepare(spec_);
  std::string script =
      "echo pid=$$; echo > " + spec_.pid_file.string() +
      " 1; echo /*; test -e /etc/passwd && echo LEAK-ETC; "
      "test -e /proc/1 && echo LEAK-PROC; touch /usr/x 2>/dev/null && echo RW-USR; "
      "echo hi > " +
      (run_ / "written").string() + " && echo WROTE";
  pid_ = jail.spawn({"sh", "-c", script}, out_);
  ASSERT_TRUE(wait_gone(pid_, 10s));
  pid_ = -1;
  std::string out = slurp(dir_ / "out");
  EXPECT_NE(out.find("pid=1\n"), std::string::npos) << out;  // PID 1 of its own namespace
  EXPECT_EQ(out.find("LEAK"), std::string::npos) << out;
  EXPECT_EQ(out.find("RW-USR"), std::string::npos) << out;
  EXPECT_NE(out.find("WROTE"), std::string::npos) << out;  // run_dir is writable
  EXPECT_NE(out.find("/usr"), std::string::npos) << out;
  EXPECT_EQ(out.find("/etc"), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(run_ / "written"));
  // It wrote "1" into its pid file; the host's copy kept the host pid.
  EXPECT_NE(slurp(spec_.pid_file), "1\n");
  EXPECT_NE(slurp(spec_.pid_file), "");
}

// The host's /dev/kvm is root:kvm 0660: a bind of it would leave the jail's
// uid with EACCES (a KVM host silently ran every sandbox under TCG). The
// jail gets its own node of the same major/minor, owned by its uid.
TEST_F(JailTest, KvmNodeOfTheDevicesMajorMinorIsOpenableByTheJailsUid) {
  if (jail_mode() != JailMode::full) GTEST_SKIP() << "needs root (the full jail)";
  // /dev/kvm where it exists; else any character device stands in for it.
  fs::path device = fs::exists("/dev/kvm") ? "/dev/kvm" : "/dev/zero";
  struct stat host {};
  ASSERT_EQ(::stat(device.c_str(), &host), 0);
  spec_.exe = "/bin/sh";
  spec_.kvm = true;
  spec_.kvm_device = device;
  Jail jail = Jail::prepare(spec_);
  // stat(1) is not in the jail: the shell reports what it can open, and
  // the node it sees is checked from the host through run_dir below.
  pid_ = jail.spawn({"sh", "-c", "exec 3<>/dev/kvm && echo OPENED; echo uid=$(id -u 2>/dev/null)"},
                    out_);
  ASSERT_TRUE(wait_gone(pid_, 10s));
  pid_ = -1;
  std::string out = slurp(dir_ / "out");
  EXPECT_NE(out.find("OPENED"), std::string::npos) << out;
  struct stat node {};
  ASSERT_EQ(::lstat((run_ / "kvm.node").c_str(), &node), 0);
  EXPECT_TRUE(S_ISCHR(node.st_mode));
  EXPECT_EQ(node.st_rdev, host.st_rdev);
  EXPECT_EQ(node.st_uid, jail.uid());
  EXPECT_NE(node.st_uid, 0u);
  EXPECT_EQ(node.st_mode & 07777, 0600u);
  release_jail(run_);
  EXPECT_FALSE(fs::exists(run_ / "kvm.node"));
}

TEST_F(JailTest, MissingPathIsNamedAndNothingIsLeft) {
  spec_.exe = "/usr/bin/sleep";
  spec_.ro = {dir_ / "no-such-kernel"};
  try {
    Jail::prepare(spec_);
    FAIL() << "prepared a jail with a missing file";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::not_found);
    EXPECT_EQ(e.field(), "ro");
    EXPECT_NE(std::string(e.what()).find("no-such-kernel"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_empty(run_));
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/run/airlock/jail-leases", ec))
    EXPECT_NE(slurp(e.path()).rfind(run_.string() + "\n", 0), 0u) << e.path();
}

TEST_F(JailTest, ExecFailureIsReported) {
  spec_.exe = "/usr/bin/sleep";
  Jail jail = Jail::prepare(spec_);
  // argv[0] is only a name; a missing exe would fail in prepare, so make the
  // exec itself fail: sleep with a bad argument exits, but exec works...
  // Instead: the jail's exe is replaced by a directory entry after prepare.
  JailSpec s2 = spec_;
  s2.exe = dir_ / "prog";
  std::ofstream(s2.exe) << "#!/no/such/interpreter\n";
  fs::permissions(s2.exe, fs::perms::owner_all | fs::perms::others_exec | fs::perms::others_read);
  Jail j2 = Jail::prepare(s2);
  try {
    j2.spawn({"prog"}, out_);
    FAIL() << "exec of a script with a missing interpreter succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot execute"), std::string::npos) << e.what();
  }
}

TEST(Qcow2Chain, FollowsRelativeAndAbsoluteBackingFiles) {
  char tmpl[] = "/tmp/alqcowXXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  fs::path d = tmpl;
  fs::create_directory(d / "sub");
  std::ofstream(d / "base.raw").put('x');
  fs::resize_file(d / "base.raw", 1 << 20);
  run_checked({"qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", "../base.raw",
               (d / "sub" / "mid.qcow2").string()});
  run_checked({"qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b",
               (d / "sub" / "mid.qcow2").string(), (d / "top.qcow2").string(), "2M"});
  uint64_t size = 0;
  auto chain = qcow2_chain(d / "top.qcow2", &size);
  ASSERT_EQ(chain.size(), 3u);
  EXPECT_EQ(chain[0], d / "top.qcow2");
  EXPECT_EQ(chain[1], d / "sub" / "mid.qcow2");
  EXPECT_EQ(chain[2], d / "base.raw");
  EXPECT_EQ(size, 2u << 20);
  fs::remove_all(d);
}

TEST(QemuRuntimePaths, IncludeFirmwareAndModules) {
  auto paths = qemu_runtime_paths("/usr/bin/qemu-system-x86_64");
  bool share = false;
  for (const auto& p : paths) share |= p == "/usr/share/qemu";
  EXPECT_TRUE(share);
}

}  // namespace
}  // namespace airlock::vmm

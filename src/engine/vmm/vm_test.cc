// Boots real QEMU (TCG) with a Debian cloud kernel and busybox initramfs.
#include "engine/vmm/vm.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <thread>

#include "common/error.h"
#include "engine/vmm/jail_ids.h"
#include "engine/vmm/jail.h"
#include "engine/vmm/posture.h"
#include "engine/vmm/sealed_ram.h"
#include "engine/vmm/test_support.h"

namespace airlock::vmm {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

template <typename F>
bool wait_for(F pred, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return pred();
}

class VmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::make_temp_dir("alvm");
    cfg_.id = "t1";
    cfg_.run_dir = dir_;
    cfg_.kernel = testing::test_kernel();
    cfg_.disk = testing::test_disk(dir_);
    cfg_.memory_mb = 128;
    cfg_.cpus = 1;
  }
  void TearDown() override {
    if (vm_) vm_->kill();
    fs::remove_all(dir_);
  }
  // Files in run_dir other than the disk.
  std::vector<std::string> leftovers() {
    std::vector<std::string> out;
    for (auto& e : fs::directory_iterator(dir_))
      if (e.path().filename() != "disk.qcow2") out.push_back(e.path().filename());
    return out;
  }
  fs::path dir_;
  VmConfig cfg_;
  std::unique_ptr<Vm> vm_;
};

TEST(QemuArgv, HasTheDevicesAndSocketsOfTheContract) {
  VmConfig c{.id = "abc",
             .run_dir = "/run/x",
             .kernel = "/k/vmlinuz",
             .initrd = "/k/initrd",
             .disk = "/d/over,lay.qcow2",
             .extra_kernel_args = "init=/sbin/airlock-guest",
             .cpus = 2,
             .memory_mb = 512};
  auto a = qemu_argv(c);
  EXPECT_EQ(a[0], "qemu-system-x86_64");
  auto after = [&](const std::string& flag) {
    auto it = std::find(a.begin(), a.end(), flag);
    return it == a.end() || it + 1 == a.end() ? std::string("<missing>") : *(it + 1);
  };
  EXPECT_EQ(after("-machine"), "pc");
  // The translation cache is capped by default (QEMU 7.2's is 1 GiB).
  EXPECT_EQ(after("-accel"), "tcg,tb-size=" + std::to_string(kDefaultTcgTbSizeMb));
  EXPECT_EQ(after("-cpu"), "max");
  VmConfig uncapped = c;
  uncapped.tcg_tb_size_mb = 0;
  auto u = qemu_argv(uncapped);
  EXPECT_NE(std::find(u.begin(), u.end(), "tcg"), u.end());
  EXPECT_EQ(after("-smp"), "2");
  EXPECT_EQ(after("-m"), "512");
  EXPECT_EQ(after("-kernel"), "/k/vmlinuz");
  EXPECT_EQ(after("-initrd"), "/k/initrd");
  EXPECT_EQ(after("-pidfile"), "/run/x/qemu.pid");
  EXPECT_EQ(after("-append"), "console=ttyS0 panic=-1 reboot=t quiet init=/sbin/airlock-guest");
  for (const char* f : {"-S", "-no-reboot", "-nodefaults", "-no-user-config"})
    EXPECT_TRUE(contains(a, f)) << f;
  EXPECT_EQ(after("-display"), "none");
  // Commas in paths are doubled so QEMU's option parser keeps them.
  EXPECT_TRUE(contains(a,
                       "if=none,id=root,file=/d/over,,lay.qcow2,format=qcow2,cache=unsafe,"
                       "discard=unmap"));
  EXPECT_TRUE(contains(a, "virtio-blk-pci,drive=root"));
  EXPECT_TRUE(contains(a, "socket,id=agent,path=/run/x/agent.sock,server=on,wait=off"));
  EXPECT_TRUE(contains(a, "virtserialport,bus=vser.0,chardev=agent,name=airlock.0"));
  EXPECT_TRUE(contains(a, "virtio-rng-pci,rng=rng0"));
  EXPECT_TRUE(contains(a, "socket,id=console,path=/run/x/console.sock,server=on,wait=off"));
  EXPECT_EQ(after("-serial"), "chardev:console");
  EXPECT_TRUE(contains(a, "socket,id=qmp,path=/run/x/qmp.sock,server=on,wait=off"));
  EXPECT_EQ(after("-mon"), "chardev=qmp,mode=control");
  // No network socket: no NIC at all (not even QEMU's default user net).
  EXPECT_FALSE(contains(a, "-netdev"));
  EXPECT_FALSE(contains(a, "-nic"));

  c.net_socket = "/run/x/net,.sock";
  c.net_mac = "52:54:00:ab:cd:ef";
  a = qemu_argv(c);
  EXPECT_EQ(after("-netdev"),
            "stream,id=net0,server=off,addr.type=unix,addr.path=/run/x/net,,.sock");
  EXPECT_TRUE(contains(a, "virtio-net-pci,netdev=net0,mac=52:54:00:ab:cd:ef"));
  // -sandbox stays on with the NIC.
  EXPECT_TRUE(contains(a, "-sandbox"));
  c.net_socket.clear();
  c.net_mac.clear();

  c.accel = Accel::kvm;
  c.initrd.clear();
  a = qemu_argv(c);
  EXPECT_EQ(after("-accel"), "kvm");
  EXPECT_EQ(after("-cpu"), "host");
  EXPECT_FALSE(contains(a, "-initrd"));
}

TEST_F(VmTest, StartCapturesConsoleFromTheFirstByte) {
  cfg_.initrd = testing::test_initramfs("echo AIRLOCK-MARKER-1; poweroff -f");
  vm_ = Vm::start(cfg_);
  EXPECT_GT(vm_->pid(), 0);
  EXPECT_EQ(vm_->agent_socket(), dir_ / "agent.sock");
  EXPECT_TRUE(fs::exists(dir_ / "qmp.sock"));
  ASSERT_TRUE(wait_for(
      [&] { return slurp(vm_->console_log()).find("AIRLOCK-MARKER-1") != std::string::npos; }, 60s))
      << vm_->console_tail();
  // The guest powered off: with -no-reboot QEMU exits by itself.
  EXPECT_TRUE(wait_for([&] { return !vm_->alive(); }, 30s));
  EXPECT_NE(vm_->console_tail(5).find("AIRLOCK-MARKER-1"), std::string::npos);
}

TEST_F(VmTest, KillLeavesNoProcessNoSocketsAndNoZombie) {
  // As the daemon may be: a child subreaper. Then QEMU is re-parented to us
  // and kill() must reap it, or a zombie would remain.
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  cfg_.initrd = testing::test_initramfs("while true; do sleep 100; done");
  vm_ = Vm::start(cfg_);
  pid_t pid = vm_->pid();
  EXPECT_TRUE(vm_->alive());
  EXPECT_EQ(::getppid() == pid, false);
  vm_->kill();
  EXPECT_FALSE(vm_->alive());
  EXPECT_FALSE(fs::exists("/proc/" + std::to_string(pid)));  // reaped, not a zombie
  for (const char* f : {"agent.sock", "console.sock", "qmp.sock", "qemu.pid"})
    EXPECT_FALSE(fs::exists(dir_ / f)) << f;
  vm_->kill();  // idempotent
  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
}

TEST_F(VmTest, ConsoleLogStaysWithinItsCap) {
  cfg_.console_cap_bytes = 8 * 1024;
  // The sleep lets the UART drain before the power goes: under load a
  // poweroff right after the last echo can lose the tail of the output.
  cfg_.initrd = testing::test_initramfs(
      "i=0; while [ $i -lt 600 ]; do echo \"chatty line $i ..............................\"; "
      "i=$((i+1)); done; echo CHATTY-DONE; sleep 2; poweroff -f");
  vm_ = Vm::start(cfg_);
  ASSERT_TRUE(wait_for([&] { return !vm_->alive(); }, 120s)) << vm_->console_tail();
  std::this_thread::sleep_for(200ms);  // let the capture thread drain
  size_t total = fs::file_size(dir_ / "console.log");
  if (fs::exists(dir_ / "console.log.old")) total += fs::file_size(dir_ / "console.log.old");
  EXPECT_LE(total, cfg_.console_cap_bytes);
  EXPECT_GT(total, cfg_.console_cap_bytes / 2);  // it did rotate: output > cap
  std::string tail = vm_->console_tail(3);
  EXPECT_NE(tail.find("CHATTY-DONE"), std::string::npos) << tail;
  EXPECT_EQ(slurp(vm_->console_log()).find("chatty line 0 "), std::string::npos);
}

TEST_F(VmTest, BadKernelPathIsNamedAndNothingIsLeft) {
  cfg_.kernel = dir_ / "no-such-vmlinuz";
  try {
    Vm::start(cfg_);
    FAIL() << "started without a kernel";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::not_found);
    EXPECT_EQ(e.field(), "kernel");
    EXPECT_NE(std::string(e.what()).find("no-such-vmlinuz"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(leftovers().empty());
}

TEST_F(VmTest, QemuStartupFailureCarriesQemusMessageAndCleansUp) {
  // A kernel file QEMU cannot load: passes our checks, fails in QEMU.
  cfg_.kernel = dir_ / "garbage-kernel";
  std::ofstream(cfg_.kernel) << "not a kernel";
  cfg_.initrd = testing::test_initramfs("poweroff -f");
  try {
    Vm::start(cfg_);
    FAIL() << "started with a garbage kernel";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("QEMU"), std::string::npos) << msg;
    EXPECT_NE(msg.find("kernel"), std::string::npos) << msg;  // QEMU's own stderr line
  }
  fs::remove(cfg_.kernel);
  EXPECT_TRUE(leftovers().empty()) << leftovers().front();
}

TEST_F(VmTest, AdoptReattachesToALiveVmAndRefusesOthers) {
  cfg_.initrd = testing::test_initramfs(
      "echo FIRST; sleep 4; echo AFTER-ADOPT; "
      "while true; do sleep 100; done");
  vm_ = Vm::start(cfg_);
  pid_t pid = vm_->pid();
  vm_.reset();  // the "daemon" goes away; QEMU must not
  ASSERT_EQ(::kill(pid, 0), 0);

  // Not ours: an unrelated live process and a pid that does not exist.
  EXPECT_EQ(Vm::adopt(cfg_, ::getpid()), nullptr);
  VmConfig other = cfg_;
  other.run_dir = "/tmp/some-other-run-dir";
  EXPECT_EQ(Vm::adopt(other, pid), nullptr);

  vm_ = Vm::adopt(cfg_, pid);
  ASSERT_NE(vm_, nullptr);
  EXPECT_TRUE(vm_->alive());
  EXPECT_EQ(vm_->pid(), pid);
  EXPECT_TRUE(contains(vm_->argv(), (dir_ / "qemu.pid").string()));
  ASSERT_TRUE(
      wait_for([&] { return vm_->console_tail().find("AFTER-ADOPT") != std::string::npos; }, 90s))
      << vm_->console_tail();
  vm_->kill();
  EXPECT_EQ(Vm::adopt(cfg_, pid), nullptr);  // dead
}

// Templates: a guest saved mid-run continues in a clone (same RAM, same
// CPU state: the shell loop keeps printing the marker it chose before the
// save; a reboot would choose a new one), and the template's RAM file is not
// written by the clone (MAP_PRIVATE).
TEST_F(VmTest, CloneContinuesTheSavedGuestWithoutTouchingTheTemplateRam) {
  cfg_.initrd = testing::test_initramfs(
      "M=$(cat /proc/sys/kernel/random/uuid); echo \"MARK $M\"; "
      "while true; do sleep 0.3; echo \"STILL $M\"; done");
  cfg_.memory_file = dir_ / "tpl.ram";
  cfg_.memory_shared = true;
  vm_ = Vm::start(cfg_);
  std::string mark;
  ASSERT_TRUE(wait_for(
      [&] {
        std::string log = slurp(vm_->console_log());
        auto at = log.find("STILL ");
        if (at == std::string::npos) return false;
        mark = log.substr(at + 6, 36);
        return mark.size() == 36;
      },
      120s))
      << vm_->console_tail();
  fs::path state = dir_ / "tpl.state";
  uint64_t bytes = vm_->save_state(state);
  EXPECT_GT(bytes, 0u);
  EXPECT_LT(bytes, 4u << 20);  // device state only: RAM stays in the file
  vm_->kill();
  struct stat before {};
  ASSERT_EQ(::stat(cfg_.memory_file.c_str(), &before), 0);

  fs::path clone_dir = testing::make_temp_dir("alcl");
  VmConfig c = cfg_;
  c.id = "clone1";
  c.run_dir = clone_dir;
  c.disk = testing::test_disk(clone_dir);
  c.memory_shared = false;
  c.incoming_state = state;
  // A clone without the sealed copy is refused: it would get the file.
  EXPECT_THROW(Vm::start(c), Error);
  auto sealed = SealedRam::copy_of(cfg_.memory_file);
  EXPECT_EQ(sealed->size(), fs::file_size(cfg_.memory_file));
  c.memory_fd = sealed->fd();
  auto clone = Vm::start(c);
  bool continued = wait_for(
      [&] { return slurp(clone->console_log()).find("STILL " + mark) != std::string::npos; }, 60s);
  std::string log = slurp(clone->console_log());
  // Read back from the running clone: it holds the sealed memfd, and the
  // template's RAM file is not in its root at all.
  EXPECT_TRUE(template_ram_sealed(clone->pid(), kInheritedFd));
  if (::geteuid() == 0) {
    fs::path inside = "/proc/" + std::to_string(clone->pid()) + "/root" + cfg_.memory_file.string();
    std::error_code ec;
    EXPECT_FALSE(fs::exists(inside, ec)) << inside;
  }
  // Nobody, the daemon included, can change the pages clones share.
  char byte = 1;
  EXPECT_EQ(::pwrite(sealed->fd(), &byte, 1, 0), -1);
  EXPECT_EQ(errno, EPERM);
  clone->kill();
  fs::remove_all(clone_dir);
  EXPECT_TRUE(continued) << log;
  EXPECT_EQ(log.find("MARK"), std::string::npos) << "the clone rebooted: " << log;
  struct stat after {};
  ASSERT_EQ(::stat(cfg_.memory_file.c_str(), &after), 0);
  EXPECT_EQ(after.st_mtim.tv_sec, before.st_mtim.tv_sec);
  EXPECT_EQ(after.st_mtim.tv_nsec, before.st_mtim.tv_nsec);
}

TEST_F(VmTest, CloneFromACorruptStateFailsWithQemusReasonAndLeavesNothing) {
  cfg_.initrd = testing::test_initramfs("while true; do sleep 1; done");
  cfg_.memory_file = dir_ / "tpl.ram";
  {
    std::ofstream ram(cfg_.memory_file, std::ios::binary);
    ram.seekp((128 << 20) - 1);
    ram.put('\0');
  }
  fs::path state = dir_ / "bad.state";
  std::ofstream(state, std::ios::binary) << "QEVM garbage, not a migration stream";
  cfg_.memory_shared = false;
  cfg_.incoming_state = state;
  auto sealed = SealedRam::copy_of(cfg_.memory_file);
  cfg_.memory_fd = sealed->fd();
  try {
    vm_ = Vm::start(cfg_);
    FAIL() << "a garbage state file was loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("QEMU"), std::string::npos) << e.what();
  }
  for (auto& f : leftovers())
    EXPECT_TRUE(f == "tpl.ram" || f == "bad.state") << "left behind: " << f;
}

TEST_F(VmTest, QemuRunsJailedAndThePostureReadBackShowsIt) {
  cfg_.id = "jailvm-" + std::to_string(::getpid());
  cfg_.initrd = testing::test_initramfs("echo JAILED-BOOT; while true; do sleep 100; done");
  vm_ = Vm::start(cfg_);
  ASSERT_TRUE(wait_for(
      [&] { return vm_->console_tail().find("JAILED-BOOT") != std::string::npos; }, 90s))
      << vm_->console_tail();
  nlohmann::json p = read_posture(vm_->pid());
  EXPECT_EQ(p["seccomp"], 2);  // QEMU's -sandbox
  EXPECT_EQ(p["no_new_privs"], true);
  // The pid file holds the host pid (QEMU's own would say 1).
  EXPECT_EQ(slurp(dir_ / "qemu.pid"), std::to_string(vm_->pid()) + "\n");
  if (::geteuid() != 0) GTEST_SKIP() << "the full jail needs root";
  EXPECT_TRUE(p["missing"].empty()) << p.dump(2);
  EXPECT_GE(p["uid"]["effective"].get<long>(), static_cast<long>(jail_ids().base));
  // RAM + the translation cache's cap + 256 MiB + RAM/4 (jail_spec).
  EXPECT_EQ(p["cgroup"]["memory_max"], (128ull + kDefaultTcgTbSizeMb + 256 + 32) << 20);
  EXPECT_EQ(p["cgroup"]["cpu_max"], "100000 100000");
  std::vector<std::string> cgs;
  for (auto& [k, v] : p["cgroup"]["paths"].items()) cgs.push_back(v);
  vm_->kill();
  for (const auto& d : cgs) EXPECT_FALSE(fs::exists(d)) << d;
}

}  // namespace
}  // namespace airlock::vmm

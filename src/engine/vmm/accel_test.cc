#include "engine/vmm/accel.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/error.h"
#include "engine/vmm/test_support.h"
#include "protocol/frame.h"

namespace airlock::vmm {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

class AccelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::make_temp_dir("alacc");
    // A copy: the test changes its mtime to invalidate the cache.
    kernel_ = dir_ / "vmlinuz";
    fs::copy_file(testing::test_kernel(), kernel_);
    cfg_.kernel = kernel_;
    cfg_.initrd = testing::test_initramfs("while true; do sleep 100; done");
    cfg_.disk = testing::test_disk(dir_);
    cfg_.work_dir = dir_ / "probe";
    cfg_.cache_file = dir_ / "accel.json";
    cfg_.deadline = 3s;
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_, kernel_;
  ProbeConfig cfg_;
};

TEST_F(AccelTest, NoKvmDeviceMeansTcgAtOnce) {
  cfg_.kvm_device = dir_ / "no-kvm-here";
  auto t0 = std::chrono::steady_clock::now();
  AccelVerdict v = probe_accel(cfg_);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 100ms);
  EXPECT_EQ(v.accel, Accel::tcg);
  EXPECT_NE(v.reason.find("no-kvm-here"), std::string::npos) << v.reason;
  EXPECT_FALSE(fs::exists(cfg_.cache_file));
}

TEST_F(AccelTest, ThisHostSaysTcgQuickly) {
  // Whatever /dev/kvm is here: without it the answer is instant; with a
  // broken KVM the probe must still answer within its deadline.
  auto t0 = std::chrono::steady_clock::now();
  AccelVerdict v = probe_accel(cfg_);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, cfg_.deadline + 10s);
  if (!fs::exists("/dev/kvm")) {
    EXPECT_EQ(v.accel, Accel::tcg);
  }
  EXPECT_FALSE(v.reason.empty());
  // The probe boot runs jailed: its verdict must be the boot's real outcome,
  // never the jail's uid failing to open the host's root:kvm 0660 node.
  EXPECT_EQ(v.reason.find("Permission denied"), std::string::npos) << v.reason;
}

TEST_F(AccelTest, AFailedProbeBootIsCachedUntilTheKeyChanges) {
  // An openable "KVM device" that is not KVM: the probe boot really runs
  // QEMU with -accel kvm, which fails here (or would hang with a bad KVM).
  cfg_.kvm_device = "/dev/null";
  if (fs::exists("/dev/kvm")) GTEST_SKIP() << "host has /dev/kvm; probe outcome differs";
  AccelVerdict v = probe_accel(cfg_);
  EXPECT_EQ(v.accel, Accel::tcg);
  EXPECT_FALSE(v.from_cache);
  EXPECT_NE(v.reason.find("did not reach the agent within 3 s"), std::string::npos) << v.reason;
  EXPECT_NE(v.reason.find("KVM"), std::string::npos) << v.reason;  // QEMU's own complaint
  ASSERT_TRUE(fs::exists(cfg_.cache_file));
  EXPECT_TRUE(fs::is_empty(cfg_.work_dir));  // the probe's run dir is gone

  AccelVerdict again = probe_accel(cfg_);
  EXPECT_TRUE(again.from_cache);
  EXPECT_EQ(again.reason, v.reason);

  fs::last_write_time(kernel_, fs::last_write_time(kernel_) - 1h);  // "new guest kernel"
  AccelVerdict fresh = probe_accel(cfg_);
  EXPECT_FALSE(fresh.from_cache);

  std::ofstream(cfg_.cache_file) << "{not json";  // corrupt cache: probe again, no throw
  EXPECT_FALSE(probe_accel(cfg_).from_cache);
}

TEST(AgentHello, CompletesTheHandshakeWithTheFrameCodec) {
  fs::path dir = testing::make_temp_dir("alhello");
  fs::path sock = dir / "agent.sock";
  int lfd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, sock.c_str());
  ASSERT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(lfd, 1), 0);
  std::string got_from_host;
  std::thread guest([&] {
    int c = ::accept(lfd, nullptr, nullptr);
    protocol::Decoder dec;
    char buf[512];
    while (true) {
      ssize_t n = ::read(c, buf, sizeof(buf));
      if (n <= 0) break;
      dec.feed(buf, static_cast<size_t>(n));
      if (auto f = dec.next()) {
        got_from_host = f->payload;
        break;
      }
    }
    // Reply split in two writes: the host must reassemble.
    std::string out = protocol::encode({protocol::Type::hello, 0, 0, "{\"version\":1,\"g\":1}"});
    (void)!::write(c, out.data(), 5);
    std::this_thread::sleep_for(20ms);
    (void)!::write(c, out.data() + 5, out.size() - 5);
    ::close(c);
  });
  std::string reply = agent_hello(sock, std::chrono::steady_clock::now() + 5s);
  guest.join();
  EXPECT_EQ(nlohmann::json::parse(reply)["g"], 1);
  EXPECT_EQ(nlohmann::json::parse(got_from_host)["version"], protocol::kVersion);

  // A guest that never answers: timeout by the deadline.
  std::thread silent([&] {
    int c = ::accept(lfd, nullptr, nullptr);
    std::this_thread::sleep_for(500ms);
    ::close(c);
  });
  EXPECT_THROW(agent_hello(sock, std::chrono::steady_clock::now() + 200ms), Error);
  silent.join();
  ::close(lfd);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace airlock::vmm

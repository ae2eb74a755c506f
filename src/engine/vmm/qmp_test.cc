#include "engine/vmm/qmp.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "common/error.h"
#include "engine/vmm/test_support.h"
#include "engine/vmm/vm.h"

namespace airlock::vmm {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// A one-shot fake QMP server: sends `greeting`, then answers each line with
// the next canned reply (or stays silent once they run out).
class FakeQmp {
 public:
  FakeQmp(fs::path path, std::string greeting, std::vector<std::string> replies)
      : path_(std::move(path)) {
    listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strcpy(addr.sun_path, path_.c_str());
    EXPECT_EQ(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(listen_fd_, 1), 0);
    thread_ = std::thread([this, greeting, replies] {
      int c = ::accept(listen_fd_, nullptr, nullptr);
      if (c < 0) return;
      (void)!::write(c, greeting.data(), greeting.size());
      std::string buf;
      char ch;
      size_t next = 0;
      while (::read(c, &ch, 1) == 1) {
        if (ch != '\n') continue;
        if (next < replies.size()) {
          const std::string& r = replies[next++];
          (void)!::write(c, r.data(), r.size());
        }
      }
      ::close(c);
    });
  }
  ~FakeQmp() {
    ::shutdown(listen_fd_, SHUT_RDWR);
    ::close(listen_fd_);
    thread_.join();
    fs::remove(path_);
  }

 private:
  fs::path path_;
  int listen_fd_;
  std::thread thread_;
};

const char* kGreeting = "{\"QMP\": {\"version\": {}, \"capabilities\": []}}\n";

TEST(Qmp, ExecuteReturnsResultAndQueuesEvents) {
  fs::path dir = testing::make_temp_dir("alqmp");
  FakeQmp fake(dir / "q.sock", kGreeting,
               {"{\"return\": {}}\n",
                "{\"event\": \"STOP\", \"data\": {}}\r\n{\"return\": {\"running\": false}}\n"});
  auto qmp = QmpClient::connect(dir / "q.sock", 2s);
  EXPECT_TRUE(qmp.greeting().contains("QMP"));
  auto r = qmp.execute("query-status");
  EXPECT_EQ(r["running"], false);
  auto ev = qmp.wait_event("STOP", 100ms);
  EXPECT_EQ(ev["event"], "STOP");
  qmp.close();
  fs::remove_all(dir);
}

TEST(Qmp, ErrorsNameTheQmpErrorAndDeadlinesHold) {
  fs::path dir = testing::make_temp_dir("alqmp");
  FakeQmp fake(dir / "q.sock", kGreeting,
               {"{\"return\": {}}\n",
                "{\"error\": {\"class\": \"GenericError\", \"desc\": \"bad thing\"}}\n"});
  auto qmp = QmpClient::connect(dir / "q.sock", 2s);
  try {
    qmp.execute("frobnicate");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("frobnicate failed: GenericError: bad thing"),
              std::string::npos)
        << e.what();
  }
  auto t0 = std::chrono::steady_clock::now();
  try {
    qmp.execute("query-status", nullptr, 200ms);  // the fake stays silent now
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::timeout);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  EXPECT_THROW(qmp.execute("x", nlohmann::json::array()), Error);  // args must be an object
  qmp.close();
  fs::remove_all(dir);
}

TEST(Qmp, ConnectTimesOutOnAMissingSocket) {
  auto t0 = std::chrono::steady_clock::now();
  try {
    QmpClient::connect("/tmp/airlock-no-such-qmp.sock", 200ms);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::timeout);
    EXPECT_NE(std::string(e.what()).find("airlock-no-such-qmp.sock"), std::string::npos);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
}

TEST(Qmp, DrivesARealQemu) {
  fs::path dir = testing::make_temp_dir("alqmp");
  VmConfig cfg;
  cfg.id = "qmp";
  cfg.run_dir = dir;
  cfg.kernel = testing::test_kernel();
  cfg.initrd = testing::test_initramfs("while true; do sleep 100; done");
  cfg.disk = testing::test_disk(dir);
  cfg.memory_mb = 128;
  auto vm = Vm::start(cfg);
  {
    auto qmp = QmpClient::connect(dir / "qmp.sock", 5s);
    auto status = qmp.execute("query-status");
    EXPECT_EQ(status["running"], true);
    EXPECT_EQ(status["status"], "running");
    try {
      qmp.execute("no-such-command");
      FAIL();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("CommandNotFound"), std::string::npos) << e.what();
    }
    qmp.execute("stop");
    EXPECT_EQ(qmp.execute("query-status")["status"], "paused");
    qmp.execute("quit");
  }
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (vm->alive() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(vm->alive());
  vm->kill();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace airlock::vmm

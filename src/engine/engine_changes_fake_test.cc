// GET .../changes on the fake launcher: one call per sandbox at a time, and
// its scratch space counted in the same disk admission as sandboxes' disks
// (Config::disk_free_mb stands in for the data filesystem's free space).
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>

#include "engine/engine_fake_test_support.h"
#include "engine/engine_impl.h"

namespace airlock::engine {
namespace {

using namespace std::chrono_literals;

class ChangesFake : public testing::FakeVmTest {
 protected:
  // The free MiB disk admission sees; while `hold_` is set, a caller asking
  // waits in the question until it is cleared (a changes call held there).
  void SetUp() override {
    FakeVmTest::SetUp();
    if (IsSkipped()) return;
    cfg_.disk_free_mb = [this] {
      std::unique_lock lock(mu_);
      if (hold_) {
        ++held_;
        cv_.notify_all();
        cv_.wait(lock, [&] { return !hold_; });
      }
      return free_mb_.load();
    };
  }
  void hold(bool on) {
    std::lock_guard lock(mu_);
    hold_ = on;
    cv_.notify_all();
  }
  bool wait_held() {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, 10s, [&] { return held_ > 0; });
  }
  std::atomic<int64_t> free_mb_{1 << 20};
  std::mutex mu_;
  std::condition_variable cv_;
  bool hold_ = false;
  int held_ = 0;
};

Error error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "no error";
  return Error(Errc::internal, "");
}

TEST(DiskAdmission, NamesWhatDidNotFitAndNoPath) {
  EXPECT_NO_THROW(lifecycle::check_disk_space(100, 60, 40, "x", "disk_mb"));
  EXPECT_NO_THROW(
      lifecycle::check_disk_space(-1, 60, 400, "x", "disk_mb"));  // unknown: not refused
  Error e = error_of([] { lifecycle::check_disk_space(100, 60, 41, "disk_mb=41", "disk_mb"); });
  EXPECT_EQ(e.code(), Errc::unavailable);
  EXPECT_EQ(e.field(), "disk_mb");
  EXPECT_EQ(std::string(e.what()),
            "not enough disk for disk_mb=41: the sandboxes and changes calls already admitted "
            "hold 60 MiB in total and the host's data filesystem has 100 MiB free");
}

TEST_F(ChangesFake, OneCallPerSandboxAtATime) {
  Engine engine(cfg_);
  SandboxInfo a = engine.create({.image = "minimal", .disk_mb = 256});
  SandboxInfo b = engine.create({.image = "minimal", .disk_mb = 256});
  hold(true);
  auto first = std::async(std::launch::async, [&] { return engine.changes(a.id, "start", false); });
  ASSERT_TRUE(wait_held());  // the first call is in its disk admission
  Error e = error_of([&] { engine.changes(a.id, "start", false); });
  EXPECT_EQ(e.code(), Errc::conflict);
  EXPECT_NE(std::string(e.what()).find("a changes call on sandbox " + a.id + " is already running"),
            std::string::npos)
      << e.what();
  hold(false);
  EXPECT_EQ(first.get()["sandbox"], a.id);
  // Done: the next call on it runs, and another sandbox's never waited on it.
  EXPECT_EQ(engine.changes(a.id, "start", false)["sandbox"], a.id);
  EXPECT_EQ(engine.changes(b.id, "start", false)["sandbox"], b.id);
}

TEST_F(ChangesFake, ScratchCountsAgainstDiskAdmission) {
  free_mb_ = 1000;
  Engine engine(cfg_);
  SandboxInfo sb = engine.create({.image = "minimal", .disk_mb = 512});
  // 512 admitted + 512 of scratch (the overlay's virtual size; the image's
  // raw rootfs is read as is) > 1000 free.
  Error e = error_of([&] { engine.changes(sb.id, "start", false); });
  EXPECT_EQ(e.code(), Errc::unavailable);
  EXPECT_NE(std::string(e.what()).find("this changes call's scratch space (512 MiB"),
            std::string::npos)
      << e.what();
  EXPECT_EQ(std::string(e.what()).find(data_.string()), std::string::npos) << e.what();
  // The refused call reserved nothing: a 488 MiB create still fits.
  SandboxInfo other = engine.create({.image = "minimal", .disk_mb = 488});
  testing::destroy_wait(engine, other.id);
  free_mb_ = 1024;
  EXPECT_EQ(engine.changes(sb.id, "start", false)["sandbox"], sb.id);
  // Released after a call that ran too: the same create fits again.
  free_mb_ = 1000;
  other = engine.create({.image = "minimal", .disk_mb = 488});
  testing::destroy_wait(engine, other.id);
}

}  // namespace
}  // namespace airlock::engine

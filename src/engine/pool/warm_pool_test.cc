// The warm pool behind its seam: a fake lifecycle makes members (no VM) and
// records which were ended, so slots, learning, replacement, shedding and
// hand-out-once are checked without QEMU. The engine-level behaviour (a
// create served by a member) is in engine_pool_fake_test.cc.
#include "engine/pool/warm_pool.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <set>
#include <thread>

#include "engine/audit/journal.h"
#include "engine/registry/registry.h"

namespace airlock::engine::pool {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

template <class F>
bool eventually(F f, std::chrono::milliseconds limit = 5s) {
  auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (f()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return f();
}

fs::path temp_dir() {
  std::string tmpl = (fs::temp_directory_path() / "airlock-pool-XXXXXX").string();
  if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp");
  return tmpl;
}

class FakeMembers final : public Members {
 public:
  explicit FakeMembers(const fs::path& dir) : registry_(dir / "reg.db"), journal_(dir / "j") {}

  std::shared_ptr<Sandbox> make(const Key& key) override {
    std::lock_guard lock(mu_);
    if (fail_image_ == key.image) throw std::runtime_error("cannot make " + key.image);
    SandboxRecord rec;
    rec.info.id = "m-" + std::to_string(++made_);
    rec.info.spec.image = key.image;
    rec.info.spec.memory_mb = key.memory_mb;
    return std::make_shared<Sandbox>(rec, registry_, journal_);
  }
  bool usable(const Sandbox& sb, bool untouched) const override {
    std::lock_guard lock(mu_);
    return !dead_.count(sb.id()) && (!untouched || !touched_.count(sb.id()));
  }
  void end(Sandbox& sb, const std::string& reason) override {
    std::lock_guard lock(mu_);
    ended_[sb.id()] = reason;
  }
  void end_async(const std::shared_ptr<Sandbox>& sb, const std::string& reason) override {
    end(*sb, "async: " + reason);
  }

  int made() const {
    std::lock_guard lock(mu_);
    return made_;
  }
  std::map<std::string, std::string> ended() const {
    std::lock_guard lock(mu_);
    return ended_;
  }
  void kill(const std::string& id) {
    std::lock_guard lock(mu_);
    dead_.insert(id);
  }
  void touch(const std::string& id) {
    std::lock_guard lock(mu_);
    touched_.insert(id);
  }
  void fail(const std::string& image) {
    std::lock_guard lock(mu_);
    fail_image_ = image;
  }

 private:
  Registry registry_;
  AuditJournal journal_;
  mutable std::mutex mu_;
  int made_ = 0;
  std::set<std::string> dead_, touched_;
  std::string fail_image_;
  std::map<std::string, std::string> ended_;
};

int ready_of(const WarmPool& pool, const std::string& image) {
  int n = 0;
  for (const auto& s : pool.info())
    if (s["image"] == image) n += s["ready"].get<int>();
  return n;
}

class WarmPoolTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = temp_dir(); }
  void TearDown() override { fs::remove_all(dir_); }
  Options opts(int learn_shapes = 0, int64_t learn_mb = 1024) {
    Options o;
    o.tick_ms = 10;
    o.learn_shapes = learn_shapes;
    o.learn_memory_mb = learn_mb;
    o.pressure = [this] { return pressure_.load(); };
    return o;
  }
  fs::path dir_;
  std::atomic<bool> pressure_{false};
};

TEST_F(WarmPoolTest, FillsASlotAndHandsEachMemberOutOnce) {
  FakeMembers members(dir_);
  WarmPool pool(opts(), members);
  const Key key{"minimal"};
  pool.set_slot(key, 2);
  pool.start();
  ASSERT_TRUE(eventually([&] { return ready_of(pool, "minimal") == 2; }));
  auto a = pool.take(key), b = pool.take(key);
  ASSERT_TRUE(a && b);
  EXPECT_NE(a->id(), b->id());
  // Another shape of the same image is a miss: no learning configured.
  EXPECT_EQ(pool.take(Key{"minimal", 2}), nullptr);
  auto counts = pool.counts();
  EXPECT_EQ(counts["minimal"].first, 2);
  EXPECT_EQ(counts["minimal"].second, 0);  // the other shape has no slot: not counted
  // Refilled after the hand-outs.
  EXPECT_TRUE(eventually([&] { return ready_of(pool, "minimal") == 2; }));
  EXPECT_EQ(members.made(), 4);
  pool.stop();
  auto ended = members.ended();
  EXPECT_EQ(ended.size(), 2u);  // the two still ready; the taken ones are not the pool's
  EXPECT_FALSE(ended.count(a->id()));
  for (const auto& [id, why] : ended) EXPECT_EQ(why, "warm pool drained (daemon stopping)");
}

TEST_F(WarmPoolTest, ADeadOrTouchedMemberIsNeverHandedOutAndIsReplaced) {
  FakeMembers members(dir_);
  WarmPool pool(opts(), members);
  const Key key{"minimal"};
  pool.set_slot(key, 1);
  pool.start();
  ASSERT_TRUE(eventually([&] { return ready_of(pool, "minimal") == 1; }));
  // A stream opened on its channel since the warm-up: someone reached it.
  const std::string touched = pool.info()[0]["members"][0];
  members.touch(touched);
  EXPECT_EQ(pool.take(key), nullptr);
  EXPECT_EQ(members.ended()[touched], "async: pool member died while idle");
  EXPECT_EQ(pool.info()[0]["replaced"], 1);
  EXPECT_EQ(pool.counts()["minimal"].second, 1);  // a miss
  // A member that dies while idle is replaced by the thread.
  ASSERT_TRUE(eventually([&] { return ready_of(pool, "minimal") == 1; }));
  const std::string third = pool.info()[0]["members"][0];
  members.kill(third);
  EXPECT_TRUE(eventually([&] { return members.ended().count(third) == 1; }));
  EXPECT_EQ(members.ended()[third], "dropped from the warm pool");
  EXPECT_TRUE(eventually([&] {
    auto info = pool.info();
    return info[0]["ready"] == 1 && info[0]["members"][0] != third;
  }));
}

TEST_F(WarmPoolTest, LearningStaysWithinItsBudgetAndEvictsTheLeastRecentlyUsed) {
  FakeMembers members(dir_);
  WarmPool pool(opts(/*learn_shapes=*/2, /*learn_mb=*/1024), members);
  pool.start();
  const Key a{"a", 1, 256}, b{"b", 1, 256}, c{"c", 1, 256}, huge{"h", 1, 2048};
  EXPECT_EQ(pool.take(a), nullptr);
  ASSERT_TRUE(eventually([&] { return ready_of(pool, "a") == 1; }));
  EXPECT_EQ(pool.take(b), nullptr);
  ASSERT_TRUE(eventually([&] { return ready_of(pool, "b") == 1; }));
  // A third shape: the least recently used learned one (a) goes, with its
  // member, ended by the thread.
  EXPECT_EQ(pool.take(c), nullptr);
  const std::string a_member = "m-1";
  EXPECT_TRUE(eventually([&] { return members.ended().count(a_member) == 1; }));
  std::set<std::string> images;
  for (const auto& s : pool.info()) {
    images.insert(s["image"]);
    EXPECT_TRUE(s["learned"].get<bool>());
  }
  EXPECT_EQ(images, (std::set<std::string>{"b", "c"}));
  // A shape over the whole budget is never learned.
  EXPECT_EQ(pool.take(huge), nullptr);
  for (const auto& s : pool.info()) EXPECT_NE(s["image"], "h");
  // Misses keep coming: a learned slot grows to two members, no more.
  EXPECT_EQ(pool.take(Key{"z", 1, 256}), nullptr);  // evicts b (LRU)
  ASSERT_TRUE(eventually([&] {
    pool.take(Key{"z", 1, 256});  // a hit does not grow it; a miss does
    for (const auto& s : pool.info())
      if (s["image"] == "z") return s["target"] == 2;
    return false;
  }));
  // An operator's slot is never learned over or evicted.
  pool.set_slot(Key{"op", 1, 256}, 1);
  for (const auto& k : {Key{"x", 1, 256}, Key{"y", 1, 256}}) pool.take(k);
  bool op_left = false;
  for (const auto& s : pool.info())
    if (s["image"] == "op") op_left = !s["learned"].get<bool>() && s["target"] == 1;
  EXPECT_TRUE(op_left);
}

TEST_F(WarmPoolTest, UnderPressureMembersAreShedLearnedFirstAndNotRefilled) {
  FakeMembers members(dir_);
  WarmPool pool(opts(/*learn_shapes=*/2), members);
  pool.set_slot(Key{"op"}, 1);
  pool.start();
  EXPECT_EQ(pool.take(Key{"learned"}), nullptr);
  ASSERT_TRUE(
      eventually([&] { return ready_of(pool, "op") == 1 && ready_of(pool, "learned") == 1; }));
  const int made = members.made();
  pressure_ = true;
  ASSERT_TRUE(eventually([&] { return ready_of(pool, "learned") == 0; }));
  // The configured slot sheds only once no learned member is left.
  ASSERT_TRUE(eventually([&] { return ready_of(pool, "op") == 0; }));
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(members.made(), made);  // nothing refilled under pressure
  int shed = 0;
  for (const auto& s : pool.info()) shed += s["shed"].get<int>();
  EXPECT_EQ(shed, 2);
  pressure_ = false;
  EXPECT_TRUE(eventually([&] { return ready_of(pool, "op") == 1; }));
}

TEST_F(WarmPoolTest, AShapeThatCannotBeMadeIsForgottenIfLearnedAndRemovingASlotEndsItsMembers) {
  FakeMembers members(dir_);
  WarmPool pool(opts(/*learn_shapes=*/2), members);
  members.fail("broken");
  pool.start();
  EXPECT_EQ(pool.take(Key{"broken"}), nullptr);
  EXPECT_TRUE(eventually([&] { return pool.info().empty(); }));
  pool.set_slot(Key{"minimal"}, 2);
  ASSERT_TRUE(eventually([&] { return ready_of(pool, "minimal") == 2; }));
  auto ids = pool.info()[0]["members"];
  pool.set_slot(Key{"minimal"}, 0);
  EXPECT_TRUE(pool.info().empty());
  for (const auto& id : ids)
    EXPECT_EQ(members.ended()[id.get<std::string>()], "warm pool slot removed");
}

// std::stod on /proc/pressure/memory ran outside any try in the pool
// thread: a malformed line would have killed the daemon.
TEST(MemoryPressure, MalformedFilesNeverThrow) {
  fs::path dir = temp_dir();
  std::ofstream(dir / "meminfo") << "MemTotal: 1000 kB\nMemAvailable: 900 kB\n";
  for (const char* psi : {"some avg10=garbage avg60=0.00\n", "some avg10=\n",
                          "some avg10=1e999999 x\n", "", "\x01\x02 avg10=-"}) {
    std::ofstream(dir / "psi") << psi;
    bool p = true;
    EXPECT_NO_THROW(p = memory_pressure(dir / "meminfo", dir / "psi")) << psi;
    EXPECT_FALSE(p) << psi;
  }
  std::ofstream(dir / "psi") << "some avg10=55.00 avg60=0.00 avg300=0.00 total=1\n";
  EXPECT_TRUE(memory_pressure(dir / "meminfo", dir / "psi"));
  std::ofstream(dir / "meminfo") << "MemTotal: garbage\n";
  EXPECT_NO_THROW(memory_pressure(dir / "meminfo", dir / "nope"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace airlock::engine::pool

// The warm pool's shapes and its learning, on the fake launcher (the real
// engine and agent, no QEMU): a slot per shape, each create served only by
// its own shape; learned slots made on a miss, grown while misses come,
// bounded by count and memory, forgotten when idle, and never touching a
// configured slot (docs/design.md, "Warm pool").
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "engine/engine_fake_test_support.h"
#include "engine/vmm/cgroup.h"

namespace airlock::engine {
namespace {

using namespace std::chrono_literals;

// The pool member a handed-out sandbox was (its `created` record says).
std::string pool_member_of(Engine& e, const std::string& id) {
  for (auto& r : e.audit(id))
    if (r["event"] == "created") return r.value("pool_member", "");
  return "";
}

class PoolFake : public testing::FakeVmTest {
 protected:
  // The slot of `image` with that memory_mb (and no NIC), or null.
  static nlohmann::json slot(Engine& e, int memory_mb, const std::string& image = "minimal") {
    for (auto& s : e.pool_info())
      if (s["image"] == image && s["shape"]["memory_mb"] == memory_mb &&
          s["shape"]["network"] == false)
        return s;
    return nullptr;
  }
  // Holds every VM start off the test's own thread (the pool's) until
  // release(): a learned slot's member stays "being made", so creates miss.
  void hold_pool_starts() {
    const auto me = std::this_thread::get_id();
    fake_->before_start = [this, me](const vmm::VmConfig&) {
      if (std::this_thread::get_id() == me) return;
      std::unique_lock lock(gate_mu_);
      gate_cv_.wait(lock, [&] { return released_; });
    };
  }
  void release() {
    {
      std::lock_guard lock(gate_mu_);
      released_ = true;
    }
    gate_cv_.notify_all();
  }
  // Declared after the Engine: releases the held starts before the engine
  // stops (its pool thread may be waiting in one), also when a test fails.
  struct ReleaseAtExit {
    PoolFake* t;
    ~ReleaseAtExit() { t->release(); }
  };
  void TearDown() override {
    release();
    FakeVmTest::TearDown();
  }
  std::mutex gate_mu_;
  std::condition_variable gate_cv_;
  bool released_ = false;
};

// A member is cloned and warmed at a low cpu weight, so a refill yields the
// CPU to sandboxes in use, and gets the default weight at its hand-out; a
// sandbox that is not a member never runs at the low weight.
TEST_F(PoolFake, AMemberYieldsTheCpuUntilItsHandOut) {
  ASSERT_EQ(cfg_.pool_cpu_weight, 10);  // the default
  Engine engine(cfg_);
  engine.set_pool("minimal", 1);
  ASSERT_TRUE(eventually([&] {
    auto s = slot(engine, 256);
    return !s.is_null() && s["ready"] == 1;
  }));
  std::string member = slot(engine, 256)["members"][0];
  EXPECT_EQ(fake_->cpu_weight(member), 10);
  SandboxInfo got = engine.create({.image = "minimal"});
  ASSERT_EQ(got.start, "pool");
  // The VM keeps the member's name; the sandbox has its public id.
  EXPECT_EQ(fake_->cpu_weight(member), vmm::kDefaultCpuWeight);
  // Its replacement waits at the low weight again; a create of a shape with
  // no slot boots at the default.
  ASSERT_TRUE(eventually([&] { return slot(engine, 256)["ready"] == 1; }));
  EXPECT_EQ(fake_->cpu_weight(slot(engine, 256)["members"][0]), 10);
  SandboxInfo other = engine.create({.image = "minimal", .memory_mb = 128});
  EXPECT_EQ(other.start, "boot");
  EXPECT_EQ(fake_->cpu_weight(other.id), vmm::kDefaultCpuWeight);
  engine.destroy(got.id);
  engine.destroy(other.id);
}

// A member has only an internal name until its hand-out mints the public
// id: nothing the operator could list before (pool, sandboxes, their
// journals) names the id a create then returns. The row is renamed, not
// copied, and the sandbox survives a restart under its public id.
TEST_F(PoolFake, TheIdOfAPoolHitExistedNowhereBefore) {
  std::string id, member;
  {
    Engine engine(cfg_);
    engine.set_pool("minimal", 2);
    ASSERT_TRUE(eventually([&] { return slot(engine, 256)["ready"] == 2; }));
    std::string seen = engine.pool_info().dump();
    for (const auto& sb : engine.list({}, true)) seen += " " + sb.id;
    for (const auto& m : slot(engine, 256)["members"]) {
      EXPECT_EQ(m.get<std::string>().rfind("pool-", 0), 0u) << m;
      for (const auto& r : engine.audit(m.get<std::string>())) seen += r.dump();
    }
    std::error_code ec;
    for (const auto& f : std::filesystem::recursive_directory_iterator(data_, ec))
      seen += " " + f.path().string();
    SandboxInfo got = engine.create({.image = "minimal"});
    ASSERT_EQ(got.start, "pool");
    id = got.id;
    member = pool_member_of(engine, id);
    EXPECT_EQ(id.rfind("sb-", 0), 0u) << id;
    EXPECT_EQ(seen.find(id), std::string::npos) << id << " was visible before its hand-out";
    // Renamed: the member's name is no sandbox any more.
    EXPECT_THROW(engine.get(member), Error);
    EXPECT_EQ(engine.get(id).state, State::running);
    EXPECT_EQ(sh(engine, id, "echo mine"), "mine\n");
    engine.set_pool("minimal", 0);
  }  // the daemon stops: the member left in the pool goes, the handed-out one runs on
  Engine engine(cfg_);
  SandboxInfo again = engine.get(id);
  EXPECT_EQ(again.state, State::running) << again.reason;
  EXPECT_EQ(again.start, "pool");
  EXPECT_EQ(sh(engine, id, "echo back"), "back\n");
  for (const auto& sb : engine.list()) EXPECT_EQ(sb.id, id);  // no pool member re-adopted
  testing::destroy_wait(engine, id);
  EXPECT_EQ(fake_vms(), 0u);
  EXPECT_EQ(run_dirs(), 0u);
}

TEST_F(PoolFake, ACpuWeightOutOfRangeIsRefusedByName) {
  for (int bad : {0, 10001}) {
    cfg_.pool_cpu_weight = bad;
    try {
      Engine engine(cfg_);
      ADD_FAILURE() << "pool_cpu_weight " << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_argument);
      EXPECT_EQ(e.field(), "pool_cpu_weight");
      EXPECT_NE(std::string(e.what()).find(std::to_string(bad)), std::string::npos) << e.what();
    }
  }
}

// Two shapes of one image at once, each create served by its own shape; a
// size 0 removes only its own shape.
TEST_F(PoolFake, ShapesOfOneImageCoexistAndServeOnlyTheirOwn) {
  Engine engine(cfg_);
  engine.set_pool("minimal", 1);
  engine.set_pool("minimal", 1, {{"memory_mb", 128}});
  ASSERT_EQ(engine.pool_info().size(), 2u);
  ASSERT_TRUE(eventually([&] {
    auto a = slot(engine, 256), b = slot(engine, 128);
    return !a.is_null() && !b.is_null() && a["ready"] == 1 && b["ready"] == 1;
  }));
  std::string small_member = slot(engine, 128)["members"][0];
  std::string plain_member = slot(engine, 256)["members"][0];
  SandboxInfo small = engine.create({.image = "minimal", .memory_mb = 128});
  EXPECT_EQ(small.start, "pool");
  EXPECT_EQ(pool_member_of(engine, small.id), small_member);
  EXPECT_EQ(small.spec.memory_mb, 128);
  SandboxInfo plain = engine.create({.image = "minimal"});
  EXPECT_EQ(plain.start, "pool");
  EXPECT_EQ(pool_member_of(engine, plain.id), plain_member);
  // A shape with no slot is not served by another's members.
  ASSERT_TRUE(eventually([&] { return slot(engine, 256)["ready"] == 1; }));
  SandboxInfo other = engine.create({.image = "minimal", .cpus = 2});
  EXPECT_NE(other.start, "pool");
  EXPECT_EQ(slot(engine, 256)["ready"], 1);
  engine.set_pool("minimal", 0, {{"memory_mb", 128}});
  auto left = engine.pool_info();
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0]["shape"]["memory_mb"], 256);
  EXPECT_EQ(left[0]["learned"], false);
  for (auto* s : {&small, &plain, &other}) testing::destroy_wait(engine, s->id);
  engine.set_pool("minimal", 0);
  EXPECT_TRUE(engine.pool_info().empty());
  EXPECT_TRUE(eventually([&] { return fake_vms() == 0; }));
}

// A miss learns its shape (1 member); misses while none is ready grow it
// to 2 and no further; the next create of the shape is a pool hit.
TEST_F(PoolFake, AMissLearnsItsShapeAndMissesGrowItToTwo) {
  cfg_.pool_learn_shapes = 4;
  cfg_.pool_learn_memory_mb = 4096;
  hold_pool_starts();
  Engine engine(cfg_);
  ReleaseAtExit released{this};
  SandboxInfo a = engine.create({.image = "minimal"});
  EXPECT_NE(a.start, "pool");
  auto s = slot(engine, 256);
  ASSERT_FALSE(s.is_null()) << engine.pool_info().dump();
  EXPECT_EQ(s["learned"], true);
  EXPECT_EQ(s["target"], 1);
  EXPECT_EQ(s["misses"], 1);
  SandboxInfo b = engine.create({.image = "minimal"});
  SandboxInfo c = engine.create({.image = "minimal"});
  EXPECT_NE(b.start, "pool");
  EXPECT_NE(c.start, "pool");
  EXPECT_EQ(slot(engine, 256)["target"], 2);  // grown once, capped at 2
  EXPECT_EQ(slot(engine, 256)["misses"], 3);
  release();
  ASSERT_TRUE(eventually([&] { return slot(engine, 256)["ready"] == 2; }));
  SandboxInfo d = engine.create({.image = "minimal"});
  EXPECT_EQ(d.start, "pool");
  EXPECT_EQ(slot(engine, 256)["hits"], 1);
  for (auto* x : {&a, &b, &c, &d}) testing::destroy_wait(engine, x->id);
}

// At most pool_learn_shapes learned shapes, their members' memory_mb within
// pool_learn_memory_mb: the least recently used go; a shape over the whole
// budget is never learned; a configured slot is neither counted, evicted
// nor grown.
TEST_F(PoolFake, LearnedShapesAreBoundedByCountAndMemory) {
  cfg_.pool_learn_shapes = 2;
  cfg_.pool_learn_memory_mb = 400;
  hold_pool_starts();
  Engine engine(cfg_);
  ReleaseAtExit released{this};
  engine.set_pool("minimal", 1, {{"memory_mb", 512}});  // configured, over the budget
  std::vector<SandboxInfo> made;
  auto create = [&](int mb) {
    made.push_back(engine.create({.image = "minimal", .memory_mb = mb}));
    return made.back();
  };
  create(128);
  create(64);
  ASSERT_FALSE(slot(engine, 128).is_null());
  ASSERT_FALSE(slot(engine, 64).is_null());
  // Count: a third shape evicts the least recently used (128).
  create(96);
  EXPECT_TRUE(slot(engine, 128).is_null()) << engine.pool_info().dump();
  EXPECT_FALSE(slot(engine, 64).is_null());
  EXPECT_FALSE(slot(engine, 96).is_null());
  // Memory: the count makes 64 go, and 96 + 320 > 400 makes 96 go too.
  create(320);
  EXPECT_TRUE(slot(engine, 64).is_null()) << engine.pool_info().dump();
  EXPECT_TRUE(slot(engine, 96).is_null());
  EXPECT_EQ(slot(engine, 320)["target"], 1);
  // Growth needs room too: 2 x 320 > 400.
  create(320);
  EXPECT_EQ(slot(engine, 320)["target"], 1);
  EXPECT_EQ(slot(engine, 320)["misses"], 2);
  // Over the whole budget: never learned.
  create(1024);
  EXPECT_TRUE(slot(engine, 1024).is_null());
  // The configured slot: its misses counted, never grown, never learned.
  create(512);
  create(512);
  auto conf = slot(engine, 512);
  EXPECT_EQ(conf["learned"], false);
  EXPECT_EQ(conf["target"], 1);
  EXPECT_EQ(conf["misses"], 2);
  release();
  for (auto& x : made) testing::destroy_wait(engine, x.id);
}

// A learned shape unused for pool_learn_idle_s goes, its members deleted;
// setting it with set_pool makes it configured (then it stays).
TEST_F(PoolFake, IdleLearnedShapesAreForgottenConfiguredOnesStay) {
  cfg_.pool_learn_shapes = 4;
  cfg_.pool_learn_idle_s = 1;
  Engine engine(cfg_);
  SandboxInfo a = engine.create({.image = "minimal"});
  SandboxInfo b = engine.create({.image = "minimal", .memory_mb = 128});
  testing::destroy_wait(engine, a.id);
  testing::destroy_wait(engine, b.id);
  engine.set_pool("minimal", 1, {{"memory_mb", 128}});
  EXPECT_EQ(slot(engine, 128)["learned"], false);
  ASSERT_TRUE(eventually([&] { return slot(engine, 256).is_null(); }, 10s))
      << engine.pool_info().dump();
  // Its member went with it: only the configured slot's remain.
  ASSERT_TRUE(eventually([&] { return slot(engine, 128)["ready"] == 1 && fake_vms() == 1; }));
  std::this_thread::sleep_for(1500ms);
  EXPECT_FALSE(slot(engine, 128).is_null());
  engine.set_pool("minimal", 0, {{"memory_mb", 128}});
  EXPECT_TRUE(eventually([&] { return fake_vms() == 0; }));
}

}  // namespace
}  // namespace airlock::engine

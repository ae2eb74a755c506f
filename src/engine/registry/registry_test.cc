#include "engine/registry/registry.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <thread>

#include "common/error.h"

namespace airlock::engine {
namespace {

namespace fs = std::filesystem;

class RegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "airlock-registry-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  static SandboxRecord record(const std::string& id, int64_t created) {
    SandboxRecord r;
    r.info.id = id;
    r.info.spec.image = "minimal";
    r.info.spec.cpus = 2;
    r.info.spec.memory_mb = 512;
    r.info.spec.env = {{"A", "1"}, {"B", "two words"}};
    r.info.spec.metadata = {{"owner", "test"}};
    r.info.state = State::starting;
    r.info.accel = "tcg";
    r.info.start = "boot";
    r.info.created_at_ms = created;
    r.info.expires_at_ms = created + 600000;
    r.run_dir = "/tmp/run/" + id;
    return r;
  }

  fs::path dir_;
};

TEST_F(RegistryTest, InsertGetRoundTripsEveryField) {
  Registry reg(dir_ / "registry.db");
  reg.insert(record("sb-000000000001", 1000));
  auto got = reg.get("sb-000000000001");
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->info.spec.image, "minimal");
  EXPECT_EQ(got->info.spec.cpus, 2);
  EXPECT_EQ(got->info.spec.memory_mb, 512);
  EXPECT_EQ(got->info.spec.env.at("B"), "two words");
  EXPECT_EQ(got->info.spec.metadata.at("owner"), "test");
  EXPECT_EQ(got->info.state, State::starting);
  EXPECT_EQ(got->info.accel, "tcg");
  EXPECT_EQ(got->info.created_at_ms, 1000);
  EXPECT_EQ(got->info.expires_at_ms, 601000);
  EXPECT_EQ(got->run_dir, "/tmp/run/sb-000000000001");
  EXPECT_FALSE(reg.get("sb-nope").has_value());
}

TEST_F(RegistryTest, DuplicateInsertIsConflict) {
  Registry reg(dir_ / "registry.db");
  reg.insert(record("sb-a", 1));
  try {
    reg.insert(record("sb-a", 2));
    FAIL() << "expected conflict";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::conflict);
  }
}

TEST_F(RegistryTest, StateTransitionsAndListFilter) {
  Registry reg(dir_ / "registry.db");
  reg.insert(record("sb-a", 1));
  reg.insert(record("sb-b", 2));
  reg.insert(record("sb-c", 3));
  reg.set_running("sb-a", 4242, 3400);
  reg.set_running("sb-b", 4243, 3500);
  reg.set_state("sb-b", State::deleted, "deleted by caller");

  auto a = reg.get("sb-a");
  EXPECT_EQ(a->info.state, State::running);
  EXPECT_EQ(a->info.pid, 4242);
  EXPECT_EQ(a->info.boot_ms, 3400);
  auto b = reg.get("sb-b");
  EXPECT_EQ(b->info.state, State::deleted);
  EXPECT_EQ(b->info.reason, "deleted by caller");
  EXPECT_EQ(b->info.pid, 0) << "terminal states forget the pid";

  auto live = reg.list(false);
  ASSERT_EQ(live.size(), 2u);
  EXPECT_EQ(live[0].info.id, "sb-a");
  EXPECT_EQ(live[1].info.id, "sb-c");
  auto all = reg.list(true);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[1].info.id, "sb-b");
}

TEST_F(RegistryTest, UnknownIdsAreNotFound) {
  Registry reg(dir_ / "registry.db");
  EXPECT_THROW(reg.set_state("sb-x", State::failed), Error);
  EXPECT_THROW(reg.set_running("sb-x", 1, 1), Error);
  EXPECT_THROW(reg.update(record("sb-x", 1)), Error);
}

TEST_F(RegistryTest, PersistsAcrossReopen) {
  {
    Registry reg(dir_ / "registry.db");
    reg.insert(record("sb-a", 1));
    auto r = record("sb-a", 1);
    r.info.reason = "vmm exited";
    r.info.state = State::failed;
    reg.update(r);
  }
  Registry again(dir_ / "registry.db");
  auto got = again.get("sb-a");
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->info.state, State::failed);
  EXPECT_EQ(got->info.reason, "vmm exited");
}

TEST_F(RegistryTest, ConcurrentWritersDoNotLoseRows) {
  Registry reg(dir_ / "registry.db");
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) reg.insert(record("sb-" + std::to_string(t * 100 + i), i));
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(reg.list(true).size(), 100u);
}

TEST_F(RegistryTest, UnopenableDatabaseIsInternalError) {
  try {
    Registry reg(dir_ / "missing-dir" / "registry.db");
    FAIL() << "expected error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::internal);
    EXPECT_NE(std::string(e.what()).find("missing-dir"), std::string::npos);
  }
}

}  // namespace
}  // namespace airlock::engine

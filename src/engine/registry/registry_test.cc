#include "engine/registry/registry.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <sys/stat.h>

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

TEST_F(RegistryTest, FailureIsStoredWithFailedStateOnly) {
  Registry reg(dir_ / "registry.db");
  reg.insert(record("sb-f", 1));
  reg.set_state("sb-f", State::failed, "QEMU killed by signal 9", "vmm_died");
  EXPECT_EQ(reg.get("sb-f")->info.failure, "vmm_died");
  EXPECT_EQ(reg.get("sb-f")->info.reason, "QEMU killed by signal 9");
  // A failure is meaningless for any other state: it is not kept.
  reg.insert(record("sb-t", 2));
  reg.set_state("sb-t", State::timed_out, "idle for 5 s", "vmm_died");
  EXPECT_EQ(reg.get("sb-t")->info.failure, "");
  auto r = record("sb-u", 3);
  r.info.state = State::failed;
  r.info.failure = "guest_panic";
  reg.insert(r);
  EXPECT_EQ(reg.get("sb-u")->info.failure, "guest_panic");
}

// A registry.db written before the failure column existed opens, keeps its
// rows (failure empty) and accepts failures afterwards.
TEST_F(RegistryTest, OldDatabaseWithoutFailureColumnIsMigrated) {
  fs::path db = dir_ / "registry.db";
  std::string sql =
      "CREATE TABLE sandboxes (id TEXT PRIMARY KEY, spec TEXT NOT NULL, state TEXT NOT NULL,"
      " reason TEXT NOT NULL DEFAULT '', accel TEXT NOT NULL DEFAULT '',"
      " start TEXT NOT NULL DEFAULT 'boot', created_at_ms INTEGER NOT NULL,"
      " expires_at_ms INTEGER NOT NULL, boot_ms INTEGER NOT NULL DEFAULT 0,"
      " pid INTEGER NOT NULL DEFAULT 0, run_dir TEXT NOT NULL DEFAULT '');"
      "INSERT INTO sandboxes (id, spec, state, reason, created_at_ms, expires_at_ms, run_dir)"
      " VALUES ('sb-old', '{\"image\":\"minimal\"}', 'failed', 'vmm exited', 5, 6, '/r');";
  {
    sqlite3* h = nullptr;
    ASSERT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(h, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK)
        << sqlite3_errmsg(h);
    sqlite3_close(h);
  }
  for (int round = 0; round < 2; ++round) {  // the second open finds it migrated
    Registry reg(db);
    auto got = reg.get("sb-old");
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(got->info.state, State::failed);
    EXPECT_EQ(got->info.reason, "vmm exited");
    EXPECT_EQ(got->info.failure, round == 0 ? "" : "vmm_died");
    reg.set_state("sb-old", State::failed, "vmm exited", "vmm_died");
    reg.insert(record("sb-new" + std::to_string(round), 7));
    EXPECT_EQ(reg.list(true).size(), 2u + round);
  }
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

// The state is written compare-and-set: a writer that lost the race (its
// `from` is stale) changes nothing, so a deleted row never becomes running.
TEST_F(RegistryTest, CompareAndSetStateRefusesAStaleFrom) {
  Registry reg(dir_ / "registry.db");
  reg.insert(record("sb-00000000000c", 1));
  EXPECT_TRUE(reg.compare_and_set_state("sb-00000000000c",
                                        {State::starting, State::running, "", "", 42, 7}));
  auto r = reg.get("sb-00000000000c");
  EXPECT_EQ(r->info.state, State::running);
  EXPECT_EQ(r->info.pid, 42);
  EXPECT_EQ(r->info.boot_ms, 7);
  EXPECT_TRUE(
      reg.compare_and_set_state("sb-00000000000c", {State::running, State::stopping, "bye", ""}));
  EXPECT_TRUE(
      reg.compare_and_set_state("sb-00000000000c", {State::stopping, State::deleted, "bye", ""}));
  EXPECT_EQ(reg.get("sb-00000000000c")->info.pid, 0);  // terminal: no pid
  // A stale writer still believing it is running.
  EXPECT_FALSE(
      reg.compare_and_set_state("sb-00000000000c", {State::running, State::stopping, "late", ""}));
  SandboxRecord stale = record("sb-00000000000c", 1);
  EXPECT_FALSE(reg.compare_and_set_state("sb-00000000000c",
                                         {State::running, State::running, "", "", {}, {}, &stale}));
  EXPECT_EQ(reg.get("sb-00000000000c")->info.state, State::deleted);
  EXPECT_EQ(reg.get("sb-00000000000c")->info.reason, "bye");
  // set_spec never touches the state.
  SandboxSpec spec = stale.info.spec;
  spec.env["C"] = "3";
  reg.set_spec("sb-00000000000c", spec);
  EXPECT_EQ(reg.get("sb-00000000000c")->info.state, State::deleted);
  EXPECT_EQ(reg.get("sb-00000000000c")->info.spec.env.at("C"), "3");
  EXPECT_THROW(reg.compare_and_set_state("sb-nope", {State::running, State::stopping}), Error);
}

// A pool hand-out writes the whole record under its new id: the member's
// row becomes the public one (one row, its run dir kept), and an id that
// is taken is refused with nothing changed.
TEST_F(RegistryTest, WritingTheRecordRenamesTheRow) {
  Registry reg(dir_ / "registry.db");
  reg.insert(record("pool-00000000000a", 1));
  reg.insert(record("sb-00000000000b", 2));
  SandboxRecord taken = *reg.get("pool-00000000000a");
  taken.info.id = "sb-00000000000b";
  EXPECT_THROW(reg.compare_and_set_state("pool-00000000000a",
                                         {State::starting, State::running, "", "", {}, {}, &taken}),
               Error);
  EXPECT_EQ(reg.get("pool-00000000000a")->info.state, State::starting);
  SandboxRecord out = *reg.get("pool-00000000000a");
  out.info.id = "sb-00000000000c";
  out.info.start = "pool";
  EXPECT_TRUE(reg.compare_and_set_state("pool-00000000000a",
                                        {State::starting, State::running, "", "", {}, {}, &out}));
  EXPECT_FALSE(reg.get("pool-00000000000a"));
  auto got = reg.get("sb-00000000000c");
  ASSERT_TRUE(got);
  EXPECT_EQ(got->info.state, State::running);
  EXPECT_EQ(got->info.start, "pool");
  EXPECT_EQ(got->run_dir, "/tmp/run/pool-00000000000a");
  EXPECT_EQ(reg.list(true).size(), 2u);
}

TEST_F(RegistryTest, DatabaseIsOwnerOnly) {
  ::umask(022);
  {
    Registry reg(dir_ / "registry.db");
    reg.insert(record("sb-00000000000d", 1));
  }
  fs::permissions(dir_ / "registry.db", fs::perms(0644));  // an older daemon's
  Registry reg(dir_ / "registry.db");
  reg.insert(record("sb-00000000000e", 2));
  for (const char* f : {"registry.db", "registry.db-wal", "registry.db-shm"}) {
    if (!fs::exists(dir_ / f)) continue;
    EXPECT_EQ(fs::status(dir_ / f).permissions() & fs::perms::all, fs::perms(0600)) << f;
  }
}

}  // namespace
}  // namespace airlock::engine

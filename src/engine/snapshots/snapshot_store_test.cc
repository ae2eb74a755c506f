// The snapshot store without VMs: names, publication, and every integrity
// check verify() makes before a restore.
#include "engine/snapshots/snapshot_store.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "common/error.h"
#include "engine/snapshots/service.h"
#include "engine/storage/image_store.h"

namespace airlock::snapshots {
namespace {

namespace fs = std::filesystem;

class SnapshotStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/alsnapXXXXXX";
    root_ = ::mkdtemp(tmpl);
    base_ = root_ / "base.raw";
    std::ofstream(base_, std::ios::binary) << std::string(1 << 20, 'b');
  }
  void TearDown() override {
    SnapshotStore store(root_ / "snaps");
    for (const auto& s : store.list()) store.remove(s.name);
    fs::remove_all(root_);
  }
  Snapshot publish(SnapshotStore& store, const std::string& name, bool memory,
                   const std::string& tenant = "") {
    Staging st = store.stage(name);
    storage::create_overlay(base_, st.dir / "layer.qcow2", 16);
    if (memory) std::ofstream(st.dir / "mem.state", std::ios::binary) << std::string(5000, 'm');
    Snapshot meta;
    meta.memory = memory;
    meta.image = "minimal";
    meta.tenant = tenant;
    return store.commit(st, meta);
  }
  fs::path root_, base_;
};

// A reader holds a snapshot from the lookup on, so a delete that asks
// readers() between the two cannot slip in; the hold ends with its scope,
// moved or not, and a snapshot the caller may not see is not held at all.
TEST_F(SnapshotStoreTest, AHoldCountsAsAReaderUntilItGoes) {
  SnapshotService svc(root_ / "snaps");
  publish(svc.store(), "base", false, "team-a");
  EXPECT_FALSE(svc.hold("nope").has_value());
  EXPECT_FALSE(svc.hold("base", [](const Snapshot& s) { return s.tenant == "team-b"; }));
  EXPECT_EQ(svc.readers("base"), 0);
  {
    auto a = svc.hold("base");
    ASSERT_TRUE(a.has_value());
    EXPECT_EQ(a->snapshot.tenant, "team-a");
    auto b = svc.hold("base", [](const Snapshot& s) { return s.tenant == "team-a"; });
    EXPECT_EQ(svc.readers("base"), 2);
    SnapshotService::Held moved = std::move(*b);  // what prepare_from returns
    b.reset();
    EXPECT_EQ(svc.readers("base"), 2);
  }
  EXPECT_EQ(svc.readers("base"), 0);
}

TEST_F(SnapshotStoreTest, AForksRamIsKeptUntilDropped) {
  SnapshotService svc(root_ / "snaps");
  EXPECT_EQ(svc.fork_ram("fork-1"), nullptr);
  std::ofstream(root_ / "ram", std::ios::binary) << std::string(4096, 'r');
  std::weak_ptr<vmm::SealedRam> seen;
  {
    auto ram = vmm::SealedRam::copy_of(root_ / "ram");
    seen = ram;
    svc.keep_fork_ram("fork-1", ram);
  }
  ASSERT_NE(svc.fork_ram("fork-1"), nullptr);  // the forks still start from it
  EXPECT_EQ(svc.fork_ram("fork-1")->size(), 4096u);
  EXPECT_EQ(svc.fork_ram("fork-2"), nullptr);
  svc.drop_fork_ram("fork-1");
  svc.drop_fork_ram("never-kept");  // no error
  EXPECT_EQ(svc.fork_ram("fork-1"), nullptr);
  EXPECT_TRUE(seen.expired());  // the service held the last reference
}

TEST_F(SnapshotStoreTest, NamesNameTheFieldAndWhatIsWrong) {
  for (const char* bad : {"", "a/b", "..", "a..b", "-x", ".hidden", "sp ace"}) {
    try {
      check_name(bad);
      FAIL() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_argument);
      EXPECT_EQ(e.field(), "name");
    }
  }
  try {
    check_name(std::string("a\0b", 3), "from");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "from");
    EXPECT_NE(std::string(e.what()).find("NUL"), std::string::npos);
  }
  EXPECT_NO_THROW(check_name("base-env_2"));
}

TEST_F(SnapshotStoreTest, PublishesHashesAndSurvivesReopen) {
  {
    SnapshotStore store(root_ / "snaps");
    Snapshot s = publish(store, "one", true);
    EXPECT_TRUE(s.files.contains("layer.qcow2"));
    EXPECT_TRUE(s.files.contains("mem.state"));
    EXPECT_NO_THROW(store.verify(s));
    EXPECT_THROW(store.stage("one"), Error);  // taken
  }
  SnapshotStore again(root_ / "snaps");  // a daemon restart
  auto s = again.get("one");
  EXPECT_TRUE(s.memory);
  EXPECT_EQ(s.tenant, "");
  EXPECT_FALSE(to_json(s).contains("tenant"));  // the operator's
  EXPECT_NO_THROW(again.verify(s));
  ASSERT_EQ(again.list().size(), 1u);
}

// The owner is part of what is published and survives a restart.
TEST_F(SnapshotStoreTest, KeepsItsOwner) {
  {
    SnapshotStore store(root_ / "snaps");
    EXPECT_EQ(publish(store, "mine", false, "acme").tenant, "acme");
  }
  SnapshotStore again(root_ / "snaps");
  EXPECT_EQ(again.get("mine").tenant, "acme");
  EXPECT_EQ(to_json(again.get("mine"))["tenant"], "acme");
}

TEST_F(SnapshotStoreTest, TruncatedOrAlteredIsRefusedNamingTheFile) {
  SnapshotStore store(root_ / "snaps");
  Snapshot s = publish(store, "two", true);
  fs::permissions(s.mem_state(), fs::perms::owner_write, fs::perm_options::add);
  fs::resize_file(s.mem_state(), 100);
  try {
    store.verify(s);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::unavailable);
    EXPECT_NE(std::string(e.what()).find("mem.state"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos);
  }
  std::ofstream(s.mem_state(), std::ios::binary) << std::string(5000, 'X');  // same size
  try {
    store.verify(s);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("SHA-256"), std::string::npos);
  }
  fs::remove(s.mem_state());
  EXPECT_THROW(store.verify(s), Error);
}

TEST_F(SnapshotStoreTest, StagingLeftoversAreRemovedAndAbandonLeavesNothing) {
  {
    SnapshotStore store(root_ / "snaps");
    Staging st = store.stage("three");
    std::ofstream(st.dir / "layer.qcow2") << "half";
    store.abandon(st);
    EXPECT_FALSE(fs::exists(st.dir));
    Staging left = store.stage("four");  // a crash leaves this
    std::ofstream(left.dir / "layer.qcow2") << "half";
  }
  SnapshotStore store(root_ / "snaps");
  int entries = 0;
  for ([[maybe_unused]] auto& e : fs::directory_iterator(root_ / "snaps")) ++entries;
  EXPECT_EQ(entries, 0);
  EXPECT_THROW(store.get("four"), Error);
}

}  // namespace
}  // namespace airlock::snapshots

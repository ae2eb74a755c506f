// Pause, resume, snapshots and fork on the fake launcher: the state machine
// paths (refused actions are Error(conflict) and change nothing; failures
// leave nothing half-made). That processes really survive is tested with
// QEMU in tests/integration/test_snapshots.py.
#include <gtest/gtest.h>

#include "engine/engine_fake_test_support.h"

namespace airlock::engine {
namespace {

namespace fs = std::filesystem;

class SnapshotFake : public testing::FakeVmTest {};

template <typename F>
Errc code_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  ADD_FAILURE() << "no error";
  return Errc::internal;
}

TEST_F(SnapshotFake, PauseResumeAndRefusedActions) {
  Engine e(cfg_);
  auto sb = e.create({});
  EXPECT_EQ(code_of([&] { e.resume(sb.id); }), Errc::conflict);  // not paused
  auto p = e.pause(sb.id);
  EXPECT_EQ(p.state, State::paused);
  EXPECT_EQ(p.pid, 0);
  EXPECT_EQ(fake_vms(), 0u);  // no VM while paused
  EXPECT_TRUE(fs::exists(data_ / "paused" / sb.id / "mem.state"));
  EXPECT_EQ(code_of([&] { sh(e, sb.id, "true"); }), Errc::conflict);
  EXPECT_EQ(code_of([&] { e.pause(sb.id); }), Errc::conflict);
  EXPECT_EQ(code_of([&] { e.fork(sb.id, 1); }), Errc::conflict);
  EXPECT_EQ(e.get(sb.id).state, State::paused);
  auto r = e.resume(sb.id);
  EXPECT_EQ(r.state, State::running);
  EXPECT_EQ(sh(e, sb.id, "echo back"), "back\n");
  EXPECT_FALSE(fs::exists(data_ / "paused" / sb.id));
  e.pause(sb.id);
  testing::destroy_wait(e, sb.id);  // a paused sandbox can be deleted
  EXPECT_EQ(e.get(sb.id).state, State::deleted);
  EXPECT_FALSE(fs::exists(data_ / "paused" / sb.id));
  EXPECT_EQ(run_dirs(), 0u);
}

TEST_F(SnapshotFake, PausedSurvivesAnEngineRestart) {
  std::string id;
  {
    Engine e(cfg_);
    id = e.create({}).id;
    e.pause(id);
  }
  Engine again(cfg_);
  EXPECT_EQ(again.get(id).state, State::paused);
  EXPECT_EQ(again.resume(id).state, State::running);
  EXPECT_EQ(sh(again, id, "echo ok"), "ok\n");
  testing::destroy_wait(again, id);
}

TEST_F(SnapshotFake, AFailedSaveLeavesTheSandboxRunning) {
  Engine e(cfg_);
  auto sb = e.create({});
  fake_->before_save = [](const fs::path&) {
    throw Error(Errc::unavailable, "no space left on device (test)");
  };
  EXPECT_EQ(code_of([&] { e.pause(sb.id); }), Errc::unavailable);
  EXPECT_EQ(e.get(sb.id).state, State::running);
  EXPECT_EQ(sh(e, sb.id, "echo alive"), "alive\n");
  EXPECT_FALSE(fs::exists(data_ / "paused" / sb.id));
  EXPECT_EQ(code_of([&] { e.snapshot(sb.id, "m1", true); }), Errc::unavailable);
  EXPECT_EQ(e.get(sb.id).state, State::running);
  EXPECT_EQ(e.list_snapshots().size(), 0u);
  EXPECT_EQ(code_of([&] { e.get_snapshot("m1"); }), Errc::not_found);
  fake_->before_save = nullptr;
  EXPECT_EQ(sh(e, sb.id, "echo still"), "still\n");
  testing::destroy_wait(e, sb.id);
}

TEST_F(SnapshotFake, SnapshotsAreReferenceCountedAndNamesChecked) {
  Engine e(cfg_);
  auto sb = e.create({});
  for (std::string bad : std::vector<std::string>{"a/b", "..", std::string("x\0y", 3), ""}) {
    try {
      e.snapshot(sb.id, bad, false);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const Error& err) {
      EXPECT_EQ(err.code(), Errc::invalid_argument);
      EXPECT_EQ(err.field(), "name");
    }
  }
  auto s = e.snapshot(sb.id, "base", false);
  EXPECT_EQ(s["name"], "base");
  EXPECT_EQ(e.get(sb.id).state, State::running);
  EXPECT_EQ(code_of([&] { e.snapshot(sb.id, "base", false); }), Errc::conflict);  // taken
  auto child = e.create({.from = "base"});
  EXPECT_EQ(e.get(child.id).spec.from, "base");
  auto s2 = e.snapshot(child.id, "child", false);
  EXPECT_EQ(s2["parent"], "base");
  try {
    e.delete_snapshot("base");
    ADD_FAILURE() << "deleted a snapshot in use";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), Errc::conflict);
    EXPECT_NE(std::string(err.what()).find(child.id), std::string::npos) << err.what();
    EXPECT_NE(std::string(err.what()).find("snapshot child"), std::string::npos) << err.what();
  }
  testing::destroy_wait(e, child.id);
  EXPECT_EQ(code_of([&] { e.delete_snapshot("base"); }), Errc::conflict);  // "child" still
  e.delete_snapshot("child");
  e.delete_snapshot("base");
  EXPECT_EQ(e.list_snapshots().size(), 0u);
  try {
    e.create({.from = "base"});
    ADD_FAILURE();
  } catch (const Error& err) {
    EXPECT_EQ(err.field(), "from");
  }
  testing::destroy_wait(e, sb.id);
}

TEST_F(SnapshotFake, ACorruptSnapshotIsRefusedAndNothingIsCreated) {
  Engine e(cfg_);
  auto sb = e.create({});
  e.snapshot(sb.id, "c1", false);
  testing::destroy_wait(e, sb.id);
  fs::path layer = data_ / "snapshots" / "c1" / "layer.qcow2";
  fs::permissions(layer, fs::perms::owner_write, fs::perm_options::add);
  fs::resize_file(layer, fs::file_size(layer) - 1);
  size_t before = e.list({}, true).size();
  try {
    e.create({.from = "c1"});
    ADD_FAILURE();
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), Errc::unavailable);
    EXPECT_NE(std::string(err.what()).find("layer.qcow2"), std::string::npos) << err.what();
  }
  EXPECT_EQ(e.list({}, true).size(), before);  // no row, no VM, no run dir
  EXPECT_EQ(fake_vms(), 0u);
  EXPECT_EQ(run_dirs(), 0u);
}

TEST_F(SnapshotFake, ForkIsAllOrNothing) {
  Engine e(cfg_);
  auto sb = e.create({});
  auto forks = e.fork(sb.id, 2);
  ASSERT_EQ(forks.size(), 2u);
  for (auto& f : forks) {
    EXPECT_EQ(f.state, State::running);
    EXPECT_EQ(sh(e, f.id, "echo f"), "f\n");
  }
  EXPECT_EQ(e.get(sb.id).state, State::running);
  std::string internal = forks[0].spec.from;
  EXPECT_EQ(e.get_snapshot(internal)["internal"], true);
  for (auto& f : forks) testing::destroy_wait(e, f.id);
  // The fork's snapshot goes with its last user.
  EXPECT_EQ(code_of([&] { e.get_snapshot(internal); }), Errc::not_found);

  std::atomic<int> starts{0};
  fake_->before_start = [&](const vmm::VmConfig&) {
    if (++starts >= 2) throw Error(Errc::internal, "forks after the first fail (test)");
  };
  size_t live_before = e.list().size();
  EXPECT_EQ(code_of([&] { e.fork(sb.id, 3); }), Errc::internal);
  fake_->before_start = nullptr;
  EXPECT_EQ(e.list().size(), live_before);  // no half-made forks
  EXPECT_EQ(e.list_snapshots().size(), 0u);
  EXPECT_EQ(fake_vms(), 1u);
  EXPECT_EQ(code_of([&] { e.fork(sb.id, 0); }), Errc::invalid_argument);
  testing::destroy_wait(e, sb.id);
}

}  // namespace
}  // namespace airlock::engine

// Re-adoption after a daemon restart, on the fake launcher (the fake VMs
// outlive the Engine as QEMU does).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "engine/engine_fake_test_support.h"

namespace airlock::engine {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

class EngineFakeRecover : public testing::FakeVmTest {};

// A daemon killed mid-exec: the start is journaled before the exec runs, and
// the next daemon counts the exec as detached (in a real VM it runs on and
// attach_exec collects it: tests/integration/test_reattach.py). The fake VM
// serves each connection with a fresh agent, so here the exec died with its
// host: attach finds nothing (not_found) and the sandbox's end closes the
// exec as `interrupted`, once.
TEST_F(EngineFakeRecover, ExecOfADeadDaemonIsDetachedThenClosedOnce) {
  int ids[2];
  ASSERT_EQ(::pipe(ids), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The "daemon": an engine that is SIGKILLed while its exec runs.
    try {
      Engine engine(cfg_);
      SandboxInfo sb = engine.create({.image = "minimal"});
      std::string line = sb.id + "\n";
      (void)!::write(ids[1], line.data(), line.size());
      engine.exec(sb.id, {.cmd = "sleep 60"}, {});
    } catch (...) {
    }
    ::_exit(1);
  }
  ::close(ids[1]);
  char buf[64] = {};
  ssize_t n = ::read(ids[0], buf, sizeof buf - 1);
  ::close(ids[0]);
  ASSERT_GT(n, 0);
  std::string id(buf, static_cast<size_t>(n) - 1);
  fs::path journal = data_ / "audit" / (id + ".jsonl");
  ASSERT_TRUE(eventually([&] {
    std::ifstream in(journal);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str().find("\"exec_start\"") != std::string::npos;
  }));
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);

  auto ends = [&](Engine& engine, std::string& exec_id) {
    std::vector<nlohmann::json> out;
    for (auto& r : engine.audit(id)) {
      if (r["event"] == "exec_start") exec_id = r["exec_id"];
      if (r["event"] == "exec" && r.value("exec_id", "") == exec_id) out.push_back(r);
    }
    return out;
  };
  std::string exec_id;
  {
    Engine engine(cfg_);  // the restarted daemon
    EXPECT_EQ(engine.get(id).state, State::running);
    EXPECT_TRUE(ends(engine, exec_id).empty()) << "ended before anyone saw it end";
    ASSERT_FALSE(exec_id.empty());
    bool counted = false;
    for (auto& r : engine.audit(id))
      if (r["event"] == "adopted") counted = r.value("detached_execs", 0) == 1;
    EXPECT_TRUE(counted) << "the adopted record does not count the detached exec";
    try {
      engine.attach_exec(id, exec_id, 0, {});
      ADD_FAILURE() << "attached to an exec whose agent is gone";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::not_found) << e.what();
    }
  }  // a second restart: still open, nothing written
  Engine engine(cfg_);
  EXPECT_TRUE(ends(engine, exec_id).empty());
  testing::destroy_wait(engine, id);
  auto recs = ends(engine, exec_id);
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0]["reason"], "interrupted");
  EXPECT_EQ(recs[0]["interrupted"], true);
  EXPECT_EQ(fake_vms(), 0u);
}

// A daemon that dies with deletes answered but their teardowns queued
// (engine_reclaim.cc): each row already says `stopping` (written before
// destroy() returns), so the next daemon finishes every one: no VM, no run
// dir, state `deleted` and exactly one `deleted` record each.
TEST_F(EngineFakeRecover, CrashDuringBackgroundTeardownLeavesNothing) {
  constexpr int kN = 5;
  int ids[2];
  ASSERT_EQ(::pipe(ids), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    try {
      Config cfg = cfg_;
      cfg.background_delete = true;
      Engine engine(cfg);
      std::vector<std::string> made;
      for (int i = 0; i < kN; ++i) made.push_back(engine.create({.image = "minimal"}).id);
      std::string lines;
      for (auto& id : made) {
        engine.destroy(id);  // answered: `stopping`, teardown queued
        lines += id + "\n";
      }
      (void)!::write(ids[1], lines.data(), lines.size());
    } catch (...) {
    }
    ::_exit(0);  // the crash: no destructor, the reclaim queue is abandoned
  }
  ::close(ids[1]);
  std::string got;
  char buf[512];
  for (ssize_t n; (n = ::read(ids[0], buf, sizeof buf)) > 0;) got.append(buf, n);
  ::close(ids[0]);
  ::waitpid(child, nullptr, 0);
  std::vector<std::string> made;
  std::istringstream in(got);
  for (std::string id; std::getline(in, id);) made.push_back(id);
  ASSERT_EQ(made.size(), static_cast<size_t>(kN));
  Engine engine(cfg_);  // the restarted daemon
  for (auto& id : made) {
    EXPECT_EQ(engine.get(id).state, State::deleted) << id;
    int deleted = 0;
    for (auto& r : engine.audit(id)) deleted += r["event"] == "deleted";
    EXPECT_EQ(deleted, 1) << id;
  }
  EXPECT_EQ(fake_vms(), 0u);
  EXPECT_EQ(run_dirs(), 0u);
}

// Re-adoption ran the hellos one after another: N guests whose hellos take
// T each held the daemon's start for N*T. Counted, not timed: the hellos'
// intervals (as the fake VMs log them) must all overlap.
TEST_F(EngineFakeRecover, ReadoptionHellosRunConcurrently) {
  constexpr int kN = 4;
  std::vector<std::string> ids;
  {
    Engine engine(cfg_);
    for (int i = 0; i < kN; ++i) ids.push_back(engine.create({.image = "minimal"}).id);
  }  // the daemon stops; the VMs keep running
  for (auto& id : ids) {
    fs::path dir = data_ / "sandboxes" / id;
    std::ofstream(dir / "fake-hello-delay-ms") << 600;
    fs::remove(dir / "fake-vm.log");
  }
  Engine engine(cfg_);
  std::vector<std::pair<long long, long long>> spans;
  for (auto& id : ids) {
    EXPECT_EQ(engine.get(id).state, State::running) << engine.get(id).reason;
    std::ifstream in(data_ / "sandboxes" / id / "fake-vm.log");
    std::string a, s;
    long long t0 = 0, t1 = 0;
    ASSERT_TRUE(in >> a >> t0 >> s >> t1) << id;
    spans.emplace_back(t0, t1);
  }
  // The most hellos in flight at one moment.
  int most = 0;
  for (auto& [start, end] : spans) {
    int at = 0;
    for (auto& [s2, e2] : spans)
      if (s2 <= start && start < e2) ++at;
    most = std::max(most, at);
  }
  EXPECT_EQ(most, kN) << "re-adoption hellos ran one after another";
  for (auto& id : ids) testing::destroy_wait(engine, id);
  EXPECT_EQ(fake_vms(), 0u);
}

// A stopped daemon's sandboxes keep their lifetime across the restart
// (steady deadlines are rebuilt from what is left of expires_at).
TEST_F(EngineFakeRecover, LifetimeSurvivesRestart) {
  std::string id;
  {
    Engine engine(cfg_);
    id = engine.create({.image = "minimal", .timeout_s = 2}).id;
  }
  Engine engine(cfg_);
  EXPECT_EQ(engine.get(id).state, State::running);
  EXPECT_TRUE(eventually([&] { return engine.get(id).state == State::timed_out; }, 6s));
  EXPECT_EQ(fake_vms(), 0u);
}

}  // namespace
}  // namespace airlock::engine

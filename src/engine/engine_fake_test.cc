// The engine on the fake launcher: lifecycle, pool, reaper and failure
// paths with the real engine and the real airlock-guest, no QEMU (each test
// runs in well under a second or two). Regression tests of the engine's resource bounds.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/un.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "engine/engine_fake_test_support.h"
#include "engine/engine_impl.h"
#include "engine/sandbox/sandbox.h"
#include "engine/types_json.h"

namespace airlock::engine {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

class EngineFake : public testing::FakeVmTest {};

std::vector<std::string> events(Engine& e, const std::string& id) {
  std::vector<std::string> out;
  for (auto& r : e.audit(id)) out.push_back(r["event"]);
  return out;
}

int mode_of(const fs::path& p) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return -1;
  return st.st_mode & 07777;
}

TEST_F(EngineFake, CreateExecDestroyLeavesNothing) {
  Engine engine(cfg_);
  SandboxInfo sb = engine.create({.image = "minimal"});
  EXPECT_EQ(sb.state, State::running);
  EXPECT_GT(sb.pid, 0);
  EXPECT_EQ(fake_vms(), 1u);
  EXPECT_EQ(sh(engine, sb.id, "echo hi"), "hi\n");
  EXPECT_EQ(engine.get(sb.id).state, State::running);
  testing::destroy_wait(engine, sb.id);
  EXPECT_EQ(engine.get(sb.id).state, State::deleted);
  EXPECT_EQ(fake_vms(), 0u);
  EXPECT_EQ(run_dirs(), 0u);
  auto ev = events(engine, sb.id);
  // Every exec has a start record and an end record.
  EXPECT_NE(std::find(ev.begin(), ev.end(), "exec_start"), ev.end());
  EXPECT_NE(std::find(ev.begin(), ev.end(), "exec"), ev.end());
  EXPECT_EQ(ev.back(), "deleted");
  // Destroying again is a typed conflict, not a second teardown.
  try {
    testing::destroy_wait(engine, sb.id);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::conflict);
  }
}

// Background teardown: destroy() answers with the
// sandbox out of service, the reclaim thread finishes it, and an engine
// shut down with teardowns queued finishes them first: nothing is left.
TEST_F(EngineFake, BackgroundDestroyFinishesEvenAtShutdown) {
  std::vector<std::string> ids;
  {
    Engine engine(cfg_);
    for (int i = 0; i < 3; ++i) ids.push_back(engine.create({.image = "minimal"}).id);
    for (auto& id : ids) {
      engine.destroy(id);
      State st = engine.get(id).state;
      EXPECT_TRUE(st == State::stopping || st == State::deleted) << to_string(st);
      try {
        sh(engine, id, "true");
        ADD_FAILURE() << "exec in a deleted sandbox";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), Errc::conflict);
      }
      try {
        engine.destroy(id);
        ADD_FAILURE() << "second destroy";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), Errc::conflict);
      }
    }
  }  // the engine goes with teardowns possibly still queued
  EXPECT_EQ(fake_vms(), 0u);
  EXPECT_EQ(run_dirs(), 0u);
  Engine again(cfg_);
  for (auto& id : ids) {
    EXPECT_EQ(again.get(id).state, State::deleted);
    EXPECT_EQ(events(again, id).back(), "deleted");
  }
}

// Secrets (env values in specs, what sandboxes did) are the owner's only.
TEST_F(EngineFake, RegistryJournalAndDirsAreOwnerOnly) {
  ::umask(022);
  Engine engine(cfg_);
  SandboxInfo sb = engine.create({.image = "minimal", .env = {{"TOKEN", "secret"}}});
  sh(engine, sb.id, "true");
  EXPECT_EQ(mode_of(data_), 0700);
  EXPECT_EQ(mode_of(data_ / "sandboxes"), 0700);
  EXPECT_EQ(mode_of(data_ / "audit"), 0700);
  EXPECT_EQ(mode_of(data_ / "sandboxes" / sb.id), 0700);
  EXPECT_EQ(mode_of(data_ / "registry.db"), 0600);
  for (const char* f : {"registry.db-wal", "registry.db-shm"})
    if (fs::exists(data_ / f)) EXPECT_EQ(mode_of(data_ / f), 0600) << f;
  for (auto& e : fs::directory_iterator(data_ / "audit"))
    EXPECT_EQ(mode_of(e.path()), 0600) << e.path();
  testing::destroy_wait(engine, sb.id);
}

// `airlockd --pool typo=1` used to abort: the reaper thread was running
// when set_pool threw in the constructor (std::terminate).
TEST_F(EngineFake, BadPoolImageIsAnErrorNotAnAbort) {
  cfg_.pool = {{"typo", 1}};
  try {
    Engine engine(cfg_);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_EQ(e.field(), "image");
    EXPECT_NE(std::string(e.what()).find("typo"), std::string::npos);
  }
}

TEST(SandboxStates, TableIsClosedAndTerminalStatesAreFinal) {
  const State all[] = {State::starting, State::running,      State::pausing,
                       State::paused,   State::snapshotting, State::stopping,
                       State::deleted,  State::timed_out,    State::failed};
  for (State from : all)
    for (State to : all)
      if (is_terminal(from)) {
        EXPECT_FALSE(transition_allowed(from, to)) << to_string(from);
      }
  EXPECT_TRUE(transition_allowed(State::running, State::stopping));
  EXPECT_FALSE(transition_allowed(State::deleted, State::running));
  EXPECT_FALSE(transition_allowed(State::stopping, State::running));
  EXPECT_FALSE(transition_allowed(State::running, State::deleted));  // always through stopping
}

// set_network racing destroy wrote the whole row back, state `running`
// included, for a sandbox destroy had just deleted.
TEST_F(EngineFake, SetNetworkRacingDestroyNeverRevivesADeletedSandbox) {
  Engine engine(cfg_);
  SandboxInfo sb = engine.create({.image = "minimal", .network = {{"mode", "open"}}});
  ASSERT_EQ(net_helpers(), 1u);
  // Stand in for the helper's control socket, so the policy change is held
  // exactly while destroy runs.
  fs::path ctl = data_ / "sandboxes" / sb.id / "net-ctl.sock";
  fs::remove(ctl);
  int lfd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, ctl.c_str(), sizeof addr.sun_path - 1);
  ASSERT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(lfd, 1), 0);
  std::atomic<int> outcome{0};  // 1 = returned, 2 = conflict, 3 = other error
  std::thread changer([&] {
    try {
      engine.set_network(sb.id, {{"mode", "allowlist"}, {"allow", {"192.0.2.1"}}});
      outcome = 1;
    } catch (const Error& e) {
      outcome = e.code() == Errc::conflict ? 2 : 3;
    }
  });
  int conn = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
  ASSERT_GE(conn, 0);
  char buf[4096];
  ASSERT_GT(::read(conn, buf, sizeof buf), 0);  // the request: set_network is mid-call
  testing::destroy_wait(engine, sb.id);
  std::string reply =
      R"({"policy":{"mode":"allowlist","allow":["192.0.2.1"],"deny":[]},"flows_cut":0})";
  reply += "\n";
  ASSERT_EQ(::write(conn, reply.data(), reply.size()), static_cast<ssize_t>(reply.size()));
  changer.join();
  ::close(conn);
  ::close(lfd);
  EXPECT_EQ(engine.get(sb.id).state, State::deleted);
  EXPECT_EQ(outcome, 2) << "set_network on a sandbox destroyed under it must be a conflict";
  auto all = engine.list({}, false);
  EXPECT_TRUE(all.empty()) << "a deleted sandbox is listed as live again";
  EXPECT_EQ(net_helpers(), 0u);
}

// A non-airlock::Error exception during boot leaked the run dir and the
// network helper (and left the row `starting` for ever).
TEST_F(EngineFake, AnyExceptionDuringBootLeavesNothing) {
  fake_->before_start = [](const vmm::VmConfig&) { throw std::runtime_error("injected"); };
  Engine engine(cfg_);
  EXPECT_THROW(engine.create({.image = "minimal", .network = {{"mode", "open"}}}),
               std::runtime_error);
  EXPECT_EQ(net_helpers(), 0u) << "network helper leaked";
  EXPECT_EQ(run_dirs(), 0u) << "run dir leaked";
  EXPECT_EQ(fake_vms(), 0u);
  auto rows = engine.list({}, true);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].state, State::failed);
  EXPECT_EQ(rows[0].failure, "boot_failed");
  EXPECT_TRUE(engine.list({}, false).empty());
}

// A throw after the boot (here: the `created` record cannot be written)
// leaked a running VM.
TEST_F(EngineFake, ThrowAfterBootLeavesNoVm) {
  fake_->before_start = [this](const vmm::VmConfig& vc) {
    fs::create_directories(data_ / "audit" / (vc.id + ".jsonl"));  // append fails
  };
  Engine engine(cfg_);
  EXPECT_THROW(engine.create({.image = "minimal"}), Error);
  EXPECT_EQ(fake_->starts, 1);
  EXPECT_EQ(fake_vms(), 0u) << "VM leaked";
  EXPECT_EQ(run_dirs(), 0u);
  auto rows = engine.list({}, true);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].state, State::failed);
}

// Deadlines are on the steady clock: stepping the wall clock (NTP, a VM
// resumed) by days neither expires nor agent_losts anything; the lifetime
// still ends on time.
TEST_F(EngineFake, WallClockStepsDoNotEndSandboxes) {
  std::atomic<int64_t> offset{0};
  cfg_.wall_clock_ms = [&] { return now_ms() + offset.load(); };
  cfg_.agent_ping_interval_ms = 100;
  cfg_.agent_ping_timeout_ms = 1000;
  Engine engine(cfg_);
  SandboxInfo a = engine.create({.image = "minimal", .timeout_s = 30, .idle_timeout_s = 20});
  SandboxInfo b = engine.create({.image = "minimal", .timeout_s = 2});
  offset = int64_t{10} * 24 * 3600 * 1000;  // ten days ahead
  std::this_thread::sleep_for(1200ms);
  EXPECT_EQ(engine.get(a.id).state, State::running);
  offset = -int64_t{10} * 24 * 3600 * 1000;  // and back, past the start
  std::this_thread::sleep_for(1200ms);
  EXPECT_EQ(engine.get(a.id).state, State::running) << engine.get(a.id).reason;
  EXPECT_EQ(sh(engine, a.id, "echo ok"), "ok\n");
  // b's 2 s of life ended by the steady clock whatever the wall clock said.
  EXPECT_TRUE(eventually([&] { return engine.get(b.id).state == State::timed_out; }, 5s));
  testing::destroy_wait(engine, a.id);
}

// set_timeout moves the expiry both ways: persisted (a new engine on the
// same data dir reads it), and the reaper ends the sandbox at the new time.
TEST_F(EngineFake, SetTimeoutMovesTheExpiry) {
  Engine engine(cfg_);
  SandboxInfo sb = engine.create({.image = "minimal", .timeout_s = 600});
  SandboxInfo longer = engine.set_timeout(sb.id, 3600);
  EXPECT_GT(longer.expires_at_ms, sb.expires_at_ms + 2000 * 1000);
  EXPECT_EQ(engine.get(sb.id).expires_at_ms, longer.expires_at_ms);
  for (int bad : {0, -1, 604801}) {
    try {
      engine.set_timeout(sb.id, bad);
      ADD_FAILURE() << "timeout " << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_argument);
      EXPECT_EQ(e.field(), "timeout");
    }
  }
  try {
    engine.set_timeout("sb-nosuch", 10);
    ADD_FAILURE() << "unknown id accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::not_found);
  }
  SandboxInfo shorter = engine.set_timeout(sb.id, 1);
  EXPECT_LT(shorter.expires_at_ms, sb.expires_at_ms);
  EXPECT_TRUE(eventually([&] { return engine.get(sb.id).state == State::timed_out; }, 5s));
  bool journaled = false;
  for (const auto& r : engine.audit(sb.id))
    if (r.value("event", "") == "timeout_changed") journaled = true;
  EXPECT_TRUE(journaled);
}

// The reaper held the engine-wide lock while it read /proc and cgroups for
// every sandbox: with slow reads, every call on any sandbox waited for it.
TEST_F(EngineFake, ReaperChecksOutsideTheEngineLock) {
  Engine engine(cfg_);
  SandboxInfo a = engine.create({.image = "minimal"});
  SandboxInfo b = engine.create({.image = "minimal"});
  fake_->alive_delay_ms = 1500;         // each check now takes 1.5 s
  std::this_thread::sleep_for(1200ms);  // a reaper pass is under way
  for (int i = 0; i < 4; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    engine.stat_file(b.id, "/");
    auto took = std::chrono::steady_clock::now() - t0;
    EXPECT_LT(took, 1000ms) << "call " << i << " waited for the reaper";  // a check: 1.5 s
  }
  fake_->alive_delay_ms = 0;
  testing::destroy_wait(engine, a.id);
  testing::destroy_wait(engine, b.id);
}

// Bad input: more disk than the data dir's filesystem has is refused with
// the numbers, before anything exists.
TEST_F(EngineFake, DiskBeyondFreeSpaceIsRefused) {
  struct statvfs st {};
  ASSERT_EQ(::statvfs(data_.c_str(), &st), 0);
  int64_t free_mb = static_cast<int64_t>(st.f_bavail) * st.f_frsize / (1024 * 1024);
  if (free_mb >= 1048576) GTEST_SKIP() << "more than 1 TiB free";
  Engine engine(cfg_);
  try {
    engine.create({.image = "minimal", .disk_mb = 1048576});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::unavailable);
    EXPECT_EQ(e.field(), "disk_mb");
    std::string m = e.what();
    EXPECT_NE(m.find("disk_mb=1048576"), std::string::npos) << m;
    EXPECT_NE(m.find(std::to_string(free_mb).substr(0, 2)), std::string::npos) << m;
  }
  EXPECT_TRUE(engine.list({}, true).empty());
  EXPECT_EQ(run_dirs(), 0u);
  // The admitted sum counts: two sandboxes of just over half the free space.
  int64_t half = free_mb / 2 + 64;
  if (half <= 1048576) {
    SandboxInfo one = engine.create({.image = "minimal", .disk_mb = static_cast<int>(half)});
    EXPECT_THROW(engine.create({.image = "minimal", .disk_mb = static_cast<int>(half)}), Error);
    testing::destroy_wait(engine, one.id);
    SandboxInfo two = engine.create({.image = "minimal", .disk_mb = static_cast<int>(half)});
    testing::destroy_wait(engine, two.id);
  }
}

// The reaper on the fake: a VM that dies is `failed`, typed, files gone.
TEST_F(EngineFake, DeadVmIsFailedAndCleanedUp) {
  Engine engine(cfg_);
  SandboxInfo sb = engine.create({.image = "minimal"});
  ::kill(sb.pid, SIGKILL);
  ASSERT_TRUE(eventually([&] { return engine.get(sb.id).state == State::failed; }));
  EXPECT_EQ(engine.get(sb.id).failure, "vmm_died");
  EXPECT_EQ(run_dirs(), 0u);
  EXPECT_EQ(fake_vms(), 0u);
}

TEST_F(EngineFake, PoolHandsOutAWarmMember) {
  Engine engine(cfg_);
  engine.set_pool("minimal", 1);
  ASSERT_TRUE(eventually([&] { return engine.pool_info()[0]["ready"] == 1; }));
  SandboxInfo sb = engine.create({.image = "minimal", .metadata = {{"who", "me"}}});
  EXPECT_EQ(sb.start, "pool");
  EXPECT_EQ(sb.state, State::running);
  EXPECT_EQ(engine.get(sb.id).spec.metadata.at("who"), "me");
  EXPECT_EQ(sh(engine, sb.id, "echo pooled"), "pooled\n");
  testing::destroy_wait(engine, sb.id);
  engine.set_pool("minimal", 0);
}

// A fill goes on member after member until the slot is full: with a tick of
// a minute, a pool of 3 fills (set_pool wakes the thread once) well within
// the first tick.
TEST_F(EngineFake, PoolFillsMemberAfterMemberWithoutWaitingForTicks) {
  cfg_.pool_tick_ms = 60'000;
  Engine engine(cfg_);
  engine.set_pool("minimal", 3);
  ASSERT_TRUE(eventually([&] { return engine.pool_info()[0]["ready"] == 3; }, 40s))
      << engine.pool_info().dump();
}

// Installs image "warm" (minimal's files, symlinked, plus `warmup` in its
// config) in an image dir of the test's own, and points cfg_ at it.
void install_warm_image(Config& cfg, const fs::path& data, const std::vector<std::string>& warmup) {
  std::string ver;
  {
    Engine probe(cfg);
    ver = probe.inspect_image("minimal")["version"];
  }
  fs::path src = cfg.image_dir / "minimal" / ver;
  fs::path imgs = data / "images";
  fs::create_directories(imgs / "warm" / "v1");
  for (const char* f : {"vmlinuz", "initrd.img", "rootfs.ext4"})
    fs::create_symlink(src / f, imgs / "warm" / "v1" / f);
  std::ifstream in(src / "image.json");
  auto meta = nlohmann::json::parse(in);
  meta["kind"] = "installed";
  meta["source"] = "test";
  meta["config"] = {{"warmup", warmup}};
  std::ofstream(imgs / "warm" / "v1" / "image.json") << meta.dump();
  fs::create_symlink("v1", imgs / "warm" / "current");
  cfg.image_dir = imgs;
}

// Warm-up (ImageConfig::warmup): a member runs its image's declared
// commands, in order, before it is ready; each is journaled as
// `pool_warmup`, and between the member's `pooled` and its `handed_out`
// nothing else ran in it; the public id's journal starts at the hand-out's
// `created`, naming the member. An exec by a member's name before its
// hand-out is refused (members are not in `live`).
TEST_F(EngineFake, PoolMemberRunsTheImageWarmupInOrderBeforeItIsReady) {
  const std::vector<std::string> warmup = {"test ! -e /nonexistent-a", "echo warm > /dev/null"};
  install_warm_image(cfg_, data_, warmup);

  Engine engine(cfg_);
  engine.set_pool("warm", 1);
  ASSERT_TRUE(eventually([&] { return engine.pool_info()[0]["ready"] == 1; }, 30s));
  std::string member = engine.pool_info()[0]["members"][0];
  try {
    sh(engine, member, "true");
    ADD_FAILURE() << "an exec reached a pool member before its hand-out";
  } catch (const Error& e) {
    EXPECT_NE(e.code(), Errc::internal) << e.what();
  }
  SandboxInfo sb = engine.create({.image = "warm"});
  ASSERT_EQ(sb.start, "pool");
  ASSERT_NE(sb.id, member);
  auto mine = engine.audit(sb.id);
  ASSERT_FALSE(mine.empty());
  EXPECT_EQ(mine[0]["event"], "created");
  EXPECT_EQ(mine[0]["pool_member"], member);
  std::vector<std::string> kinds;
  std::vector<nlohmann::json> warm;
  for (auto& r : engine.audit(member)) {
    kinds.push_back(r["event"]);
    if (r["event"] == "pool_warmup") warm.push_back(r);
  }
  auto pooled = std::find(kinds.begin(), kinds.end(), "pooled");
  auto handed = std::find(kinds.begin(), kinds.end(), "handed_out");
  ASSERT_NE(pooled, kinds.end());
  ASSERT_NE(handed, kinds.end());
  EXPECT_EQ(handed + 1, kinds.end());
  EXPECT_EQ(engine.audit(member).back()["id"], sb.id);
  for (auto it = pooled + 1; it != handed; ++it) EXPECT_EQ(*it, "pool_warmup");
  ASSERT_EQ(warm.size(), warmup.size());
  for (size_t i = 0; i < warmup.size(); ++i) {
    EXPECT_EQ(warm[i]["argv"], nlohmann::json({"sh", "-c", warmup[i]})) << i;
    EXPECT_EQ(warm[i]["exit_code"], 0) << i;
  }
  EXPECT_EQ(sh(engine, sb.id, "echo mine"), "mine\n");
  engine.set_pool("warm", 0);
  testing::destroy_wait(engine, sb.id);
}

// A member whose warm-up fails is never made ready.
TEST_F(EngineFake, PoolMemberWhoseWarmupFailsIsNeverReady) {
  install_warm_image(cfg_, data_, {"exit 3"});
  Engine engine(cfg_);
  engine.set_pool("warm", 1);
  // The first attempt ends (its member deleted, reason said) without a ready member.
  ASSERT_TRUE(eventually(
      [&] {
        std::error_code ec;
        for (auto& e : fs::directory_iterator(data_ / "audit", ec)) {
          std::ifstream j(e.path());
          std::stringstream ss;
          ss << j.rdbuf();
          if (ss.str().find("\"warm-up failed\"") != std::string::npos) return true;
        }
        return false;
      },
      30s));
  EXPECT_EQ(engine.pool_info()[0]["ready"], 0);
  engine.set_pool("warm", 0);
}

}  // namespace
}  // namespace airlock::engine

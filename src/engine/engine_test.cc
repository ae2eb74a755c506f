// The engine with REAL VMs: needs the `minimal` image in $AIRLOCK_IMAGE_DIR
// (`make image` builds it there; `make test` does so before ctest). Every
// test uses its own temporary data dir and checks that nothing is left
// behind: no QEMU process, no sandbox files.
#include "engine/engine.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/error.h"
#include "common/process.h"
#include "engine/engine_test_support.h"

namespace airlock::engine {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// QEMU processes whose command line mentions `needle` (a data dir or id).
std::vector<pid_t> qemu_processes_mentioning(const std::string& needle) {
  return find_processes({"qemu", needle});
}

size_t entries(const fs::path& dir) {
  std::error_code ec;
  size_t n = 0;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); ++it) ++n;
  return n;
}

std::vector<std::string> events(Engine& e, const std::string& id) {
  std::vector<std::string> out;
  for (auto& r : e.audit(id)) out.push_back(r["event"]);
  return out;
}

template <typename F>
Errc error_code_of(F f, std::string* field = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (field) *field = e.field();
    return e.code();
  }
  ADD_FAILURE() << "no error thrown";
  return Errc::internal;
}

class EngineTest : public testing::RealVmTest {
 protected:
  void expect_nothing_left() {
    EXPECT_TRUE(qemu_processes_mentioning(data_.string()).empty()) << "QEMU left running";
    EXPECT_EQ(entries(data_ / "sandboxes"), 0u) << "sandbox files left behind";
  }
};

TEST_F(EngineTest, CreateExecDestroyLeavesNothing) {
  Engine engine(cfg_);
  SandboxInfo sb = engine.create({.image = "minimal", .env = {{"FROM_SPEC", "spec"}}});
  EXPECT_EQ(sb.state, State::running);
  EXPECT_EQ(sb.id.size(), 15u);
  EXPECT_EQ(sb.id.rfind("sb-", 0), 0u);
  EXPECT_EQ(sb.accel, "tcg");
  EXPECT_GT(sb.pid, 0);
  EXPECT_GT(sb.boot_ms, 0);
  EXPECT_FALSE(qemu_processes_mentioning(data_.string()).empty());
  std::cout << "boot_ms " << sb.boot_ms << "\n";

  std::string out, err;
  std::string started_id;
  auto t0 = std::chrono::steady_clock::now();
  ExecResult r =
      engine.exec(sb.id,
                  {.argv = {"sh", "-c", "echo hello $FROM_SPEC $FROM_REQ; echo oops >&2; exit 7"},
                   .env = {{"FROM_REQ", "req"}}},
                  {.on_start = [&](const std::string& id, int) { started_id = id; },
                   .on_output =
                       [&](int ch, std::string_view b) {
                         (ch == 1 ? out : err) += b;
                         return true;
                       }});
  std::cout << "exec_ms "
            << std::chrono::duration_cast<std::chrono::milliseconds>(
                   std::chrono::steady_clock::now() - t0)
                   .count()
            << "\n";
  EXPECT_EQ(out, "hello spec req\n");
  EXPECT_EQ(err, "oops\n");
  ASSERT_TRUE(r.exit_code.has_value());
  EXPECT_EQ(*r.exit_code, 7);
  EXPECT_EQ(r.exec_id, started_id);
  EXPECT_EQ(r.stdout_bytes, 15u);

  // stdin, cmd, and the spec's env overridden by the request's.
  out.clear();
  r = engine.exec(sb.id,
                  {.cmd = "cat; echo $FROM_SPEC",
                   .env = {{"FROM_SPEC", "override"}},
                   .stdin_data = std::string("piped\n")},
                  {.on_output = [&](int ch, std::string_view b) {
                    if (ch == 1) out += b;
                    return true;
                  }});
  EXPECT_EQ(out, "piped\noverride\n");
  EXPECT_EQ(r.stdin_bytes, 6u);

  // Files round trip through the engine.
  std::string blob(300000, '\0');
  for (size_t i = 0; i < blob.size(); ++i) blob[i] = static_cast<char>(i * 31);
  bool sent = false;
  EXPECT_EQ(engine.write_file(sb.id, "/tmp/x/blob", 0600,
                              [&]() -> std::optional<std::string> {
                                if (sent) return std::nullopt;
                                sent = true;
                                return blob;
                              }),
            blob.size());
  std::string back;
  engine.read_file(sb.id, "/tmp/x/blob", [&](std::string_view b) {
    back += b;
    return true;
  });
  EXPECT_EQ(back, blob);
  EXPECT_EQ(engine.stat_file(sb.id, "/tmp/x/blob")["size"], blob.size());
  EXPECT_EQ(error_code_of([&] { engine.stat_file(sb.id, "/nope"); }), Errc::not_found);

  testing::destroy_wait(engine, sb.id);
  expect_nothing_left();
  EXPECT_EQ(engine.get(sb.id).state, State::deleted);
  EXPECT_EQ(error_code_of([&] { engine.exec(sb.id, {.argv = {"true"}}, {}); }), Errc::conflict);
  EXPECT_EQ(error_code_of([&] { testing::destroy_wait(engine, sb.id); }), Errc::conflict);
  EXPECT_EQ(error_code_of([&] { testing::destroy_wait(engine, "sb-000000000000"); }),
            Errc::not_found);
  EXPECT_TRUE(engine.list().empty());
  EXPECT_EQ(engine.list({}, true).size(), 1u);
  auto ev = events(engine, sb.id);
  // A create may first build its shape's template (template_built).
  if (!ev.empty() && ev.front() == "template_built") ev.erase(ev.begin());
  EXPECT_EQ(ev.front(), "created");
  EXPECT_EQ(ev.back(), "deleted");
  EXPECT_EQ(std::count(ev.begin(), ev.end(), "exec"), 2);
  auto recs = engine.audit(sb.id);
  auto first_exec = std::find_if(recs.begin(), recs.end(),
                                 [](const auto& r) { return r.value("event", "") == "exec"; });
  ASSERT_NE(first_exec, recs.end());
  EXPECT_EQ((*first_exec)["exit_code"], 7);
  EXPECT_EQ((*first_exec)["argv"][0], "sh");
}

// A relative or dotted image dir (AIRLOCK_IMAGE_DIR=../build/guest-images)
// boots: QEMU is given the same normal paths the jail binds.
TEST_F(EngineTest, AnImageDirWithDotDotBoots) {
  Config cfg = cfg_;
  cfg.image_dir = cfg_.image_dir / "minimal" / ".." / ".";
  {
    Engine engine(cfg);
    SandboxInfo sb = engine.create({.image = "minimal"});
    EXPECT_EQ(sb.state, State::running);
    ExecResult r = engine.exec(sb.id, {.argv = {"true"}}, {});
    ASSERT_TRUE(r.exit_code.has_value());
    EXPECT_EQ(*r.exit_code, 0);
    engine.destroy(sb.id);
  }  // the engine finishes the background teardown before it goes
  expect_nothing_left();
}

TEST_F(EngineTest, BadSpecsAreRejectedAndNothingIsCreated) {
  Engine engine(cfg_);
  std::string field;
  EXPECT_EQ(error_code_of([&] { engine.create({.cpus = 0}); }, &field), Errc::invalid_argument);
  EXPECT_EQ(field, "cpus");
  EXPECT_EQ(error_code_of([&] { engine.create({.memory_mb = 1 << 20}); }, &field),
            Errc::invalid_argument);
  EXPECT_EQ(field, "memory_mb");
  EXPECT_EQ(error_code_of([&] { engine.create({.image = "nosuch"}); }, &field),
            Errc::invalid_argument);
  EXPECT_EQ(field, "image");
  EXPECT_EQ(error_code_of([&] { engine.create({.disk_mb = 1}); }, &field), Errc::invalid_argument);
  EXPECT_EQ(field, "disk_mb");
  EXPECT_EQ(error_code_of([&] { engine.create({.timeout_s = -1}); }, &field),
            Errc::invalid_argument);
  EXPECT_EQ(field, "timeout");
  EXPECT_TRUE(engine.list({}, true).empty());
  expect_nothing_left();
}

TEST_F(EngineTest, LifetimeTimeoutDestroysTheSandbox) {
  Engine engine(cfg_);
  SandboxInfo sb = engine.create({.timeout_s = 6});
  auto deadline = std::chrono::steady_clock::now() + 30s;
  // Past running and the teardown's transient `stopping`.
  for (State st = engine.get(sb.id).state; (st == State::running || st == State::stopping) &&
                                           std::chrono::steady_clock::now() < deadline;
       st = engine.get(sb.id).state)
    std::this_thread::sleep_for(100ms);
  SandboxInfo now = engine.get(sb.id);
  EXPECT_EQ(now.state, State::timed_out);
  EXPECT_LE(now.expires_at_ms - now.created_at_ms, 6000);
  expect_nothing_left();
  auto ev = events(engine, sb.id);
  EXPECT_EQ(ev.back(), "timed_out");
  EXPECT_EQ(error_code_of([&] { engine.exec(sb.id, {.argv = {"true"}}, {}); }), Errc::conflict);
}

TEST_F(EngineTest, BootWatchdogRetriesOnceThenFailsCleanly) {
  Config cfg = cfg_;
  cfg.boot_timeout_s = 1;  // a TCG boot takes seconds: both attempts time out
  Engine engine(cfg);
  std::string msg;
  try {
    engine.create({});
    FAIL() << "boot should have timed out";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::timeout);
    msg = e.what();
  }
  EXPECT_NE(msg.find("did not answer within 1 s"), std::string::npos) << msg;
  EXPECT_NE(msg.find("console"), std::string::npos) << msg;
  expect_nothing_left();
  auto all = engine.list({}, true);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].state, State::failed);
  auto ev = events(engine, all[0].id);
  EXPECT_EQ(std::count(ev.begin(), ev.end(), "boot_failed"), 2);
  EXPECT_EQ(std::count(ev.begin(), ev.end(), "retry"), 1);
  EXPECT_EQ(ev.back(), "failed");
}

TEST_F(EngineTest, RestartReadoptsLiveAndCleansDead) {
  std::string alive_id, dead_id;
  int dead_pid = 0;
  {
    Engine first(cfg_);
    alive_id = first.create({.metadata = {{"role", "keep"}}}).id;
    auto dead = first.create({.metadata = {{"role", "kill"}}});
    dead_id = dead.id;
    dead_pid = dead.pid;
  }  // the engine goes away; its VMs keep running
  ASSERT_EQ(qemu_processes_mentioning(data_.string()).size(), 2u);
  ::kill(dead_pid, SIGKILL);
  for (int i = 0; i < 50 && !qemu_processes_mentioning(dead_id).empty(); ++i)
    std::this_thread::sleep_for(100ms);

  Engine second(cfg_);
  EXPECT_EQ(second.get(alive_id).state, State::running);
  EXPECT_EQ(second.get(dead_id).state, State::failed);
  EXPECT_FALSE(fs::exists(data_ / "sandboxes" / dead_id));
  auto keep = second.list({{"role", "keep"}});
  ASSERT_EQ(keep.size(), 1u);
  EXPECT_EQ(keep[0].id, alive_id);
  std::string out;
  auto r =
      second.exec(alive_id, {.argv = {"hostname"}}, {.on_output = [&](int, std::string_view b) {
                    out += b;
                    return true;
                  }});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(out, alive_id + "\n");
  testing::destroy_wait(second, alive_id);
  expect_nothing_left();
  auto ev = events(second, alive_id);
  EXPECT_NE(std::find(ev.begin(), ev.end(), "adopted"), ev.end());
}

TEST_F(EngineTest, InfoReportsAcceleratorAndImages) {
  Engine engine(cfg_);
  auto j = engine.info();
  EXPECT_EQ(j["accelerator"], "tcg");
  EXPECT_FALSE(j["accelerator_reason"].get<std::string>().empty());
  bool found = false;
  for (auto& img : j["images"]) found |= img["name"] == "minimal";
  EXPECT_TRUE(found) << j.dump();
}

}  // namespace
}  // namespace airlock::engine

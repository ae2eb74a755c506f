// Failure states with REAL VMs (docs/design.md, "Failure states"): each way a
// sandbox can die is made to happen for real and must end in its own typed
// failure, in the registry and the journal, with a call in flight getting an
// error naming it within seconds, and nothing left on the host.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "common/error.h"
#include "common/process.h"
#include "engine/engine.h"
#include "engine/engine_test_support.h"
#include "engine/vmm/cgroup.h"
#include "engine/vmm/qmp.h"

namespace airlock::engine {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

class EngineFailureTest : public testing::RealVmTest {
 protected:
  // Polls until sandbox `id` has ended: past `running` and the teardown's
  // `stopping` (or `limit` passes).
  SandboxInfo wait_ended(Engine& e, const std::string& id, std::chrono::seconds limit = 30s) {
    auto until = SteadyClock::now() + limit;
    SandboxInfo info = e.get(id);
    while ((info.state == State::running || info.state == State::stopping) &&
           SteadyClock::now() < until) {
      std::this_thread::sleep_for(100ms);
      info = e.get(id);
    }
    return info;
  }
  // The journal's last event of kind `event`, or null.
  nlohmann::json last_event(Engine& e, const std::string& id, const std::string& event) {
    nlohmann::json found;
    for (auto& r : e.audit(id))
      if (r["event"] == event) found = r;
    return found;
  }
  void expect_nothing_left(const std::string& id) {
    EXPECT_TRUE(find_processes({"qemu", data_.string()}).empty()) << "QEMU left running";
    EXPECT_FALSE(fs::exists(data_ / "sandboxes" / id)) << "sandbox files left behind";
    // The jail's cgroup goes with QEMU (teardown kills it through Vm::kill).
    for (const char* root : {"/sys/fs/cgroup/memory", "/sys/fs/cgroup/pids", "/sys/fs/cgroup"}) {
      std::error_code ec;
      for (auto it = fs::recursive_directory_iterator(root, ec);
           !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
        if (it.depth() > 6) it.disable_recursion_pending();
        EXPECT_NE(it->path().filename(), id) << "cgroup left: " << it->path();
      }
    }
  }
  // Starts `cmd` as an exec on another thread; returns once it runs. The
  // future yields "" if it returned normally, else the error's text, and
  // *took the time from `t0` (set by the caller) to its end.
  std::future<std::string> exec_in_flight(Engine& e, const std::string& id, const std::string& cmd,
                                          SteadyClock::time_point* t0,
                                          std::chrono::milliseconds* took, Errc* code) {
    auto started = std::make_shared<std::promise<void>>();
    auto fut = std::async(std::launch::async, [&e, id, cmd, started, t0, took, code] {
      std::string err;
      try {
        e.exec(id, {.cmd = cmd},
               {.on_start = [&](const std::string&, int) { started->set_value(); }});
      } catch (const Error& x) {
        err = x.what();
        *code = x.code();
      }
      *took = std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - *t0);
      return err;
    });
    EXPECT_EQ(started->get_future().wait_for(60s), std::future_status::ready) << "exec never ran";
    return fut;
  }
};

TEST_F(EngineFailureTest, GuestPanicIsFailedGuestPanic) {
  Engine engine(cfg_);
  auto sb = engine.create({});
  // The write panics the guest kernel (panic=-1, -no-reboot: QEMU exits),
  // so the exec itself loses the guest and must say why.
  std::string err;
  try {
    engine.exec(sb.id, {.cmd = "echo c > /proc/sysrq-trigger; sleep 30"}, {});
  } catch (const Error& e) {
    err = e.what();
  }
  EXPECT_NE(err.find("guest_panic"), std::string::npos) << err;
  SandboxInfo info = wait_ended(engine, sb.id);
  EXPECT_EQ(info.state, State::failed);
  EXPECT_EQ(info.failure, "guest_panic") << info.reason;
  EXPECT_NE(info.reason.find("panic"), std::string::npos) << info.reason;
  EXPECT_EQ(to_json(info)["failure"], "guest_panic");
  auto ev = last_event(engine, sb.id, "failed");
  ASSERT_FALSE(ev.is_null());
  EXPECT_EQ(ev["failure"], "guest_panic");
  // The panic line itself (a long stack trace can push the sysrq line that
  // precedes it out of the excerpt; the engine always keeps the panic line).
  EXPECT_NE(ev["console_tail"].get<std::string>().find("Kernel panic"), std::string::npos)
      << ev.dump();
  expect_nothing_left(sb.id);
}

TEST_F(EngineFailureTest, QemuKilledIsVmmDiedAndInFlightExecFailsFast) {
  Engine engine(cfg_);
  auto sb = engine.create({});
  SteadyClock::time_point t0;
  std::chrono::milliseconds took{0};
  Errc code = Errc::internal;
  auto fut = exec_in_flight(engine, sb.id, "sleep 100", &t0, &took, &code);
  t0 = SteadyClock::now();
  ASSERT_EQ(::kill(sb.pid, SIGKILL), 0);
  ASSERT_EQ(fut.wait_for(10s), std::future_status::ready) << "exec hangs after QEMU died";
  std::string err = fut.get();
  EXPECT_NE(err.find("vmm_died"), std::string::npos) << err;
  EXPECT_EQ(code, Errc::guest_error);
  EXPECT_LT(took, 5s) << "the in-flight exec took " << took.count() << " ms to fail";
  std::printf("[ measured ] in-flight exec failed %lld ms after SIGKILL of QEMU\n",
              static_cast<long long>(took.count()));
  SandboxInfo info = engine.get(sb.id);
  EXPECT_EQ(info.state, State::failed);
  EXPECT_EQ(info.failure, "vmm_died");
  // SIGKILL leaves no trace QEMU could write and QEMU is not our child:
  // the status is unknown, and the reason says so.
  EXPECT_NE(info.reason.find("exit status unknown"), std::string::npos) << info.reason;
  auto ev = last_event(engine, sb.id, "failed");
  ASSERT_FALSE(ev.is_null());
  EXPECT_EQ(ev["failure"], "vmm_died");
  EXPECT_TRUE(ev.contains("console_tail"));
  // Later calls are refused with the cause.
  try {
    engine.exec(sb.id, {.argv = {"true"}}, {});
    ADD_FAILURE() << "exec on a failed sandbox worked";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::conflict);
    EXPECT_NE(std::string(e.what()).find("vmm_died"), std::string::npos) << e.what();
  }
  expect_nothing_left(sb.id);
}

// The agent is PID 1 (killing it panics the guest), so an unresponsive
// agent is made by stopping the VM's vCPUs over QMP: QEMU runs, the channel
// stays open, nothing answers.
TEST_F(EngineFailureTest, PausedVmIsAgentLost) {
  Config cfg = cfg_;
  cfg.agent_ping_interval_ms = 500;
  cfg.agent_ping_timeout_ms = 3000;
  Engine engine(cfg);
  auto sb = engine.create({});
  EXPECT_EQ(sh(engine, sb.id, "echo ok"), "ok\n");
  std::this_thread::sleep_for(2s);  // several pings answered: no false alarm
  ASSERT_EQ(engine.get(sb.id).state, State::running);
  SteadyClock::time_point t0;
  std::chrono::milliseconds took{0};
  Errc code = Errc::internal;
  auto fut = exec_in_flight(engine, sb.id, "sleep 100", &t0, &took, &code);
  t0 = SteadyClock::now();
  {
    auto qmp = vmm::QmpClient::connect(data_ / "sandboxes" / sb.id / "qmp.sock", 5s);
    qmp.execute("stop");
  }
  ASSERT_EQ(fut.wait_for(30s), std::future_status::ready) << "exec hangs on a paused VM";
  std::string err = fut.get();
  EXPECT_NE(err.find("agent_lost"), std::string::npos) << err;
  std::printf("[ measured ] paused VM detected as agent_lost after %lld ms (ping timeout 3000)\n",
              static_cast<long long>(took.count()));
  EXPECT_LT(took, 10s);
  SandboxInfo info = engine.get(sb.id);
  EXPECT_EQ(info.state, State::failed);
  EXPECT_EQ(info.failure, "agent_lost");
  EXPECT_NE(info.reason.find("ping"), std::string::npos) << info.reason;
  auto ev = last_event(engine, sb.id, "failed");
  ASSERT_FALSE(ev.is_null());
  EXPECT_EQ(ev["failure"], "agent_lost");
  expect_nothing_left(sb.id);
}

TEST_F(EngineFailureTest, IdleTimeoutCountsExecsAndCallsAsActivity) {
  Engine engine(cfg_);
  auto sb = engine.create({.idle_timeout_s = 2});
  EXPECT_EQ(sb.spec.idle_timeout_s, 2);
  // A running exec longer than the idle timeout is activity...
  EXPECT_EQ(sh(engine, sb.id, "sleep 4; echo done"), "done\n");
  // ... and so are calls spaced closer than it.
  for (int i = 0; i < 3; ++i) {
    std::this_thread::sleep_for(1s);
    engine.stat_file(sb.id, "/");
  }
  EXPECT_EQ(engine.get(sb.id).state, State::running);
  auto idle_from = SteadyClock::now();
  SandboxInfo info = wait_ended(engine, sb.id, 20s);
  auto after =
      std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - idle_from);
  EXPECT_EQ(info.state, State::timed_out);
  EXPECT_EQ(info.reason, "idle for 2 s");
  EXPECT_EQ(info.failure, "");
  EXPECT_GE(after, 1500ms);
  EXPECT_LT(after, 6s);
  auto ev = last_event(engine, sb.id, "timed_out");
  ASSERT_FALSE(ev.is_null());
  EXPECT_EQ(ev["reason"], "idle for 2 s");
  expect_nothing_left(sb.id);
  // Out of range is refused before anything is created.
  try {
    engine.create({.idle_timeout_s = 604801});
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "idle_timeout");
  }
}

// QEMU's jail cgroup allows guest RAM + overhead, which a guest cannot
// exceed by itself; the test lowers the limit under the running QEMU (as a
// host under memory pressure or a runaway QEMU would meet it) and makes the
// guest touch memory: the kernel OOM-kills QEMU and the sandbox must say oom.
TEST_F(EngineFailureTest, QemuCgroupOomIsFailedOom) {
  Engine engine(cfg_);
  auto sb = engine.create({.memory_mb = 256});
  std::string mem = vmm::read_cgroup_limits(sb.pid)["paths"].value("memory", "");
  if (mem.find("/airlock/" + sb.id) == std::string::npos)
    GTEST_SKIP() << "QEMU has no memory cgroup of its own here (" << mem << ")";
  fs::path dir = mem;
  bool v1 = fs::exists(dir / "memory.limit_in_bytes");
  int64_t usage = 0;
  std::ifstream(dir / (v1 ? "memory.usage_in_bytes" : "memory.current")) >> usage;
  ASSERT_GT(usage, 0);
  {
    std::ofstream lim(dir / (v1 ? "memory.limit_in_bytes" : "memory.max"));
    lim << usage + (24 << 20);
    lim.close();
    ASSERT_TRUE(lim) << "cannot lower the memory limit of " << dir;
  }
  std::string err;
  try {
    // ~150 MB of guest RAM touched: far past the lowered limit.
    engine.exec(sb.id, {.cmd = "x=$(head -c 150000000 /dev/zero | tr '\\0' a); echo ${#x}"}, {});
  } catch (const Error& e) {
    err = e.what();
  }
  EXPECT_NE(err.find("oom"), std::string::npos) << err;
  SandboxInfo info = wait_ended(engine, sb.id);
  EXPECT_EQ(info.state, State::failed);
  EXPECT_EQ(info.failure, "oom") << info.reason;
  EXPECT_NE(info.reason.find("oom_kill"), std::string::npos) << info.reason;
  auto ev = last_event(engine, sb.id, "failed");
  ASSERT_FALSE(ev.is_null());
  EXPECT_EQ(ev["failure"], "oom");
  expect_nothing_left(sb.id);
}

}  // namespace
}  // namespace airlock::engine

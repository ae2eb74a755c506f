// The engine's network wiring with REAL VMs and the real airlock-net helper
// (needs the `minimal` image in $AIRLOCK_IMAGE_DIR, like engine_test). No
// target outside the VM is reachable here: the checks are the NIC (or its
// absence), the guest's configuration, denials recorded in the journal,
// runtime policy changes and that no helper outlives its sandbox. Real
// egress is covered by tests/integration/test_network.py (root, netns).
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/error.h"
#include "common/process.h"
#include "engine/engine.h"
#include "engine/engine_test_support.h"

namespace airlock::engine {
namespace {

namespace fs = std::filesystem;

// Live processes whose command line contains `what` and `needle`.
std::vector<pid_t> processes(const std::string& what, const std::string& needle) {
  return find_processes({what, needle});
}

class EngineNetworkTest : public testing::RealVmTest {};

TEST_F(EngineNetworkTest, BadPolicyIsRefusedBeforeAnythingExists) {
  Engine engine(cfg_);
  SandboxSpec spec;
  spec.network = {{"mode", "allowlist"}, {"allow", {"198.51.100.0/24", "127.0.0.1"}}};
  try {
    engine.create(spec);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_EQ(e.field(), "network.allow[1]");
  }
  spec.network = {{"mode", "sideways"}};
  try {
    engine.create(spec);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_EQ(e.field().rfind("network", 0), 0u) << e.field();
  }
  EXPECT_TRUE(engine.list({}, true).empty());
  EXPECT_TRUE(processes("airlock-net", data_.string()).empty());
}

TEST_F(EngineNetworkTest, NoneHasNoNicAndAllowlistGetsAConfiguredOne) {
  Engine engine(cfg_);
  SandboxInfo plain = engine.create({});
  EXPECT_EQ(to_json(plain)["network"]["mode"], "none");
  EXPECT_EQ(sh(engine, plain.id, "ls /sys/class/net"), "lo\n");
  EXPECT_TRUE(processes("airlock-net", plain.id).empty());
  try {
    engine.set_network(plain.id, {{"mode", "open"}});
    ADD_FAILURE() << "set_network on a sandbox without NIC accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::conflict);
  }
  testing::destroy_wait(engine, plain.id);

  SandboxSpec spec;
  spec.network = {{"mode", "allowlist"}, {"allow", {"198.51.100.7/32"}}};
  SandboxInfo sb = engine.create(spec);
  EXPECT_EQ(to_json(sb)["network"]["mode"], "allowlist");
  ASSERT_EQ(processes("airlock-net", sb.id).size(), 1u);
  EXPECT_EQ(sh(engine, sb.id, "ls /sys/class/net"), "eth0\nlo\n");
  EXPECT_EQ(sh(engine, sb.id, "cat /etc/resolv.conf"), "nameserver 10.0.2.3\n");
  std::string addr = sh(engine, sb.id, "ip -4 addr show eth0; ip route");
  EXPECT_NE(addr.find("inet 10.0.2.15/24"), std::string::npos) << addr;
  EXPECT_NE(addr.find("default via 10.0.2.2"), std::string::npos) << addr;
  EXPECT_NE(sh(engine, sb.id, "cat /sys/class/net/eth0/address").find("52:54:00:"),
            std::string::npos);

  // Cloud metadata: always denied, refused at once (RST), recorded.
  auto t0 = std::chrono::steady_clock::now();
  int code = 0;
  sh(engine, sb.id, "nc -w 30 169.254.169.254 80 </dev/null", &code);
  auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  EXPECT_NE(code, 0);
  // Far below nc's own 30 s, however loaded the host: reset, not timed out.
  EXPECT_LT(ms, 15000) << "a denied connection must be reset, not time out";
  // The helper reports flows on its own socket, read by the daemon's thread:
  // the record lands shortly after, not necessarily before the exec's reply.
  bool seen = false;
  for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
       !seen && std::chrono::steady_clock::now() < until;) {
    for (auto& ev : engine.network_events(sb.id))
      if (ev["event"] == "net_flow" && ev["dst"] == "169.254.169.254" && ev["allowed"] == false) {
        seen = true;
        EXPECT_EQ(ev["sandbox"], sb.id);
        EXPECT_EQ(ev["rule"].get<std::string>().rfind("always-deny", 0), 0u) << ev.dump();
      }
    if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(seen);
  size_t before = engine.network_events(sb.id).size();
  EXPECT_EQ(engine.network_events(sb.id, before).size(), 0u);

  // Runtime change: a bad policy names its entry; a good one is recorded.
  try {
    engine.set_network(sb.id, {{"mode", "allowlist"}, {"allow", {"10.1.0.0/16"}}});
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_EQ(e.field(), "network.allow[0]");
  }
  auto r = engine.set_network(sb.id, {{"mode", "open"}});
  EXPECT_EQ(r["policy"]["mode"], "open");
  EXPECT_EQ(engine.get(sb.id).spec.network["mode"], "open");
  bool changed = false, policy_event = false;
  for (auto& ev : engine.audit(sb.id)) {
    if (ev["event"] == "network_changed") changed = true;
    if (ev["event"] == "net_policy") policy_event = true;
  }
  EXPECT_TRUE(changed);
  EXPECT_TRUE(policy_event);

  testing::destroy_wait(engine, sb.id);
  EXPECT_TRUE(processes("airlock-net", sb.id).empty()) << "helper outlived its sandbox";
  EXPECT_TRUE(processes("qemu", sb.id).empty());
  EXPECT_FALSE(engine.network_events(sb.id).empty()) << "net events must outlive the sandbox";
}

TEST_F(EngineNetworkTest, RestartKeepsTheHelper) {
  std::string id;
  {
    Engine engine(cfg_);
    SandboxSpec spec;
    spec.network = {{"mode", "open"}};
    id = engine.create(spec).id;
  }
  auto helpers = processes("airlock-net", id);
  ASSERT_EQ(helpers.size(), 1u) << "the helper must survive the engine";
  Engine engine(cfg_);
  EXPECT_EQ(processes("airlock-net", id), helpers);
  auto r = engine.set_network(id, {{"mode", "allowlist"}, {"allow", {"203.0.113.0/24"}}});
  EXPECT_EQ(r["policy"]["mode"], "allowlist");
  testing::destroy_wait(engine, id);
  EXPECT_TRUE(processes("airlock-net", id).empty());
}

// The helper runs in its sandbox's cgroup (the jail's, named after the id):
// its memory, cpu and pids count against the sandbox's limits, and it is
// gone before the cgroup is removed.
TEST_F(EngineNetworkTest, HelperRunsInTheSandboxCgroup) {
  Engine engine(cfg_);
  SandboxInfo sb = engine.create({.network = {{"mode", "open"}}});
  auto cgroup_of = [](pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/cgroup");
    std::string all, line;
    while (std::getline(in, line)) all += line + "\n";
    return all;
  };
  std::string qemu = cgroup_of(sb.pid);
  if (qemu.find("/airlock/" + sb.id) == std::string::npos) {
    testing::destroy_wait(engine, sb.id);
    GTEST_SKIP() << "QEMU has no per-sandbox cgroup on this host";
  }
  pid_t net = 0;
  std::ifstream(data_ / "sandboxes" / sb.id / "net.pid") >> net;
  ASSERT_GT(net, 0);
  EXPECT_NE(cgroup_of(net).find("/airlock/" + sb.id), std::string::npos) << cgroup_of(net);
  testing::destroy_wait(engine, sb.id);
  EXPECT_TRUE(processes("airlock-net", sb.id).empty());
  for (const char* root : {"/sys/fs/cgroup/airlock", "/sys/fs/cgroup/memory"})
    EXPECT_FALSE(fs::exists(fs::path(root) / sb.id)) << "cgroup left: " << root;
}

}  // namespace
}  // namespace airlock::engine

// A Launcher for tests (launcher.h): no QEMU. Each "VM" is an
// airlock-fake-vm process (fake_vm_main.cc) that serves the REAL
// airlock-guest binary on <run_dir>/agent.sock, so the engine's create,
// exec, files, pool, reaper, failure and re-adoption paths run for real, in
// milliseconds. The agent runs on this host as this user: only for tests.
//
//   auto fake = std::make_shared<FakeLauncher>(FAKE_VM_BIN, GUEST_BIN);
//   cfg.launcher = fake;  cfg.templates = false;
//   fake->before_start = [](const vmm::VmConfig&) { throw std::bad_alloc(); };
#pragma once

#include <atomic>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <string>

#include "engine/launcher.h"

namespace airlock::engine {

class FakeLauncher final : public Launcher {
 public:
  FakeLauncher(std::filesystem::path fake_vm_binary, std::filesystem::path agent_binary);

  std::unique_ptr<VmHandle> start(const vmm::VmConfig& config) override;
  std::unique_ptr<VmHandle> adopt(const vmm::VmConfig& config, pid_t pid) override;
  std::string name() const override { return "fake"; }

  // Test hooks. before_start runs before the fake VM is spawned (throw to
  // simulate a VMM failure of any type).
  std::function<void(const vmm::VmConfig&)> before_start;
  // Every alive() call sleeps this long first (a slow /proc or cgroup read).
  std::atomic<int> alive_delay_ms{0};
  // Runs before a fake save_memory writes its file (throw to simulate a
  // failed save, e.g. a full disk).
  std::function<void(const std::filesystem::path&)> before_save;
  std::atomic<int> starts{0};
  // The cpu weight each fake VM was started with or last set to, by
  // sandbox id (its run dir's name); -1 if none.
  int cpu_weight(const std::string& id) const;
  void set_weight(const std::filesystem::path& run_dir, int weight);

 private:
  std::filesystem::path fake_vm_, agent_;
  mutable std::mutex mu_;
  std::map<std::string, int> weights_;
};

// SIGKILLs `pid` and every process below it (the agent and its execs), and
// waits until they are gone. Never throws.
void kill_process_tree(pid_t pid);

}  // namespace airlock::engine

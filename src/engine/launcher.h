// The seam between the engine and the VMM (like Cloud Hypervisor's
// hypervisor trait): how a sandbox's VM is started, re-adopted, watched and
// killed. The engine never names vmm::Vm outside launcher.cc, so changes to
// QEMU's command line, jail or template RAM stay behind this interface.
//
//   std::shared_ptr<Launcher> l = qemu_launcher();      // the default
//   std::unique_ptr<VmHandle> vm = l->start(vc);        // throws Error; nothing left
//   GuestChannel::connect(vm->agent_socket(), deadline);
//   vm->kill();                                         // idempotent
//
// fake_launcher.h has the test implementation: the real airlock-guest on a
// unix socket, no QEMU, so lifecycle tests run in milliseconds.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "common/error.h"
#include "engine/vmm/vm.h"

namespace airlock::engine {

// One VM. Destroying the handle detaches (the VM keeps running, a later
// daemon re-adopts it); only kill() ends it.
class VmHandle {
 public:
  virtual ~VmHandle() = default;
  virtual pid_t pid() const = 0;
  // Running and still this sandbox's VM (pid-reuse safe).
  virtual bool alive() const = 0;
  // The unix socket the guest agent's channel is reached on.
  virtual std::filesystem::path agent_socket() const = 0;
  // The last `lines` console lines; never throws.
  virtual std::string console_tail(size_t lines) const = 0;
  // Pauses and writes the device state (templates); see vmm::Vm::save_state.
  virtual uint64_t save_state(const std::filesystem::path& path,
                              std::chrono::milliseconds timeout) = 0;
  // Pause, snapshots, fork (vmm::Vm::save_memory and friends): the whole
  // VM state, RAM included, to `path`; the VM stays stopped.
  virtual uint64_t save_memory(const std::filesystem::path& path,
                               std::chrono::milliseconds timeout) = 0;
  // Fork (vmm::Vm::save_memory_split): the RAM as a sealed memfd, the rest
  // to `device_path`; `saved` runs once the state is taken (it may resume
  // the VM), `whole_fallback` keeps a stream that does not split. By default
  // not supported (Error before `saved`): the caller then saves the whole
  // state with save_memory.
  virtual vmm::SplitStream save_memory_split(const std::filesystem::path&,
                                             std::chrono::milliseconds,
                                             const std::function<void()>& /*saved*/,
                                             const std::filesystem::path& /*whole_fallback*/) {
    throw Error(Errc::unavailable, "this VM cannot split its saved state");
  }
  // The VM's share of the CPU against the others (vmm::Vm::set_cpu_weight).
  virtual void set_cpu_weight(int weight) = 0;
  virtual void stop_cpus() = 0;
  virtual void resume_cpus() = 0;
  // Before a save from a running VM (vmm::Vm::prefault_ram); by default
  // nothing to do.
  virtual uint64_t prefault_ram() { return 0; }
  // vmm::VmConfig::ram_block for a restore of this VM's saved state.
  virtual std::string ram_block() const = 0;
  // SIGKILL, wait until gone, release what the VMM holds (cgroup, uid
  // lease, sockets). Idempotent; Error(internal) if it will not die.
  virtual void kill() = 0;
};

class Launcher {
 public:
  virtual ~Launcher() = default;
  // Starts the VM described by `config`; on failure nothing is left.
  virtual std::unique_ptr<VmHandle> start(const vmm::VmConfig& config) = 0;
  // The VM started earlier with `pid`, or nullptr if it is gone.
  virtual std::unique_ptr<VmHandle> adopt(const vmm::VmConfig& config, pid_t pid) = 0;
  // "qemu" or "fake" (diagnostics).
  virtual std::string name() const = 0;
};

// The real one: QEMU through vmm::Vm.
std::shared_ptr<Launcher> qemu_launcher();

}  // namespace airlock::engine

// One QEMU process per sandbox.
//
// QEMU is started detached (own session, not a child that dies with the
// daemon) with no default devices and no display:
//   - virtio-blk root from the sandbox's qcow2 overlay
//   - a virtio-serial port named "airlock.0" whose host end is the unix
//     socket agent_socket(): the guest agent's channel
//   - virtio-rng
//   - the serial console on a unix socket, copied by a thread of this object
//     into console.log, capped at console_cap_bytes (older half dropped)
//   - QMP on a unix socket (qmp.sock) for control
// QEMU starts paused (-S) and is resumed once the console is attached, so
// no boot output is lost. Everything of the VM lives in run_dir.
//
//   VmConfig cfg{.id = id, .run_dir = dir, .kernel = img.kernel, ...};
//   auto vm = Vm::start(cfg);      // throws Error on failure, nothing left behind
//   GuestChannel::connect(vm->agent_socket(), ...);
//   vm->kill();                    // SIGKILL, reap, sockets removed
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace airlock::vmm {

enum class Accel { kvm, tcg };
const char* to_string(Accel accel);

struct VmConfig {
  std::string id;
  std::filesystem::path run_dir;  // exists; sockets, logs, pid file go here
  std::filesystem::path kernel;
  std::filesystem::path initrd;
  std::filesystem::path disk;  // qcow2 overlay
  std::string extra_kernel_args;
  int cpus = 1;
  int memory_mb = 256;
  Accel accel = Accel::tcg;
  size_t console_cap_bytes = 1 << 20;
  std::string qemu_binary = "qemu-system-x86_64";
};

class Vm {
 public:
  // Starts QEMU; returns once it runs (resumed) with console capture attached.
  static std::unique_ptr<Vm> start(const VmConfig& config);
  // Re-attaches to a QEMU started earlier (e.g. by a previous daemon) if the
  // pid still belongs to this VM; returns nullptr if it is gone.
  static std::unique_ptr<Vm> adopt(const VmConfig& config, pid_t pid);

  ~Vm();  // stops console capture; does NOT kill QEMU
  Vm(const Vm&) = delete;
  Vm& operator=(const Vm&) = delete;

  pid_t pid() const;
  bool alive() const;
  std::filesystem::path agent_socket() const;
  std::filesystem::path console_log() const;
  // The last `lines` lines of the console (for error messages).
  std::string console_tail(size_t lines = 20) const;
  // The full QEMU command line used (for diagnostics and tests).
  const std::vector<std::string>& argv() const;

  // SIGKILL QEMU, wait until it is gone, remove its sockets and pid file.
  // Idempotent.
  void kill();

 private:
  struct Impl;
  explicit Vm(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The QEMU argv for `config` (pure; unit-tested).
std::vector<std::string> qemu_argv(const VmConfig& config);

}  // namespace airlock::vmm

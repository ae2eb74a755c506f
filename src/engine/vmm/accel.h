// Choosing the accelerator: KVM only if a real probe boot with KVM reaches
// the guest agent; otherwise TCG. /dev/kvm existing proves nothing (some
// hosts' KVM hangs stock kernels at their first instruction).
//
//   AccelVerdict v = probe_accel({.kernel = k, .initrd = i, .disk = scratch_overlay,
//                                 .work_dir = data_dir / "probe",
//                                 .cache_file = data_dir / "accel.json"});
//   cfg.accel = v.accel;   // v.reason says why, for GET /v1/info
//
// No usable /dev/kvm: TCG at once (not cached: it costs nothing to re-check).
// Otherwise the verdict of the probe boot is cached in cache_file, keyed by
// the host kernel release, the guest kernel (path, size, mtime) and QEMU's
// version; a changed key probes again.
#pragma once

#include <chrono>
#include <filesystem>
#include <string>

#include "engine/vmm/vm.h"

namespace airlock::vmm {

struct ProbeConfig {
  std::filesystem::path kernel;
  std::filesystem::path initrd;
  std::filesystem::path disk;  // qcow2 overlay the probe VM may write to
  // Scratch parent: the probe VM's run dir is made (and removed) inside it.
  std::filesystem::path work_dir;
  std::filesystem::path cache_file;  // JSON; its directory must exist
  std::chrono::milliseconds deadline = std::chrono::seconds(15);
  std::string qemu_binary = "qemu-system-x86_64";
  std::filesystem::path kvm_device = "/dev/kvm";  // injectable for tests
};

struct AccelVerdict {
  Accel accel = Accel::tcg;
  std::string reason;
  bool from_cache = false;
};

// Never throws for a failed probe (that is a "tcg" verdict); throws Error
// only for caller mistakes (missing kernel, unwritable work_dir).
AccelVerdict probe_accel(const ProbeConfig& config);

// The first line of `binary --version` ("QEMU emulator version 7.2.22 (Debian ...)"),
// "unknown" if it cannot be run. Part of every cache key that QEMU affects.
std::string qemu_version(const std::string& binary);

// Connects to a guest agent socket and completes a hello exchange (send our
// hello, receive the guest's) before `deadline`. Returns the guest's hello
// payload; throws Error(timeout / protocol_error) naming what failed.
std::string agent_hello(const std::filesystem::path& agent_socket,
                        std::chrono::steady_clock::time_point deadline);

}  // namespace airlock::vmm

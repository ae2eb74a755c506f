// Splits a QEMU 7.2 migration stream (what Vm::save_memory writes: the VM
// stopped, no x-ignore-shared, no multifd/compression/xbzrle) into
//  * the guest's main RAM block as a write-sealed memfd (SealedRam), each
//    saved page at its offset, zero pages left as holes, and
//  * the same stream without that block's page records: device state, the
//    ROM blocks' pages and the RAM section's block list, small.
// A VM started with that memfd mapped privately (memory-backend-file
// share=off, as a template clone) and loading the small stream continues
// where the source stopped, and N such VMs share the memfd's pages
// copy-on-write: a fork or restore no longer copies its RAM through the
// migration channel (docs/design.md, "Snapshots, fork, pause").
//
// The stream is parsed, never trusted: anything that is not the expected
// layout (a section other than "ram" before the first device section, an
// unknown page flag, a page outside its block, a truncated record) is
// Error(internal) naming it, and the caller falls back to the full stream.
//
//   int pipefd[2]; ... QEMU migrates into pipefd[1] ...
//   auto r = split_migration_stream(pipefd[0], dev_fd, "ram0");
//   vc.memory_fd = r.ram->fd(); vc.incoming_state = dev.state;
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/vmm/sealed_ram.h"

namespace airlock::vmm {

struct SplitStream {
  std::shared_ptr<SealedRam> ram;  // the main RAM block, sealed
  uint64_t pages = 0;              // non-zero pages moved into `ram`
  uint64_t device_bytes = 0;       // written to the device stream
  std::string error;               // why there is no `ram` (Vm::save_memory_split's fallback)
};

// Reads the whole stream from `in_fd` (file or pipe, to EOF) and writes the
// device stream to `dev_fd`. `block` is the main RAM block's id: "pc.ram"
// (plain -m) or "ram0" (a memory-backend). Error(internal) on any mismatch.
// `stop` (optional), once true, makes a read that waits give up (the
// writer failed and will never close its end).
SplitStream split_migration_stream(int in_fd, int dev_fd, const std::string& block,
                                   const std::atomic<bool>* stop = nullptr);

// The RAM block id QEMU gives a VM's main RAM: VmConfig::ram_block's
// "" (plain -m) is "pc.ram", the `pc` machine's default-ram-id.
inline std::string ram_block_id(const std::string& ram_block) {
  return ram_block.empty() ? "pc.ram" : ram_block;
}

}  // namespace airlock::vmm

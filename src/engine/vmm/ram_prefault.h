// Maps a running QEMU's guest RAM into its page tables before a save, from
// outside and without stopping anything.
//
// A clone's guest RAM is a private mapping of its template's sealed memfd,
// and QEMU has never touched most of it: the first migration stream then
// takes a page fault for every page it reads (38,490 for a fresh minimal
// clone) while the guest stands still, 0.6-0.7 s of a fork's pause. Reading
// the same range with process_vm_readv faults the pages into QEMU's own page
// tables while the guest runs (the kernel's remote get_user_pages); the save
// that follows finds them mapped. What the save would have done to the
// template's memfd (allocating its holes) is the same either way.
//
//   uint64_t n = prefault_guest_ram(qemu_pid, memory_mb << 20);
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace airlock::vmm {

// The address range of the one writable private mapping of exactly
// `ram_bytes` in /proc/<pid>/maps text `maps` (QEMU's guest RAM block), or
// nothing if there is none or more than one.
std::optional<std::pair<uint64_t, uint64_t>> find_ram_mapping(const std::string& maps,
                                                              uint64_t ram_bytes);

// Reads process `pid`'s guest RAM mapping (find_ram_mapping) end to end
// with process_vm_readv, discarding the bytes. Best effort: returns the
// bytes read (0 if no such mapping or the process cannot be read).
uint64_t prefault_guest_ram(pid_t pid, uint64_t ram_bytes);

}  // namespace airlock::vmm

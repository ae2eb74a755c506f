// Admission: what a VM start may take before it starts. Two budgets, each
// with its own lock:
//  - DiskAdmission: the disk_mb of every admitted sandbox (starting or
//    running, pool members included, and the scratch of running `changes`
//    calls) must fit the data filesystem's free space;
//  - StartSlots: at most N VM starts (boots, clones, template builds) at
//    once; more creates queue for a slot instead of thrashing the host.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <string>

namespace airlock::engine::lifecycle {

// Error(unavailable, `field`, naming `what` and the numbers) if
// `admitted_mb` + `want_mb` exceeds `free_mb` (< 0: unknown, never
// refused). The message never names a host path: tenants read it.
void check_disk_space(int64_t free_mb, int64_t admitted_mb, int64_t want_mb,
                      const std::string& what, const std::string& field);

// Snapshots and pause write whole files on the host's disk: below this much
// free space a failed write is reported as a full disk (Error unavailable)
// whatever errno it carried.
inline constexpr uint64_t kLowSpaceBytes = 16ull << 20;
// Free bytes of the filesystem holding `dir` (0 if it cannot be read).
uint64_t free_bytes(const std::filesystem::path& dir);
// Throws Error(unavailable, "no space left ... writing `writing`") if the
// filesystem of `dir` has less than max(wanted, kLowSpaceBytes) free.
void rethrow_if_disk_full(const std::filesystem::path& dir, const std::string& writing,
                          uint64_t wanted);

class DiskAdmission {
 public:
  // `free_mb`: free MiB of the data filesystem now, -1 if unknown.
  explicit DiskAdmission(std::function<int64_t()> free_mb) : free_mb_(std::move(free_mb)) {}

  // Reserves `mb` under `key` if it fits beside every reservation already
  // made; else check_disk_space's Error.
  void reserve(const std::string& key, int64_t mb, const std::string& what,
               const std::string& field);
  // Records `mb` under `key` without a check (a sandbox that exists
  // already: re-adopted, or adopted paused).
  void admit(const std::string& key, int64_t mb);
  // Moves the reservation of `from` to `to` (a pool member handed out).
  void rename(const std::string& from, const std::string& to, int64_t mb);
  void release(const std::string& key);

 private:
  std::function<int64_t()> free_mb_;
  std::mutex mu_;
  std::map<std::string, int64_t> held_mb_;
};

class StartSlots {
 public:
  explicit StartSlots(int max) : max_(max) {}

  // One start, held for a scope; waits until a slot is free.
  class Slot {
   public:
    explicit Slot(StartSlots& slots);
    ~Slot();
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;

   private:
    StartSlots& slots_;
  };

 private:
  const int max_;
  std::mutex mu_;
  std::condition_variable cv_;
  int running_ = 0;
};

}  // namespace airlock::engine::lifecycle

#include "engine/lifecycle/admission.h"

#include <sys/statvfs.h>

#include <algorithm>

#include "common/error.h"

namespace airlock::engine::lifecycle {

namespace fs = std::filesystem;

void check_disk_space(int64_t free_mb, int64_t admitted_mb, int64_t want_mb,
                      const std::string& what, const std::string& field) {
  if (free_mb < 0 || admitted_mb + want_mb <= free_mb) return;
  throw Error(Errc::unavailable,
              "not enough disk for " + what + ": the sandboxes and changes calls already " +
                  "admitted hold " + std::to_string(admitted_mb) +
                  " MiB in total and the host's data filesystem has " + std::to_string(free_mb) +
                  " MiB free",
              field);
}

uint64_t free_bytes(const fs::path& dir) {
  struct statvfs st {};
  if (::statvfs(dir.c_str(), &st) != 0) return 0;
  return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
}

// A write under `dir` failed: if its filesystem is (nearly) full, that is
// the cause the caller should hear (unavailable: free space and retry),
// whatever errno the copy or QEMU's migration reported (a full tmpfs may
// surface as EIO from copy_file_range, QEMU says "Unable to write").
void rethrow_if_disk_full(const fs::path& dir, const std::string& writing, uint64_t wanted) {
  if (free_bytes(dir) < std::max<uint64_t>(wanted, kLowSpaceBytes))
    throw Error(Errc::unavailable, "no space left on the host's disk writing " + writing + " (" +
                                       std::to_string(free_bytes(dir) >> 20) +
                                       " MiB free): free some space and try again");
}

void DiskAdmission::reserve(const std::string& key, int64_t mb, const std::string& what,
                            const std::string& field) {
  std::lock_guard lock(mu_);
  int64_t sum = 0;
  for (const auto& [k, held] : held_mb_) sum += held;
  check_disk_space(free_mb_(), sum, mb, what, field);
  held_mb_[key] = mb;
}

void DiskAdmission::admit(const std::string& key, int64_t mb) {
  std::lock_guard lock(mu_);
  held_mb_[key] = mb;
}

void DiskAdmission::rename(const std::string& from, const std::string& to, int64_t mb) {
  std::lock_guard lock(mu_);
  held_mb_.erase(from);
  held_mb_[to] = mb;
}

void DiskAdmission::release(const std::string& key) {
  std::lock_guard lock(mu_);
  held_mb_.erase(key);
}

StartSlots::Slot::Slot(StartSlots& slots) : slots_(slots) {
  std::unique_lock lock(slots_.mu_);
  slots_.cv_.wait(lock, [&] { return slots_.running_ < slots_.max_; });
  ++slots_.running_;
}

StartSlots::Slot::~Slot() {
  {
    std::lock_guard lock(slots_.mu_);
    --slots_.running_;
  }
  slots_.cv_.notify_one();
}

}  // namespace airlock::engine::lifecycle

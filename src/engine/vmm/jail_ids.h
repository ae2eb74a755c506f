// The uids/gids the jail hands to QEMU processes (jail.h), and the check that
// no one else on the host can become them.
//
// A jail id must belong to nobody else: a local user who can become it (in
// their own user namespace, through a subordinate-id range of /etc/subuid or
// /etc/subgid, or as a passwd/group entry) could connect to a sandbox's QMP
// socket. useradd hands out subordinate ranges 100000 + 65536*k and SSSD's
// id mapping slices 200000 .. 2000200000, so the default range sits above
// both and below systemd's foreign range (2147352576..):
//
//   2099999999            reserved (kTemplateRamGid)
//   2100000000 .. +65536  one uid = gid per running sandbox
//
//   vmm::set_jail_ids({.base = 2100000000, .count = 65536});  // throws on overlap
//   vmm::jail_ids().base ...
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace airlock::vmm {

inline constexpr uint32_t kDefaultJailIdBase = 2100000000;
inline constexpr uint32_t kDefaultJailIdCount = 65536;

struct JailIdRange {
  uint32_t base = kDefaultJailIdBase;
  uint32_t count = kDefaultJailIdCount;  // 1 .. 1048576
};

// Where the host's identities are listed (injectable for tests).
struct IdSources {
  std::filesystem::path subuid = "/etc/subuid";
  std::filesystem::path subgid = "/etc/subgid";
  std::filesystem::path passwd = "/etc/passwd";
  std::filesystem::path group = "/etc/group";
};

// Throws Error(invalid_argument, field "jail_ids") if `range` (or the
// template RAM group) is malformed, reaches past 2^31-1, or overlaps any
// subordinate range or passwd/group id in `sources`; the message names the
// file, its line and the colliding range. Missing files are fine (nothing
// to collide with); unparsable lines are skipped.
void check_jail_ids(const JailIdRange& range, const IdSources& sources = {});

// Checks `range` (check_jail_ids) and makes it the one leases come from in
// this process. Call once at start, before any jail is prepared.
void set_jail_ids(const JailIdRange& range, const IdSources& sources = {});

// The range in force (the default until set_jail_ids).
JailIdRange jail_ids();

// Leases one uid offset N of the range (uid = gid = jail_ids().base + N) for
// `run_dir` (absolute, existing): a QEMU jail's (jail.h) or the confinement
// helper's scratch directory (engine/confine), so no two share a uid. It is
// held until release_jail_leases(run_dir), or until run_dir is gone.
uint32_t lease_jail_uid(const std::filesystem::path& run_dir);
// Records the cgroups of lease N (removed before the lease is reused).
void write_jail_lease(uint32_t n, const std::filesystem::path& run_dir,
                      const std::vector<std::filesystem::path>& cgroups);
// Removes the leases of `run_dir` and their cgroups; returns the cgroups that
// could not be removed (their lease is kept). Never throws.
std::vector<std::string> release_jail_leases(const std::filesystem::path& run_dir);

}  // namespace airlock::vmm

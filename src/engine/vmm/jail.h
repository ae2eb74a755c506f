// The jail QEMU runs in: defence in depth around a process that, under TCG,
// is not a security boundary by QEMU's own policy.
//
// As root (the full jail), the jailed process gets
//   - its own unprivileged uid/gid, BASE + N (jail_ids.h), leased per sandbox in
//     /run/airlock/jail-leases/N (never reused while the lease's run_dir
//     exists); run_dir becomes root:<gid> mode 01770 (it can create its
//     sockets; the sticky bit keeps it from renaming or deleting the
//     daemon's files there) and the files in `chown` become <uid>:<gid>
//   - new mount, pid, ipc, uts and net namespaces (it is PID 1 of its pid
//     namespace; networking reaches it only as a unix socket in run_dir)
//   - a root of its own: a read-only tmpfs holding exactly the paths it
//     needs, bind-mounted at their host paths (read-only except run_dir and
//     `rw`), symlinks on the way reproduced, /dev/null and /dev/urandom
//     (with `kvm`, its own node of /dev/kvm), then pivot_root: the host's / is gone
//   - no capabilities (effective, permitted, inheritable, ambient and the
//     bounding set), no_new_privs, umask 077, an empty environment but PATH
//   - rlimits: CORE 0, NOFILE 4096, NPROC 1024 (its uid is its own),
//     FSIZE `fsize_bytes`
//   - a cgroup (cgroup.h) with memory, pids and cpu limits.
// Not root: with unprivileged user namespaces the same namespaces and root
// (uid mapped to itself, capabilities dropped), without uid/cgroup; with
// none of that, nothing. missing() says plainly what is not in force.
//
// The process is started detached (double fork, own session: it survives
// the daemon) and `pid_file` in run_dir gets its host pid; inside the jail
// that path is shadowed by a private file, so the process's own pid file
// (QEMU writes its in-namespace pid, 1) never reaches the host's copy.
//
//   JailSpec s{.id = "sb1", .run_dir = dir, .exe = "/usr/bin/qemu-system-x86_64",
//              .ro = {kernel, initrd, base_image}, .chown = {dir / "disk.qcow2"},
//              .limits = {.memory_bytes = ..., .pids = 1024, .cpus = 2}};
//   Jail jail = Jail::prepare(s);               // lease, cgroup, mount plan; throws Error
//   pid_t pid = jail.spawn(argv, stdout_fd);    // host pid; Error names the failed step
//   ... ::kill(pid, SIGKILL); wait_gone(pid) ...
//   release_jail(dir);                          // cgroup + lease; also after a daemon restart
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/vmm/cgroup.h"

namespace airlock::vmm {

struct JailSpec {
  std::string id;                 // sandbox id: names the cgroup
  std::filesystem::path run_dir;  // exists; bound read-write
  std::filesystem::path exe;      // absolute; it and its shared libraries are bound read-only
  std::vector<std::filesystem::path> ro;     // files or dirs bound read-only (missing = error)
  std::vector<std::filesystem::path> rw;     // files or dirs bound read-write
  std::vector<std::filesystem::path> chown;  // given to the jail's uid (root only)
  // KVM: as root the jail gets its own node of kvm_device's major/minor,
  // owned by its uid, mode 0600, at /dev/kvm (as Firecracker's jailer does):
  // the host's node is root:kvm 0660, which the jail's uid cannot open.
  // Without root the host's node is bound as it is.
  bool kvm = false;
  std::filesystem::path kvm_device = "/dev/kvm";
  std::vector<gid_t> groups;                 // supplementary groups (root only)
  // One descriptor of the daemon's handed to the jailed process as fd
  // kInheritedFd (everything else is closed), and /proc (its own pid
  // namespace only: subset=pid, read-only) so it can open it by name as
  // /proc/self/fd/4 — how a clone's QEMU maps its template's sealed RAM.
  int inherit_fd = -1;
  CgroupLimits limits;
  uint64_t fsize_bytes = 0;        // RLIMIT_FSIZE; 0 = unlimited
  std::filesystem::path pid_file;  // in run_dir; gets the host pid (empty = none)
};

// The fd number JailSpec::inherit_fd has in the jailed process.
inline constexpr int kInheritedFd = 4;

enum class JailMode { full, userns, none };
const char* to_string(JailMode mode);

// What this host allows us (cached): full as root, userns if unprivileged
// user namespaces work, else none.
JailMode jail_mode();

class Jail {
 public:
  // Parent side, before any fork: leases the uid, creates the cgroup,
  // computes the mount plan. Throws Error naming what is wrong (a missing
  // path: not_found with field "ro"); on error nothing is left.
  static Jail prepare(const JailSpec& spec);

  // Starts argv (argv[0] = spec.exe) detached inside the jail; stdin is
  // /dev/null, stdout and stderr go to `out_fd`. Returns the host pid (also
  // written to spec.pid_file). Throws Error naming the step that failed
  // (e.g. "jail: mount /usr/lib/...: Permission denied") or the exec error;
  // the cgroup and lease stay until release_jail().
  pid_t spawn(const std::vector<std::string>& argv, int out_fd) const;

  JailMode mode() const { return mode_; }
  uid_t uid() const { return uid_; }
  // Protections not in force in this mode, e.g. {"uid", "cgroup"}.
  const std::vector<std::string>& missing() const { return missing_; }

  struct Op;  // one step of the mount plan (jail.cc)
  ~Jail();
  Jail(Jail&&) noexcept;
  Jail& operator=(Jail&&) noexcept;

 private:
  Jail();
  JailSpec spec_;
  JailMode mode_ = JailMode::none;
  uid_t uid_ = 0;
  gid_t gid_ = 0;
  std::vector<std::filesystem::path> cgroups_;
  std::vector<Op> ops_;
  std::vector<std::string> missing_;
};

// Removes the cgroup and the uid lease of the jail whose run_dir is
// `run_dir` (the process must be gone). Idempotent, never throws; works in a
// daemon that did not prepare the jail (re-adopted VMs). Returns the paths
// that could not be removed (for logs).
std::vector<std::string> release_jail(const std::filesystem::path& run_dir);

// Host paths QEMU (`exe`) needs at run time besides its shared libraries:
// its firmware/ROM directories, its module directory, ld.so.cache.
std::vector<std::filesystem::path> qemu_runtime_paths(const std::filesystem::path& exe);

// The files of a qcow2 image's backing chain, `disk` first (absolute paths;
// relative backing names resolved as QEMU does). Non-qcow2 files end the
// chain. Also returns the virtual size of `disk` in *virtual_size if given.
std::vector<std::filesystem::path> qcow2_chain(const std::filesystem::path& disk,
                                               uint64_t* virtual_size = nullptr);

}  // namespace airlock::vmm

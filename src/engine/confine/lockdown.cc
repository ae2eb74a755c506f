#include "engine/confine/lockdown.h"

#include <errno.h>
#include <grp.h>
#include <linux/landlock.h>
#include <seccomp.h>
#include <sys/capability.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "common/error.h"
#include "common/unique_fd.h"

namespace airlock::engine::confine {
namespace {

// Landlock rights newer than this system's header (ABI 2 and 3).
constexpr uint64_t kRefer = 1ULL << 13;
constexpr uint64_t kTruncate = 1ULL << 14;

void limit(int resource, uint64_t value, const char* name) {
  rlimit r{static_cast<rlim_t>(value), static_cast<rlim_t>(value)};
  if (::setrlimit(resource, &r) != 0) throw_errno(std::string("setrlimit ") + name);
}

scmp_filter_ctx new_filter(uint32_t default_action) {
  scmp_filter_ctx ctx = seccomp_init(default_action);
  if (!ctx) throw Error(Errc::internal, "seccomp_init failed");
  return ctx;
}

void add(scmp_filter_ctx ctx, uint32_t action, const char* name) {
  int nr = seccomp_syscall_resolve_name(name);
  if (nr == __NR_SCMP_ERROR) return;  // not on this architecture
  if (seccomp_rule_add(ctx, action, nr, 0) != 0)
    throw Error(Errc::internal, std::string("seccomp rule for ") + name);
}

void load(scmp_filter_ctx ctx) {
  int rc = seccomp_load(ctx);
  seccomp_release(ctx);
  if (rc != 0) throw Error(Errc::internal, "seccomp_load failed: " + std::string(strerror(-rc)));
}

}  // namespace

void set_limits(const nlohmann::json& l) {
  limit(RLIMIT_CORE, 0, "CORE");
  limit(RLIMIT_AS, l.at("memory_bytes").get<uint64_t>(), "AS");
  limit(RLIMIT_CPU, l.at("cpu_seconds").get<uint64_t>(), "CPU");
  limit(RLIMIT_FSIZE, l.at("file_bytes").get<uint64_t>(), "FSIZE");
  limit(RLIMIT_NOFILE, l.at("open_files").get<uint64_t>(), "NOFILE");
  limit(RLIMIT_NPROC, l.at("processes").get<uint64_t>(), "NPROC");
}

void drop_identity(int64_t uid, int64_t gid) {
  if (uid >= 0) {
    // The bounding set needs CAP_SETPCAP, so before the uid changes.
    for (int c = 0; c <= CAP_LAST_CAP; ++c) ::prctl(PR_CAPBSET_DROP, c, 0, 0, 0);
    if (::setgroups(0, nullptr) != 0) throw_errno("setgroups");
    auto g = static_cast<gid_t>(gid);
    auto u = static_cast<uid_t>(uid);
    if (::setresgid(g, g, g) != 0) throw_errno("setresgid");
    if (::setresuid(u, u, u) != 0) throw_errno("setresuid");
    if (::setuid(0) == 0) throw Error(Errc::internal, "could become root again after dropping it");
  }
  cap_t none = cap_init();
  if (!none || cap_set_proc(none) != 0) throw_errno("cap_set_proc");
  cap_free(none);
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) throw_errno("prctl(NO_NEW_PRIVS)");
}

void seal_walker() {
  // Unlisted calls fail with EPERM: libext2fs or libc trying something
  // unforeseen costs one error result, and the attempt does nothing.
  scmp_filter_ctx ctx = new_filter(SCMP_ACT_ERRNO(EPERM));
  for (const char* name : {"read",
                           "write",
                           "pread64",
                           "readv",
                           "writev",
                           "lseek",
                           "fstat",
                           "newfstatat",
                           "statx",
                           "close",
                           "fcntl",
                           "brk",
                           "mmap",
                           "munmap",
                           "mremap",
                           "madvise",
                           "mprotect",
                           "futex",
                           "rt_sigreturn",
                           "rt_sigaction",
                           "rt_sigprocmask",
                           "exit",
                           "exit_group",
                           "getpid",
                           "gettid",
                           "getrandom",
                           "clock_gettime",
                           "gettimeofday",
                           "sched_yield",
                           "restart_syscall",
                           "set_robust_list",
                           "rseq",
                           "prlimit64",
                           "getrlimit"})
    add(ctx, SCMP_ACT_ALLOW, name);
  // abort() signals its own thread only.
  int tgkill = seccomp_syscall_resolve_name("tgkill");
  seccomp_rule_add(ctx, SCMP_ACT_ALLOW, tgkill, 1,
                   SCMP_A0(SCMP_CMP_EQ, static_cast<scmp_datum_t>(::getpid())));
  load(ctx);
}

namespace {

// What no confined job needs: everything but computing on its descriptors
// and the files it may reach.
void deny_wider_kernel(scmp_filter_ctx ctx) {
  for (const char* name :
       {// network (socketpair stays: a local pair reaches nothing)
        "socket", "connect", "bind", "listen", "accept", "accept4",
        // other processes
        "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "pidfd_open", "kcmp",
        "setsid", "setpgid",
        // mounts, namespaces, root
        "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "fsopen", "fsmount",
        "fspick", "move_mount", "open_tree", "mount_setattr",
        // the kernel's wider surfaces
        "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "bpf",
        "perf_event_open", "keyctl", "add_key", "request_key", "userfaultfd", "io_uring_setup",
        "io_uring_enter", "io_uring_register", "open_by_handle_at", "name_to_handle_at", "quotactl",
        "fanotify_init", "personality", "swapon", "swapoff", "reboot", "sethostname",
        "setdomainname", "acct", "settimeofday", "clock_settime", "adjtimex", "iopl", "ioperm",
        "syslog", "lookup_dcookie", "vhangup", "uselib", "execveat"})
    add(ctx, SCMP_ACT_ERRNO(EPERM), name);
}

}  // namespace

void seal_tool(const char* path) {
  scmp_filter_ctx ctx = new_filter(SCMP_ACT_ALLOW);
  deny_wider_kernel(ctx);
  // One execve: of this pointer. The tool's own address space replaces
  // ours, so it can only execute again by placing a path at this very
  // address, and then still as this uid, under these filters and limits.
  int execve = seccomp_syscall_resolve_name("execve");
  seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), execve, 1,
                   SCMP_A0(SCMP_CMP_NE, reinterpret_cast<scmp_datum_t>(path)));
  load(ctx);
}

void seal_importer() {
  scmp_filter_ctx ctx = new_filter(SCMP_ACT_ALLOW);
  deny_wider_kernel(ctx);
  add(ctx, SCMP_ACT_ERRNO(EPERM), "execve");
  load(ctx);
}

bool restrict_paths(int dir, int file) {
  int abi = static_cast<int>(
      ::syscall(SYS_landlock_create_ruleset, nullptr, 0, LANDLOCK_CREATE_RULESET_VERSION));
  if (abi < 1) return false;  // no Landlock in this kernel: the uid and seccomp still hold
  uint64_t fs_all = (LANDLOCK_ACCESS_FS_MAKE_SYM << 1) - 1;  // ABI 1: bits 0..12
  if (abi >= 2) fs_all |= kRefer;
  if (abi >= 3) fs_all |= kTruncate;
  landlock_ruleset_attr attr{};
  attr.handled_access_fs = fs_all;
  UniqueFd rs(static_cast<int>(::syscall(SYS_landlock_create_ruleset, &attr, sizeof attr, 0)));
  if (rs.fd < 0) throw_errno("landlock_create_ruleset");
  // Below its scratch directory: everything but executing and making
  // device nodes or sockets.
  landlock_path_beneath_attr beneath{};
  beneath.allowed_access = fs_all & ~(LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_MAKE_CHAR |
                                      LANDLOCK_ACCESS_FS_MAKE_BLOCK | LANDLOCK_ACCESS_FS_MAKE_SOCK);
  beneath.parent_fd = dir;
  if (::syscall(SYS_landlock_add_rule, rs.fd, LANDLOCK_RULE_PATH_BENEATH, &beneath, 0) != 0)
    throw_errno("landlock_add_rule (directory)");
  if (file >= 0) {
    landlock_path_beneath_attr input{};
    input.allowed_access = LANDLOCK_ACCESS_FS_READ_FILE;
    input.parent_fd = file;
    if (::syscall(SYS_landlock_add_rule, rs.fd, LANDLOCK_RULE_PATH_BENEATH, &input, 0) != 0)
      throw_errno("landlock_add_rule (input)");
  }
  if (::syscall(SYS_landlock_restrict_self, rs.fd, 0) != 0) throw_errno("landlock_restrict_self");
  return true;
}

}  // namespace airlock::engine::confine

#include "engine/confine/lockdown.h"

#include <errno.h>
#include <grp.h>
#include <seccomp.h>
#include <sys/capability.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "common/error.h"

namespace airlock::engine::confine {
namespace {

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

void seal_tool(const char* path) {
  scmp_filter_ctx ctx = new_filter(SCMP_ACT_ALLOW);
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
  // One execve: of this pointer. The tool's own address space replaces
  // ours, so it can only execute again by placing a path at this very
  // address, and then still as this uid, under these filters and limits.
  int execve = seccomp_syscall_resolve_name("execve");
  seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), execve, 1,
                   SCMP_A0(SCMP_CMP_NE, reinterpret_cast<scmp_datum_t>(path)));
  load(ctx);
}

}  // namespace airlock::engine::confine

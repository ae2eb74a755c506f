// The helper's confinement (helper.h: enter_namespaces, hide_filesystem,
// lock_down): what it gives up before the first guest frame. Split from
// helper.cc, which runs the helper itself.
#include <errno.h>
#include <sched.h>
#include <seccomp.h>
#include <sys/capability.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/net/helper.h"

namespace airlock::net {

nlohmann::json enter_namespaces() {
  nlohmann::json out{{"userns", false}, {"mountns", false}, {"readonly_mounts", 0}};
  // New user namespace without a uid map: inside it the helper is the
  // overflow user with no capability over anything outside it (no
  // DAC_OVERRIDE on host files, no CAP_KILL/ptrace on other processes, no
  // privileged ports). Its network namespace stays the host's: slirp opens
  // the guest's flows as ordinary host sockets.
  if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) {
    std::cerr << "airlock-net: note: no own user/mount namespace (unshare: " << strerror(errno)
              << "); running with no_new_privs, no capabilities and seccomp only\n";
    return out;
  }
  out["userns"] = out["mountns"] = true;
  // Nothing done in this mount namespace propagates back to the host.
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    std::cerr << "airlock-net: note: cannot make mounts private: " << strerror(errno) << "\n";
    return out;
  }
  // Every mount read-only (in this namespace only): the helper writes only
  // through descriptors it opened before (events file, sockets). Locked
  // flags (nosuid, nodev, noexec) must be kept or the kernel refuses.
  std::vector<std::string> points;
  std::ifstream mi("/proc/self/mountinfo");
  for (std::string line; std::getline(mi, line);) {
    std::istringstream ls(line);
    std::string id, parent, dev, root, mp;
    if (ls >> id >> parent >> dev >> root >> mp) points.push_back(mp);
  }
  int ro = 0;
  for (auto& mp : points) {
    // mountinfo escapes spaces etc. as \ooo; such mount points are skipped.
    if (mp.find('\\') != std::string::npos) continue;
    struct statvfs sv {};
    if (statvfs(mp.c_str(), &sv) != 0) continue;
    unsigned long flags = MS_REMOUNT | MS_BIND | MS_RDONLY;
    if (sv.f_flag & ST_NOSUID) flags |= MS_NOSUID;
    if (sv.f_flag & ST_NODEV) flags |= MS_NODEV;
    if (sv.f_flag & ST_NOEXEC) flags |= MS_NOEXEC;
    if (sv.f_flag & ST_NOATIME) flags |= MS_NOATIME;
    if (sv.f_flag & ST_NODIRATIME) flags |= MS_NODIRATIME;
    if (sv.f_flag & ST_RELATIME) flags |= MS_RELATIME;
    if (mount(nullptr, mp.c_str(), nullptr, flags, nullptr) == 0) ++ro;
  }
  out["readonly_mounts"] = ro;
  return out;
}

bool hide_filesystem() {
  // An empty read-only tmpfs becomes the root; the old root is detached.
  // pivot_root(".", ".") stacks the old root on the new one, so no
  // directory has to be created (without a uid map nothing can be).
  auto note = [](const char* what) {
    std::cerr << "airlock-net: note: no empty root (" << what << ": " << strerror(errno)
              << "); the host's files stay visible read-only\n";
    return false;
  };
  if (mount("airlock-net", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY,
            "size=4k,mode=0555") != 0)
    return note("mount tmpfs");
  if (chdir("/tmp") != 0) return note("chdir");
  if (syscall(SYS_pivot_root, ".", ".") != 0) return note("pivot_root");
  if (umount2(".", MNT_DETACH) != 0) return note("umount old root");
  if (chdir("/") != 0) return note("chdir /");
  return true;
}

void lock_down() {
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) throw_errno("prctl(NO_NEW_PRIVS)");
  // No capabilities at all (matters when started as root, e.g. in tests).
  for (int c = 0; c <= CAP_LAST_CAP; ++c) prctl(PR_CAPBSET_DROP, c, 0, 0, 0);
  cap_t none = cap_init();
  if (!none || cap_set_proc(none) != 0) throw_errno("cap_set_proc");
  cap_free(none);

  // Unlisted syscalls fail with EPERM rather than killing the helper: a
  // libc path we did not foresee degrades one operation, it does not cut
  // the sandbox's network. Nothing listed opens files, executes, or traces.
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ERRNO(EPERM));
  if (!ctx) throw Error(Errc::internal, "seccomp_init failed");
  seccomp_attr_set(ctx, SCMP_FLTATR_CTL_TSYNC, 1);
  for (const char* name : {"read",
                           "write",
                           "readv",
                           "writev",
                           "pread64",
                           "recvfrom",
                           "sendto",
                           "recvmsg",
                           "sendmsg",
                           "recvmmsg",
                           "sendmmsg",
                           "poll",
                           "ppoll",
                           "select",
                           "pselect6",
                           "connect",
                           "bind",
                           "listen",
                           "accept",
                           "accept4",
                           "getsockopt",
                           "setsockopt",
                           "getsockname",
                           "getpeername",
                           "shutdown",
                           "close",
                           "fcntl",
                           "ioctl",
                           "clock_gettime",
                           "clock_nanosleep",
                           "nanosleep",
                           "gettimeofday",
                           "time",
                           "futex",
                           "brk",
                           "mmap",
                           "munmap",
                           "mremap",
                           "madvise",
                           "mprotect",
                           "rt_sigreturn",
                           "rt_sigprocmask",
                           "rt_sigaction",
                           "exit",
                           "exit_group",
                           "getpid",
                           "gettid",
                           "getrandom",
                           "sched_yield",
                           "restart_syscall",
                           "lseek",
                           "fstat",
                           "newfstatat",
                           "statx",
                           "uname",
                           "tgkill",
                           "set_robust_list",
                           "rseq",
                           "dup"}) {
    int nr = seccomp_syscall_resolve_name(name);
    if (nr == __NR_SCMP_ERROR) continue;  // not on this architecture
    seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 0);
  }
  // New sockets: only the internet families slirp needs for the guest's flows.
  for (int family : {AF_INET, AF_INET6})
    seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(socket), 1,
                     SCMP_A0(SCMP_CMP_EQ, static_cast<scmp_datum_t>(family)));
  int rc = seccomp_load(ctx);
  seccomp_release(ctx);
  if (rc != 0) throw Error(Errc::internal, "seccomp_load failed: " + std::string(strerror(-rc)));
}

}  // namespace airlock::net

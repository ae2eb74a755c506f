#include "guest/spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstring>
#include <memory>

#include "common/signals.h"

extern char** environ;

namespace airlock::guest {

int64_t monotonic_us() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
}

namespace {

struct ChildError {
  int stage;
  int err;
};

// What the child gets: the plan, and where it reports a failure before
// exec. With clone3 (shared memory) it writes `shared`; after fork it
// writes to the pipe `status_fd` (closed on exec: eof = success).
struct Child {
  const SpawnPlan* plan;
  SpawnTrace* trace;  // with clone3 only (shared memory)
  ChildError* shared;
  int status_fd;
  bool join_cgroup;      // fork path: write ourselves into cgroup.procs
  int null_rd, null_wr;  // the agent's /dev/null, or -1: the child opens it
};

// /dev/null for stdio the plan leaves unset, opened once by the agent (an
// open's path walk is ~0.1 ms of every exec under TCG), at 3 or above so
// that placing stdio onto 0-2 never overwrites it. -1 if it cannot be
// opened: the child then opens it itself and reports the failure.
int agent_null(int flags) {
  int fd = open("/dev/null", flags | O_CLOEXEC);
  if (fd >= 0 && fd < 3) {
    int high = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    close(fd);
    fd = high;
  }
  return fd;
}
int null_for_reading() {
  static const int fd = agent_null(O_RDONLY);
  return fd;
}
int null_for_writing() {
  static const int fd = agent_null(O_WRONLY);
  return fd;
}

int write_all(int fd, const char* s, size_t n) { return write(fd, s, n) == ssize_t(n) ? 0 : -1; }

[[noreturn]] void child_fail(const Child& c, SpawnStage stage) {
  ChildError ce{static_cast<int>(stage), errno};
  if (c.shared) {
    *c.shared = ce;
  } else {
    ssize_t r = write(c.status_fd, &ce, sizeof ce);
    (void)r;
  }
  _exit(127);
}

// execvp(argv[0], argv), with the search made cheap. environ is the plan's
// (set by the parent around the clone), so PATH is the exec's. execvp tries
// execve in each PATH directory until one works, and every failed execve
// builds a new address space and copies the environment into it before it
// looks for the file (slow under TCG), and `true` is in the fourth or sixth
// directory of the default PATH. access(X_OK) as the exec's user
// (the uid switch is done) finds the candidate without that; anything
// unusual (no PATH, a script without #!, the candidate failing after
// all) goes to execvp itself, so what runs and the errno are execvp's.
void exec_program(char* const* argv) {
  const char* file = argv[0];
  const char* path = getenv("PATH");
  if (!strchr(file, '/') && path && *path) {
    const size_t flen = strlen(file);
    char buf[4096];
    for (const char* dir = path;;) {
      const char* end = strchrnul(dir, ':');
      const size_t dlen = end - dir;
      if (dlen + 1 + flen < sizeof buf) {
        // An empty entry is the current directory, as for execvp.
        size_t n = 0;
        if (dlen == 0) buf[n++] = '.';
        memcpy(buf + n, dir, dlen);
        n += dlen;
        buf[n++] = '/';
        memcpy(buf + n, file, flen + 1);
        if (access(buf, X_OK) == 0) {
          execve(buf, argv, environ);
          break;  // execvp decides (ENOEXEC: the script case; or a later dir)
        }
      }
      if (*end == 0) break;
      dir = end + 1;
    }
  }
  execvp(file, argv);
}

// The child, between clone and exec: system calls only (with clone3 it runs
// in the agent's memory while the agent waits: it must not allocate, take
// a lock or change what the agent sees; the uid switches are raw system
// calls because glibc's wrappers coordinate the threads of the process).
[[noreturn]] void child_main(const Child& c) {
  const SpawnPlan& p = *c.plan;
  if (c.trace) c.trace->child = monotonic_us();
  // Dispositions: exec resets handled signals, not ignored ones (the agent
  // ignores SIGPIPE). Without CLONE_SIGHAND this is the child's own table.
  reset_signals();
  // Own session and process group: user code never shares the agent's,
  // and the group is the fallback tree kill.
  setsid();
  if (c.join_cgroup) {
    int fd = open(p.cgroup_procs, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write_all(fd, "0", 1) != 0) child_fail(c, SpawnStage::cgroup);
    close(fd);
  }
  // User code is the OOM killer's first choice, never the agent (-1000,
  // inherited).
  int adj = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
  if (adj >= 0) {
    write_all(adj, "0", 1);
    close(adj);
  }
  int null_in = p.in_fd >= 0     ? -1
                : c.null_rd >= 0 ? c.null_rd
                                 : open("/dev/null", O_RDONLY | O_CLOEXEC);
  int null_out = p.out_fd >= 0 && p.err_fd >= 0 ? -1
                 : c.null_wr >= 0               ? c.null_wr
                                                : open("/dev/null", O_WRONLY | O_CLOEXEC);
  // dup2 clears O_CLOEXEC on the copy; an fd already at its place keeps it,
  // so that case is dup3'ed through a spare number first.
  auto place = [&](int fd, int target) {
    if (fd == target) {
      int tmp = fcntl(fd, F_DUPFD_CLOEXEC, 3);
      if (tmp < 0) return false;
      fd = tmp;
    }
    return dup2(fd, target) == target;
  };
  if (!place(p.in_fd < 0 ? null_in : p.in_fd, 0) || !place(p.out_fd < 0 ? null_out : p.out_fd, 1) ||
      !place(p.err_fd < 0 ? null_out : p.err_fd, 2))
    child_fail(c, SpawnStage::io);
  // After setsid: the pty slave becomes this session's controlling
  // terminal, so its line discipline turns Ctrl-C/Ctrl-Z into signals to the
  // foreground job and a hangup to the session.
  if (p.pty && ioctl(0, TIOCSCTTY, 0) != 0) child_fail(c, SpawnStage::io);
  if (chdir(p.cwd) != 0) child_fail(c, SpawnStage::cwd);
  if (syscall(SYS_setgroups, p.ngroups, p.groups) != 0 && p.uid != 0)
    child_fail(c, SpawnStage::user);
  if (syscall(SYS_setgid, p.gid) != 0 || syscall(SYS_setuid, p.uid) != 0)
    child_fail(c, SpawnStage::user);
  if (p.cpu_seconds != RLIM_INFINITY) {
    rlimit rl{p.cpu_seconds, p.cpu_seconds + 1};
    setrlimit(RLIMIT_CPU, &rl);
  }
  if (c.trace) c.trace->setup = c.trace->exec = monotonic_us();
  exec_program(p.argv);
  child_fail(c, SpawnStage::exec);
}

#if defined(__x86_64__)
int child_entry(void* arg) { child_main(*static_cast<Child*>(arg)); }

// clone3 with the child on its own stack, running fn(arg) (which never
// returns). In C the child cannot simply return from the system call as
// after fork: with CLONE_VM it would pop and push on the stack the parent
// still uses. Returns the pid or -errno (parent only).
long clone3_run(clone_args* args, int (*fn)(void*), void* arg) {
  long ret;
  register void* r12 __asm__("r12") = reinterpret_cast<void*>(fn);
  register void* r13 __asm__("r13") = arg;
  __asm__ volatile(
      "syscall\n\t"
      "test %%rax, %%rax\n\t"
      "jnz 1f\n\t"
      // Child: a fresh stack (16-byte aligned), no frame to return to.
      "xor %%ebp, %%ebp\n\t"
      "mov %%r13, %%rdi\n\t"
      "call *%%r12\n\t"
      "mov %%eax, %%edi\n\t"
      "mov %[exit], %%eax\n\t"
      "syscall\n\t"
      "hlt\n"
      "1:\n\t"
      : "=a"(ret)
      : "a"(static_cast<long>(SYS_clone3)), "D"(args), "S"(sizeof *args), "r"(r12),
        "r"(r13), [exit] "i"(SYS_exit)
      : "rcx", "r11", "memory");
  return ret;
}
constexpr bool kHaveClone3 = true;
#else
long clone3_run(clone_args*, int (*)(void*), void*) { return -ENOSYS; }
constexpr bool kHaveClone3 = false;
#endif

// False once clone3 was refused with ENOSYS/EPERM (no need to ask again).
bool clone3_usable = kHaveClone3;

// The child's stack: execvp needs room for the path it builds and, for a
// script without #!, a copy of argv; glibc's posix_spawn sizes it the same
// way. Kept between spawns (the agent is single-threaded and waits).
char* child_stack(size_t argc, size_t& size) {
  static std::unique_ptr<char[]> stack;
  static size_t have = 0;
  size_t want = (argc + 2) * sizeof(char*) + 64 * 1024;
  want = (want + 4095) & ~size_t{4095};
  if (want > have) {
    stack.reset(new char[want]);
    have = want;
  }
  size = have;
  return stack.get();
}

// RAII: all signals blocked in the agent across the clone, so no handler
// runs in a child that shares its memory; restored after.
struct BlockSignals {
  sigset_t old;
  BlockSignals() {
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, &old);
  }
  ~BlockSignals() { sigprocmask(SIG_SETMASK, &old, nullptr); }
};

// Sets environ to the plan's for the child's execvp and back after.
struct SwapEnviron {
  char** saved;
  explicit SwapEnviron(char* const* envp) : saved(environ) { environ = const_cast<char**>(envp); }
  ~SwapEnviron() { environ = saved; }
};

// clone3 path. Returns false if the kernel refused clone3 itself (then
// the caller falls back to fork), with `r` untouched.
bool spawn_clone3(const SpawnPlan& plan, SpawnTrace* trace, SpawnResult& r) {
  size_t argc = 0;
  while (plan.argv[argc]) ++argc;
  size_t stack_size = 0;
  char* stack = child_stack(argc, stack_size);
  ChildError ce{0, 0};
  SpawnTrace local;
  Child c{&plan, trace ? trace : &local, &ce, -1, false, null_for_reading(), null_for_writing()};
  clone_args args{};
  args.flags = CLONE_VM | CLONE_VFORK;
  if (plan.cgroup_fd >= 0) {
    args.flags |= CLONE_INTO_CGROUP;
    args.cgroup = static_cast<uint64_t>(plan.cgroup_fd);
  }
  args.exit_signal = SIGCHLD;
  args.stack = reinterpret_cast<uint64_t>(stack);
  args.stack_size = stack_size;
  long pid;
  {
    BlockSignals block;
    SwapEnviron env(plan.envp);
    c.trace->clone = monotonic_us();
    pid = clone3_run(&args, child_entry, &c);
    c.trace->back = monotonic_us();
  }
  if (pid < 0) {
    // ENOSYS: no clone3 (or a seccomp filter that says so); EPERM: a filter
    // that forbids it; E2BIG/EINVAL: a kernel without CLONE_INTO_CGROUP.
    int e = static_cast<int>(-pid);
    if (e == ENOSYS || e == EPERM || e == E2BIG || e == EINVAL) {
      if (e == ENOSYS || e == EPERM) clone3_usable = false;
      if (plan.method == SpawnMethod::clone3) {
        r = {-1, SpawnStage::clone, e};
        return true;
      }
      return false;
    }
    // Anything else (EAGAIN, ENOMEM, a cgroup that cannot take the child:
    // EBUSY, EOPNOTSUPP) is the spawn's failure.
    r = {-1,
         plan.cgroup_fd >= 0 && (e == EBUSY || e == EOPNOTSUPP) ? SpawnStage::cgroup
                                                                : SpawnStage::clone,
         e};
    return true;
  }
  c.trace->method = "clone3";
  if (ce.stage != 0) {
    waitpid(static_cast<pid_t>(pid), nullptr, 0);
    r = {-1, static_cast<SpawnStage>(ce.stage), ce.err};
    return true;
  }
  r = {static_cast<pid_t>(pid), SpawnStage::none, 0};
  return true;
}

SpawnResult spawn_fork(const SpawnPlan& plan, SpawnTrace* trace) {
  int status[2];
  if (pipe2(status, O_CLOEXEC) != 0) return {-1, SpawnStage::clone, errno};
  if (trace) {
    trace->clone = monotonic_us();
    trace->method = "fork";
  }
  Child c{&plan,
          nullptr,
          nullptr,
          status[1],
          plan.cgroup_procs != nullptr,
          null_for_reading(),
          null_for_writing()};
  pid_t pid;
  {
    BlockSignals block;
    pid = fork();
    if (pid == 0) {
      environ = const_cast<char**>(plan.envp);  // our own copy of the agent
      child_main(c);
    }
  }
  int fork_errno = errno;
  close(status[1]);
  if (pid < 0) {
    close(status[0]);
    return {-1, SpawnStage::clone, fork_errno};
  }
  ChildError ce{};
  ssize_t n;
  do n = read(status[0], &ce, sizeof ce);
  while (n < 0 && errno == EINTR);
  close(status[0]);
  if (trace) trace->back = monotonic_us();
  if (n == sizeof ce) {
    waitpid(pid, nullptr, 0);
    return {-1, static_cast<SpawnStage>(ce.stage), ce.err};
  }
  return {pid, SpawnStage::none, 0};
}

}  // namespace

SpawnResult spawn_process(const SpawnPlan& plan, SpawnTrace* trace) {
  if (plan.method != SpawnMethod::fork && (clone3_usable || plan.method == SpawnMethod::clone3)) {
    SpawnResult r;
    if (spawn_clone3(plan, trace, r)) return r;
  }
  return spawn_fork(plan, trace);
}

}  // namespace airlock::guest

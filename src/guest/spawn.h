// Starting one exec's main process (exec_tree.cc) as cheaply as the guest
// allows. Under TCG every page-table copy, copy-on-write fault and cgroup
// migration is emulated; measured in a guest (bench/RESULTS.md):
// the agent's fork + join of the exec's cgroup + exec was the bulk of an
// exec of `true`. So, where the kernel has clone3 (5.3+; CLONE_INTO_CGROUP
// 5.7+):
//
//   * clone3(CLONE_VM | CLONE_VFORK): the child borrows the agent's memory
//     (no page tables copied, no copy-on-write faults in the agent after)
//     on a stack of its own until it execs; the agent waits meanwhile;
//   * CLONE_INTO_CGROUP: the child is born in the exec's cgroup, so every
//     process of the exec is in it from its first instruction and there is
//     no migration (no cgroup.procs write, no threadgroup lock).
//
// Otherwise (no clone3: old kernel, a seccomp filter answering ENOSYS as
// container runtimes do; not x86-64) a plain fork whose child writes itself
// into cgroup.procs, as before. Both report a failure before exec the same
// way (stage + errno), and both leave nothing behind on failure.
//
//   SpawnPlan plan;  plan.argv = ...; plan.envp = ...; plan.cgroup_fd = fd;
//   SpawnTrace t;
//   SpawnResult r = spawn_process(plan, &t);   // r.pid > 0, or r.stage/r.err
#pragma once

#include <sys/resource.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>

namespace airlock::guest {

// Where the child failed before exec.
enum class SpawnStage : int { none = 0, cgroup, io, cwd, user, exec, clone };

enum class SpawnMethod : int {
  automatic = 0,  // clone3 (VM + VFORK + INTO_CGROUP) where available, else fork
  clone3,         // only clone3: fails with stage clone if the kernel refuses it
  fork,           // fork + join of cgroup.procs (the fallback; tests force it)
};

// Everything the child does between clone and exec, prepared by the parent:
// the child only makes system calls (it may run in the parent's memory).
struct SpawnPlan {
  char* const* argv = nullptr;  // argv[0] is searched in envp's PATH (execvp)
  char* const* envp = nullptr;
  int in_fd = -1, out_fd = -1, err_fd = -1;  // -1: /dev/null
  bool pty = false;  // in_fd is a pty slave: it becomes the controlling terminal
  const char* cwd = "/";
  uid_t uid = 0;
  gid_t gid = 0;
  const gid_t* groups = nullptr;
  size_t ngroups = 0;
  rlim_t cpu_seconds = RLIM_INFINITY;  // RLIMIT_CPU (soft; hard one more)
  // The exec's cgroup: its directory (O_PATH) for CLONE_INTO_CGROUP and its
  // cgroup.procs for the fork path. Both unset: the child stays in ours.
  int cgroup_fd = -1;
  const char* cgroup_procs = nullptr;
  SpawnMethod method = SpawnMethod::automatic;
};

// Where the time went (CLOCK_MONOTONIC, µs), for the exec's phase trace.
// The child's stamps are only known with clone3 (it writes them into the
// agent's memory); with fork they stay 0.
struct SpawnTrace {
  int64_t clone = 0;        // the agent calls clone3/fork
  int64_t child = 0;        // the child runs
  int64_t setup = 0;        // the child is set up (session, oom score, stdio, cwd, user)
  int64_t exec = 0;         // the child calls execve
  int64_t back = 0;         // the agent runs again (the child exec'd or failed)
  const char* method = "";  // "clone3" or "fork"
};

struct SpawnResult {
  pid_t pid = -1;
  SpawnStage stage = SpawnStage::none;  // pid -1: where it failed
  int err = 0;                          // pid -1: errno
};

// Starts the process (it runs, or exec failed, when this returns). The
// child has: a new session, oom_score_adj 0, signals default and unblocked,
// stdio per the plan, the cwd, uid/gid/groups, RLIMIT_CPU. A child that
// failed before exec has been reaped. Every fd of the agent is O_CLOEXEC;
// the plan's fds are dup'ed onto 0-2.
SpawnResult spawn_process(const SpawnPlan& plan, SpawnTrace* trace = nullptr);

// CLOCK_MONOTONIC in µs.
int64_t monotonic_us();

}  // namespace airlock::guest

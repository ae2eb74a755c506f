// One exec's process tree inside the guest: its request fields parsed, its
// own cgroup v2 (with the exec's limits), the fork/exec of its main process,
// its timeout and CPU-time watch, killing the whole tree, and the typed
// outcome once the main process ended. Used by the streaming exec
// (exec.cc) and by background jobs (jobs.cc). Protocol: api/guest-protocol.md §5.
//
//   ExecSpec spec = parse_exec_spec(req);          // Error(invalid_argument, field) on bad input
//   ProcTree tree(server);
//   tree.spawn(spec, -1, out_w, err_w, [&](int status) { ...; });   // throws GuestError
//   tree.kill();                                   // SIGKILL to every process, setsid'ed ones too
//   nlohmann::json o = tree.outcome();             // {"exit_code","signal","reason",...}
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "guest/server.h"
#include "guest/spawn.h"
#include "guest/users.h"

namespace airlock::guest {

// The user of a request's "user" field (a name or uid; absent: root) as an
// exec runs as it: its passwd entry, uid 0 without one homed at /root. The
// one answer to "whose home": an exec's $HOME and the host's "~" (op
// "user", which envd resolves paths with) both come from here.
// GuestError not_found for an unknown name.
User parse_user(const nlohmann::json& req);

// Per-stream output cap when the request gives none (64 MiB).
inline constexpr uint64_t kDefaultOutputLimit = 64ull << 20;

// Optional resource limits of one exec; 0 = not limited.
struct ExecLimits {
  int64_t pids = 0;        // pids.max of the exec's cgroup (1 .. 1048576)
  int64_t memory_mb = 0;   // memory.max (swap 0) of the exec's cgroup (1 .. 1048576)
  double cpu_seconds = 0;  // CPU time of the whole tree (0.01 .. 31536000)
};

inline constexpr uint64_t kDefaultOutputBuffer = 1 << 20;
inline constexpr int64_t kDefaultDetachedStdinMs = 10 * 60 * 1000;

struct ExecSpec {
  std::vector<std::string> argv;
  User user;
  std::vector<std::string> env;  // "K=V"
  std::string cwd;
  bool want_stdin = false;
  int64_t timeout_ms = 0;
  ExecLimits limits;
  uint64_t output_limit = kDefaultOutputLimit;  // per stream, bytes
  bool background = false;
  // The host's name for the exec (optional). A foreground exec with one
  // can detach and be attached again (output_log.h).
  std::string exec_id;
  // Bytes of output a foreground exec keeps for re-attachment (its log).
  uint64_t output_buffer = kDefaultOutputBuffer;
  // With want_stdin: how long a detached exec keeps its stdin open while
  // no host attaches or feeds it (then the process reads eof). 0 = closed
  // at once on detach.
  int64_t detached_stdin_ms = kDefaultDetachedStdinMs;
  // A terminal instead of pipes ("pty": {"cols","rows"}): stdin, stdout and
  // stderr are the slave of a fresh pty, which becomes the controlling
  // terminal of the exec's session. Without argv, the user's shell runs (-l).
  bool pty = false;
  uint16_t cols = 80, rows = 24;
};

// The value of `key` in the cgroup file `file` ("key value" lines), read
// relative to the directory open as `dir_fd` (AT_FDCWD: `file` is a path);
// 0 if it cannot be read or has no such key.
uint64_t cgroup_key(int dir_fd, const std::string& file, const std::string& key);

// Parses {"cols": 1..4096, "rows": 1..4096} (`what` names the field in errors).
void parse_winsize(const nlohmann::json& j, const std::string& what, uint16_t& cols,
                   uint16_t& rows);

// Parses an exec request. Throws Error(invalid_argument, message, field)
// (field e.g. "limits.pids") or GuestError(not_found) for an unknown user.
ExecSpec parse_exec_spec(const nlohmann::json& req);

class ProcTree {
 public:
  explicit ProcTree(Server& server);
  // Kills whatever is left of the tree and releases the cgroup (removed
  // now, or by the server once its last process is gone).
  ~ProcTree();
  ProcTree(const ProcTree&) = delete;
  ProcTree& operator=(const ProcTree&) = delete;

  // Takes a fresh cgroup (Server::take_cgroup) and sets `spec.limits` on it,
  // starts the child in it (spawn.h: clone3 into the cgroup, or fork + join)
  // in a new session, sets stdio (fd -1 = /dev/null), cwd, user and
  // execs (with spec.pty, in_fd is the pty slave and becomes the session's
  // controlling terminal). Arms the timeout and CPU watch. `on_exit` runs (from the server
  // loop) when the main process is reaped. Throws GuestError naming the
  // step that failed (no such binary, bad cwd, ...); nothing is left then.
  void spawn(const ExecSpec& spec, int in_fd, int out_fd, int err_fd,
             std::function<void(int status)> on_exit);

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }
  // Signals every process of the tree. `from_host` marks a kill_exec /
  // client-gone signal, so the outcome says "killed".
  void signal(int signo, bool from_host);
  // SIGKILL to every process of the tree (cgroup.kill; without a cgroup the
  // process group, which setsid'ed processes escape).
  void kill();
  // True if the cgroup (or, without one, the process group) has no process.
  bool empty() const;

  // After on_exit: {"exit_code","signal","reason","timed_out","duration_ms"}.
  // reason: killed | cpu_limit | oom_killed | pids_limit | timeout |
  // no_space | signaled | exited (first that applies, in this order: what
  // the agent itself did to the tree comes before the no_space heuristic).
  nlohmann::json outcome() const;
  // Where the exec's time went, phase by phase in µs from `received_us`
  // (monotonic_us() at the request) to `now_us`: {"method", "prepare",
  // "spawn", "run", "finish"} and, with clone3, "clone", "setup", "exec"
  // (the parts of "spawn"; spawn.h).
  nlohmann::json spawn_trace(int64_t received_us, int64_t now_us) const;

 private:
  // The exec's cgroup with its limits set (none on a host without cgroup v2,
  // where pids and memory limits are refused). Throws; nothing left on error.
  void make_cgroup();
  // A timerfd watched by the server, calling `fn` after `first_ms` and then
  // every `every_ms` (0: once); fd stays -1 if it cannot be made.
  void arm_timer(int& fd, int64_t first_ms, int64_t every_ms, std::function<void()> fn);
  void on_timeout();
  void on_cpu_tick();
  uint64_t cgroup_value(const std::string& file, const std::string& key) const;
  // The same from an fd opened ahead (pread from 0); -1: by file name.
  uint64_t cgroup_value(int fd, const std::string& file, const std::string& key) const;
  void release();

  Server& server_;
  std::string cgroup_;
  pid_t pid_ = -1;   // while the main process runs
  pid_t pgid_ = -1;  // the session / process group (fallback tree kill)
  ExecCgroup cg_;    // its fds (cg_.path is cgroup_ until release)
  int timer_fd_ = -1, cpu_fd_ = -1;
  ExecLimits limits_;
  std::string cwd_;
  bool exited_ = false, timed_out_ = false, cpu_killed_ = false, host_signaled_ = false;
  bool no_space_ = false;
  int status_ = 0;
  std::chrono::steady_clock::time_point start_, end_;
  struct {
    SpawnTrace spawn;
    int64_t prepared = 0, reaped = 0;
  } trace_;
};

}  // namespace airlock::guest

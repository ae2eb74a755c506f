// The engine's public types: a sandbox's spec, info and state, an exec's
// request, result and status, and the callbacks of streaming calls. What
// the registry, the daemon, E2B and MCP speak; engine.h is the facade that
// takes and returns them. Their JSON forms are in types_json.h, their bounds
// in limits.h.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace airlock::engine {

// The sandbox state machine (docs/design.md, "State and lifecycle";
// transitions in sandbox.cc). pausing/paused: pause() and resume();
// snapshotting: snapshot() and fork() (engine_pause.cc, engine_snapshots.cc).
enum class State {
  starting,
  running,
  pausing,
  paused,
  snapshotting,
  stopping,
  deleted,
  timed_out,
  failed
};
const char* to_string(State state);
// Whether a sandbox in `state` holds host resources: a VM, its saved memory
// or its disk (every state but the three terminal ones; a paused sandbox
// keeps its disk and its saved RAM, and gets its memory back on resume).
// The one answer for quotas, the streams that follow a live sandbox
// (network events, journal) and anything else that asks "still there?";
// defined with the states' names in types_json.cc.
bool holds_resources(State state);

struct SandboxSpec {
  std::string image = "minimal";
  int cpus = 1;         // 1 .. 16
  int memory_mb = 256;  // 64 .. 65536
  int disk_mb = 1024;   // >= image size, <= 1048576
  int timeout_s = 600;  // life; 1 .. 604800
  // Destroyed (timed_out, "idle for N s") after this long with no exec
  // running and no call on it; 0 = never, else 1 .. 604800.
  int idle_timeout_s = 0;
  std::map<std::string, std::string> env;       // defaults for every exec
  std::map<std::string, std::string> metadata;  // free-form labels, list filter
  // Egress policy {"mode": "none"|"allowlist"|"open", "allow": [...], "deny": [...]},
  // grammar in src/engine/net/policy.h. "none" (the default): no NIC at all.
  nlohmann::json network = {{"mode", "none"}};
  // A snapshot to start from (create --from; engine_snapshots.cc): its disk
  // (and, for a memory snapshot, its running VM, cpus and memory_mb) instead
  // of the image's; image is then the snapshot's. Persisted: a snapshot used
  // by a live sandbox cannot be deleted.
  std::string from;
  // What idle_timeout does: "destroy" (timed_out) or "pause".
  std::string on_idle = "destroy";
  // The tenant that owns it ("" = the operator's, created over the unix
  // socket); set by the daemon from the request's credentials, never by the
  // request body. Persisted; shown as "tenant" when not empty.
  std::string tenant;
};

struct SandboxInfo {
  std::string id;
  SandboxSpec spec;
  State state = State::starting;
  std::string reason;  // why it is failed/timed_out/deleted, if it is
  // Typed cause of a `failed` sandbox (empty otherwise): guest_panic (kernel
  // panic/reset on the console), vmm_died (QEMU exited or was killed),
  // agent_lost (channel closed or agent unresponsive while QEMU runs), oom
  // (QEMU's cgroup hit its memory limit), net_helper_died. `reason` has the
  // details; a create that never booted is failed with "boot_failed".
  std::string failure;
  std::string accel;  // "kvm" | "tcg"
  std::string start;  // how it started: "pool" | "clone" | "boot"
  int64_t created_at_ms = 0;
  int64_t expires_at_ms = 0;
  int64_t boot_ms = 0;  // create call -> agent ready
  int pid = 0;          // QEMU's pid while running
};
nlohmann::json to_json(const SandboxInfo& info);

struct ExecRequest {
  std::vector<std::string> argv;  // either argv ...
  std::string cmd;                // ... or a shell string (run with /bin/sh -c)
  std::map<std::string, std::string> env;
  std::string cwd;                        // default "/"
  std::string user;                       // name or numeric uid; default root
  std::optional<std::string> stdin_data;  // bytes fed to stdin, then EOF
  // Keep stdin open and feed it with write_stdin() while exec() streams the
  // output, or, with background, while the job runs (exclusive with stdin_data).
  bool stdin_stream = false;
  double timeout_s = 0;  // 0 = none (the sandbox's life still applies)
  // Limits of this exec's own cgroup in the guest; 0 = not limited.
  struct Limits {
    int pids = 0;            // 1 .. 1048576 processes/threads
    int memory_mb = 0;       // 1 .. 1048576 (no swap)
    double cpu_seconds = 0;  // 0.01 .. 31536000, CPU time of the whole tree
  } limits;
  // Per stream (stdout, stderr): beyond it the guest drops and counts output.
  uint64_t output_limit_bytes = 64ull << 20;  // 0 .. 2^40
  // Start and return at once (exec_background()); listed by list_execs(),
  // waited on by wait_exec(); its tree lives until killed or the sandbox ends.
  bool background = false;
  // A terminal: the process's stdin, stdout and stderr are a fresh pty in
  // the guest, its controlling terminal, of this size (all output arrives
  // on channel 1). Without argv and cmd the user's login shell runs, in the
  // user's home unless cwd is given. While exec() runs, pty_input() and
  // pty_resize() feed it and kill_exec() signals it. No stdin_data.
  struct Pty {
    int cols = 80, rows = 24;  // 1 .. 4096 each
  };
  std::optional<Pty> pty;
};

struct ExecResult {
  std::string exec_id;
  std::optional<int> exit_code;  // set if it exited
  std::optional<int> signal;     // set if a signal ended it
  bool timed_out = false;
  int64_t duration_ms = 0;
  // stdout/stderr_bytes: produced by the process (delivered + dropped).
  uint64_t stdin_bytes = 0, stdout_bytes = 0, stderr_bytes = 0;
  // How it ended: exited | signaled | timeout | killed (kill_exec, client
  // gone) | pids_limit | oom_killed | cpu_limit | no_space.
  std::string reason;
  bool truncated = false;  // output beyond output_limit_bytes was dropped
  uint64_t stdout_dropped = 0, stderr_dropped = 0;
};
nlohmann::json to_json(const ExecResult& result);

// A background exec as the guest reports it.
struct ExecStatus {
  std::string exec_id;
  std::vector<std::string> argv;
  int pid = 0;
  bool running = true;
  int64_t started_at_ms = 0;
  ExecResult result;  // exit_code, signal, reason, duration_ms once !running
};
nlohmann::json to_json(const ExecStatus& status);

struct ExecCallbacks {
  // Called once the process runs.
  std::function<void(const std::string& exec_id, int pid)> on_start;
  // Called for every chunk of output, in order; channel 1 = stdout, 2 = stderr.
  // Returning false kills the process (e.g. the client went away).
  std::function<bool(int channel, std::string_view bytes)> on_output;
};

// attach_exec(): a foreground exec resumed from an offset of its output.
struct AttachCallbacks {
  // Before any output: {"offset": the first byte that follows (>= the one
  // asked for), "dropped": bytes between the two the guest no longer holds,
  // "end": bytes produced so far, "running", "lost": bytes the guest
  // evicted before anyone read them, "pid"?}.
  std::function<void(const nlohmann::json& attached)> on_attached;
  // Output from that offset, stdout (1) and stderr (2) in the order
  // produced. Returning false detaches: the exec keeps running.
  std::function<bool(int channel, std::string_view bytes)> on_output;
  // Asked about every 500 ms while nothing arrives; true detaches.
  std::function<bool()> cancelled;
};

// What Engine::write_stdin() sent.
struct StdinWrite {
  uint64_t bytes = 0;   // by this call
  uint64_t total = 0;   // by every call so far
  bool closed = false;  // stdin is closed (eof sent)
};

// Next chunk of an upload; std::nullopt = end.
using ChunkSource = std::function<std::optional<std::string>()>;
// Receives a download chunk by chunk; returning false aborts.
using ChunkSink = std::function<bool(std::string_view)>;

// A file watch (watch_files): what the guest saw, as checked by the host.
struct WatchCallbacks {
  // The watch is in place: {"path", "dirs"} (directories watched).
  std::function<void(const nlohmann::json& watching)> on_start;
  // {"type": "created"|"modified"|"deleted"|"renamed", "path", "is_dir",
  // "old_path"?} or {"type": "overflow", "dropped"}. false = stop.
  std::function<bool(const nlohmann::json& event)> on_event;
  // About every 500 ms without an event; false = stop (the consumer left).
  std::function<bool()> on_idle;
};
struct WatchEnd {
  // cancelled (a callback returned false) | path_deleted | path_moved |
  // unmounted | watch_limit (a new subdirectory over the cap) |
  // sandbox_stopped (deleted, timed out, failed) | ended (guest gave none)
  std::string reason;
  std::string message;
  uint64_t events = 0;   // events the guest sent
  uint64_t dropped = 0;  // events the guest's bounded queue dropped
};

}  // namespace airlock::engine

// The typed guest client: one function per guest operation of
// api/guest-protocol.md §5, with its request and its reply as structs, over a
// GuestChannel (the transport). This file and guest_client.cc are the only
// host code outside the transport that knows a guest JSON field name: every
// request is built and every reply decoded here, once.
//
//   channel::Job job = channel::wait_job(*sb->channel, "ex-1", 5000, deadline);
//   if (!job.running) use(job.outcome.exit_code);
//
// Replies come from a guest that may be hostile. Each decoder checks types
// and bounds (string lengths, counts, integer ranges) and either
//  * throws GuestReplyError (an Error(guest_error) naming the field) for a
//    field the caller cannot do without (a job's exec_id, the entries of a
//    list, a user's home), or
//  * takes an optional field that is missing, ill-typed or out of range as
//    absent (its default): an older agent sends fewer fields, and exit
//    statuses, byte counts and timings are only reported, never acted on.
// Errors the guest itself answers ({"error":...}) and a lost connection are
// thrown by the channel as a plain airlock::Error (the code of
// protocol::errc_from_guest_code, or guest_error): the operation failed.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/channel/guest_channel.h"

namespace airlock::channel {

// The guest answered, and did what it was asked as far as the host can
// tell, but its reply is unusable (a field the caller needs is missing,
// ill-typed or out of bounds). Callers tell it from a failed operation: the
// journal records a guest-side effect that did happen (a move, a kill), and
// no sandbox-state check applies (the guest was there to answer).
class GuestReplyError : public Error {
 public:
  explicit GuestReplyError(const std::string& message) : Error(Errc::guest_error, message) {}
};

// ---- exec (foreground and background) ------------------------------------

struct PtySize {
  int cols = 80, rows = 24;
};

// The fields of one guest exec request (§5 exec). Optional ones are sent
// only when set, so the guest's defaults apply.
struct ExecParams {
  std::vector<std::string> argv;  // empty: the user's login shell (a pty exec)
  std::map<std::string, std::string> env;
  std::optional<std::string> cwd;  // unset: the user's home
  std::optional<PtySize> pty;
  std::string user;        // empty: root
  int64_t timeout_ms = 0;  // 0: none
  int64_t limit_pids = 0;  // 0: none (limits.pids)
  int64_t limit_memory_mb = 0;
  double limit_cpu_seconds = 0;
  std::optional<uint64_t> output_limit_bytes;
  std::string exec_id;                          // empty: the guest names it
  std::optional<uint64_t> output_buffer_bytes;  // the detached exec's log
  // Streamed stdin: the process's stdin stays open, fed by
  // GuestChannel::write_stdin (foreground) or job_stdin (background).
  bool stdin_stream = false;
};

// How an exec ended, as the guest reports it (an exec response, a job that
// ended, the end an attach delivers). Every field is optional on the wire.
struct ExecOutcome {
  std::optional<int> exit_code;  // absent: killed by a signal (or not reported)
  std::optional<int> signal;
  bool timed_out = false;
  // One of kExecReasons: the guest's if it is one of them, else derived
  // from timed_out and signal ("timeout", "signaled", "exited").
  std::string reason = "exited";
  std::optional<int64_t> duration_ms;  // >= 0
  uint64_t stdout_bytes = 0, stderr_bytes = 0, stdin_bytes = 0;
  uint64_t stdout_dropped = 0, stderr_dropped = 0;
  uint64_t output_end = 0, output_lost = 0;  // an attach's end: the log's figures
  // The agent's own timings in µs (logged for the benchmark, trusted for nothing).
  uint64_t agent_us = 0, run_us = 0;
  // The agent's spawn phases (kSpawnPhases), each 0 unless the guest sent it.
  std::map<std::string, uint64_t> spawn_us;
};
inline constexpr const char* kSpawnPhases[] = {"prepare", "clone", "setup",
                                               "exec",    "run",   "finish"};
inline constexpr const char* kExecReasons[] = {"exited",     "signaled",   "timeout",   "killed",
                                               "pids_limit", "oom_killed", "cpu_limit", "no_space"};

// Runs a foreground exec on `stream` (GuestChannel::exec) and decodes its end.
ExecOutcome run_exec(GuestChannel& ch, uint32_t stream, const ExecParams& params,
                     const ChunkSource& stdin_source, const ExecHandlers& handlers,
                     std::optional<Deadline> deadline = {});

// A background exec (a guest job) as `exec`, `jobs`, `wait_job` report it.
struct Job {
  std::string exec_id;            // 1..64 bytes (else GuestReplyError)
  std::vector<std::string> argv;  // its strings, at most 4096 entries read
  int pid = 0;
  int64_t started_at_ms = 0;
  bool running = false;
  ExecOutcome outcome;  // once !running
};
// Starts `params` in the background (`exec` with "background": true);
// GuestReplyError unless the guest names the job params.exec_id (if set).
Job start_background(GuestChannel& ch, const ExecParams& params, Deadline deadline);
// The guest's jobs, oldest first; at most kMaxJobs are decoded.
std::vector<Job> jobs(GuestChannel& ch, Deadline deadline);
inline constexpr size_t kMaxJobs = 1024;
// The job once it ended, or as it is after timeout_ms.
Job wait_job(GuestChannel& ch, const std::string& exec_id, int64_t timeout_ms, Deadline deadline);

// kill_job's answer: for a detached foreground exec nobody is attached to,
// `collect` is true and `end` is where its output log ends (GuestReplyError
// if it is there but not a byte offset).
struct KillReply {
  bool collect = false;
  uint64_t end = 0;
};
KillReply kill_job(GuestChannel& ch, const std::string& exec_id, int signal, Deadline deadline);

// job_stdin's answer (this batch, all batches so far, whether it is closed).
struct JobStdinReply {
  uint64_t bytes = 0, total = 0;
  bool closed = false;
};
JobStdinReply job_stdin(GuestChannel& ch, const std::string& exec_id, const ChunkSource& source,
                        bool close, Deadline deadline);

// ---- attach ----------------------------------------------------------------

// The guest's `attached` event, as the channel checked it.
struct Attached {
  uint64_t offset = 0;   // the first byte that will come
  uint64_t dropped = 0;  // bytes before it the guest no longer holds
  uint64_t end = 0;      // where the log ended when the attach began (>= offset)
  nlohmann::json event;  // the checked event itself, for the API's attached event
};
struct AttachClientHandlers {
  std::function<void(const Attached&)> on_attached;
  std::function<bool(int channel, std::string_view bytes)> on_output;
  std::function<bool()> cancelled;
  std::function<void(uint32_t stream)> on_stream;
};
struct AttachReply {
  bool detached = false;  // the caller detached again: no outcome
  ExecOutcome outcome;
};
AttachReply attach(GuestChannel& ch, const std::string& exec_id, uint64_t offset,
                   const AttachClientHandlers& handlers, Deadline start_deadline);

// ---- files -----------------------------------------------------------------

// A file entry of list, stat and move, checked and rebuilt from its known
// fields (file_entry.h) into the host's JSON form.
struct ListReply {
  std::vector<nlohmann::json> entries;
  bool truncated = false;  // more follow: ask again with offset += entries
};
ListReply list(GuestChannel& ch, const std::string& path, int depth, uint64_t offset,
               Deadline deadline);
nlohmann::json stat(GuestChannel& ch, const std::string& path, Deadline deadline);
// `owner` (empty: root) owns what the call creates.
nlohmann::json move(GuestChannel& ch, const std::string& path, const std::string& dest,
                    bool parents, const std::string& owner, Deadline deadline);
void mkdir(GuestChannel& ch, const std::string& path, bool parents, const std::string& owner,
           Deadline deadline);
void remove(GuestChannel& ch, const std::string& path, bool recursive, Deadline deadline);

// The home directory of `user` (empty: root): absolute, at most 4096 bytes,
// no NUL (else GuestReplyError).
std::string user_home(GuestChannel& ch, const std::string& user, Deadline deadline);

// ---- watch -----------------------------------------------------------------

struct WatchReply {
  std::string reason = "ended";  // "cancelled" when the host stopped it
  std::string message;
  uint64_t events = 0, dropped = 0;
};
WatchReply watch(GuestChannel& ch, const std::string& path, bool recursive,
                 const WatchHandlers& handlers, Deadline start_deadline);

// ---- the machine -----------------------------------------------------------

// The guest's facts (kernel, uptime, memory, disk, watch counts): a JSON
// object the API passes on as it is (GuestInfo, additionalProperties).
nlohmann::json info(GuestChannel& ch, Deadline deadline);
// sync(2) and an ext4 journal checkpoint in the guest.
void sync(GuestChannel& ch, Deadline deadline);
void ping(GuestChannel& ch, Deadline deadline);

// The network of a VM with a NIC, sent in its hello (HelloParams::network).
struct HelloNetwork {
  std::string address, gateway, dns, address6, gateway6, mac;
};
nlohmann::json hello_network_json(const HelloNetwork& n);

// ---- decoders (exposed for their tests) ----------------------------------

ExecOutcome decode_outcome(const nlohmann::json& reply);
Job decode_job(const nlohmann::json& job);
nlohmann::json exec_request(const ExecParams& params);

}  // namespace airlock::channel

// Background execs ("background": true, api/guest-protocol.md §5): started
// with stdout/stderr on /dev/null and stdin on /dev/null or, with
// "stdin": true, on a pipe fed by job_stdin streams, answered at once, then kept in the
// server's job table until the sandbox ends. They survive a new hello (the
// host reconnecting); a job's process tree is NOT killed when its main
// process ends (that is what background is for), only by kill_job, its
// timeout or limits, or the VM going away.
//
//   {"op":"exec","argv":[...],"background":true,"exec_id":"ex-1"}  ->
//   {"exec_id","pid","running":true,...}
//   {"op":"jobs"}                                   -> {"jobs":[{...}, ...]}
//   {"op":"wait_job","exec_id":"ex-1","timeout_ms":5000} -> the job (when it ended or at the
//   timeout)
//   {"op":"kill_job","exec_id":"ex-1","signal":9}   -> the job
//   {"op":"job_stdin","exec_id":"ex-1","close":false} + data + eof
//       -> {"stdin_bytes","stdin_total","stdin_closed"}  (a job started with
//          "stdin": true keeps its stdin pipe open between these)
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "guest/server.h"

namespace airlock::guest {

struct ExecSpec;
class ProcTree;

class Jobs {
 public:
  // At most this many jobs are kept; the oldest finished one makes room.
  static constexpr size_t kMaxJobs = 128;

  explicit Jobs(Server& server);
  ~Jobs();  // kills every job's tree

  // Starts `spec` in the background; returns the job's JSON. Throws
  // GuestError(exists) for a duplicate exec_id, GuestError(internal) when
  // kMaxJobs are all still running, or what ProcTree::spawn throws.
  nlohmann::json start(const ExecSpec& spec);
  // {"jobs": [job, ...]} oldest first.
  nlohmann::json list() const;
  // A stream that answers with the job once it ends (or after timeout_ms;
  // 0 = answer now). Returns nullptr if it already answered.
  std::unique_ptr<Stream> wait(uint32_t stream, const nlohmann::json& req);
  // Signals the job's tree (9 = kill it all); returns the job.
  nlohmann::json kill(const nlohmann::json& req);
  // A job_stdin stream: its data goes into the job's stdin pipe under
  // credit (granted as written), its eof ends the batch (closing the pipe
  // if "close"). GuestError(not_found) for an unknown job, (exists) if the
  // job has no open stdin or another job_stdin is running on it.
  std::unique_ptr<Stream> write_stdin(uint32_t stream, const nlohmann::json& req);

 private:
  struct Job;
  class Waiter;
  class StdinWriter;
  void drop(Job& job);  // before a job is forgotten
  Job& find(const nlohmann::json& req);
  nlohmann::json to_json(const Job& job) const;
  void on_exit(Job& job);

  Server& server_;
  uint64_t serial_ = 0;
  std::vector<std::unique_ptr<Job>> jobs_;  // in start order
};

}  // namespace airlock::guest

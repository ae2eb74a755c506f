// Execs on running sandboxes: foreground (streamed to the caller, hashed on
// the host as it passes), background (the guest's jobs), attach to an exec
// that outlived its client, streamed stdin, terminal input and size, kill,
// list and wait. Each call runs on the caller's thread through the typed
// guest client (channel/guest_client.h) over the sandbox's GuestChannel and
// is journaled.
//
// The service holds no state of its own: an exec's stream, stdin pipe and
// attach live in its Sandbox (sandbox.h), found through the SandboxTable.
// The engine's facade (engine.h: exec, exec_background, attach_exec, ...)
// delegates here.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/api/types.h"
#include "engine/audit/journal.h"
#include "engine/engine_metrics.h"
#include "engine/sandbox/table.h"

namespace airlock::engine::exec {

struct Options {
  // Output a detached exec keeps in the guest for attach (Config).
  uint64_t buffer_bytes = 1ull << 20;
};

class ExecService {
 public:
  ExecService(SandboxTable& table, AuditJournal& journal, EngineMetrics& metrics, Options opts)
      : table_(table), journal_(journal), metrics_(metrics), opts_(opts) {}
  ExecService(const ExecService&) = delete;
  ExecService& operator=(const ExecService&) = delete;

  // Engine::exec / exec_background: counted by outcome and timed for GET
  // /metrics.
  ExecResult run(const std::string& id, const ExecRequest& request, const ExecCallbacks& callbacks);
  ExecStatus start_background(const std::string& id, const ExecRequest& request);
  void kill(const std::string& id, const std::string& exec_id, int signal);
  std::vector<ExecStatus> list(const std::string& id);
  ExecStatus wait(const std::string& id, const std::string& exec_id, double timeout_s);
  // Engine::attach_exec (attach.cc).
  std::optional<ExecResult> attach_exec(const std::string& id, const std::string& exec_id,
                                        uint64_t offset, const AttachCallbacks& callbacks);
  // Engine::write_stdin (stdin.cc).
  StdinWrite write_stdin(const std::string& id, const std::string& exec_id,
                         const ChunkSource& source, bool eof,
                         const std::function<bool()>& cancelled);
  // Engine::pty_input / pty_resize (pty.cc).
  void pty_input(const std::string& id, const std::string& exec_id, std::string_view bytes);
  void pty_resize(const std::string& id, const std::string& exec_id, int cols, int rows);

 private:
  ExecResult run_foreground(const std::string& id, const ExecRequest& given,
                            const ExecCallbacks& callbacks);
  ExecStatus run_background(const std::string& id, const ExecRequest& given);
  // Runs `run`, counting its outcome and time in the metrics (service.cc).
  template <class Run, class Outcome>
  auto counted(const char* kind, Run&& run, Outcome&& outcome);
  // After a detached exec (nobody attached) was signalled, attaches from
  // `end` (its output so far) and waits up to kKillCollect for its end, so
  // its `exec` record is written as an attach writes it. Not ending in time
  // (a handled signal), or another client attaching meanwhile, is not an
  // error (attach.cc).
  void collect_detached_end(const std::string& id, const std::string& exec_id, uint64_t end);

  SandboxTable& table_;
  AuditJournal& journal_;
  EngineMetrics& metrics_;
  const Options opts_;
};

}  // namespace airlock::engine::exec

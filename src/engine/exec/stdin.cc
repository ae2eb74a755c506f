// Streamed stdin of a running exec (ExecService::write_stdin): the bytes go to the
// guest in data frames within its credit window (GuestChannel::write_stdin),
// so memory stays bounded whatever the size and however slowly the process
// reads.
#include "common/error.h"
#include "engine/channel/guest_client.h"
#include "engine/exec/service.h"

namespace airlock::engine::exec {

namespace {

// A background exec: the guest's job holds the pipe (and so survives a
// daemon restart); it alone knows whether the stdin is open, and refuses a
// second concurrent writer.
StdinWrite write_job_stdin(Sandbox& sb, const std::string& exec_id, const ChunkSource& source,
                           bool eof) {
  // The process may not read for a long time; the sandbox's life bounds it.
  int64_t left_ms = std::max<int64_t>(sb.expires_steady_ms.load() - steady_ms(), 1000);
  auto deadline = channel::Clock::now() + std::chrono::milliseconds(left_ms);
  channel::JobStdinReply r;
  try {
    r = channel::job_stdin(*sb.channel, exec_id, source, eof, deadline);
  } catch (const Error& e) {
    if (e.code() == Errc::not_found)
      throw Error(Errc::not_found, "no exec " + exec_id + " in sandbox " + sb.rec.info.id,
                  "exec_id");
    if (e.code() == Errc::conflict) throw Error(Errc::conflict, e.what(), "exec_id");
    throw;
  }
  return StdinWrite{.bytes = r.bytes, .total = r.total, .closed = r.closed};
}

}  // namespace

StdinWrite ExecService::write_stdin(const std::string& id, const std::string& exec_id,
                                    const ChunkSource& source, bool eof,
                                    const std::function<bool()>& cancelled) {
  auto sb = table_.running(id);
  ActivityGuard active(*sb);
  std::shared_ptr<StdinPipe> pipe;
  bool running = false;
  {
    std::lock_guard lock(sb->mu);
    if (auto it = sb->stdin_pipes.find(exec_id); it != sb->stdin_pipes.end()) pipe = it->second;
    running = sb->execs.count(exec_id) > 0;
  }
  if (!pipe && running)
    throw Error(Errc::conflict,
                "exec " + exec_id + " was not started with stdin_stream; its stdin is not open",
                "exec_id");
  if (!pipe) return write_job_stdin(*sb, exec_id, source, eof);
  std::lock_guard writing(pipe->mu);
  auto closed_error = [&] {
    return Error(Errc::conflict,
                 "the stdin of exec " + exec_id + " is closed" +
                     (pipe->ended ? " (the exec has ended)" : " (eof was sent)"),
                 "exec_id");
  };
  if (pipe->closed || pipe->ended) throw closed_error();
  StdinWrite w;
  // Counted as each chunk is handed over, so a write cut short by the exec
  // ending still shows in the total of the exec's result.
  std::optional<std::string> held;
  auto counting = [&]() -> std::optional<std::string> {
    if (held) {
      w.bytes += held->size();
      pipe->total += held->size();
    }
    held = source();
    return held;
  };
  try {
    // Returns once the guest has the bytes: a daemon killed right after
    // the answer loses none the client was told are in (test_reattach).
    sb->channel->write_stdin(pipe->stream, counting, eof, cancelled);
  } catch (const Error& e) {
    if (e.code() == Errc::conflict) {
      pipe->ended = true;
      throw closed_error();
    }
    throw;
  }
  if (eof) pipe->closed = true;
  w.total = pipe->total;
  w.closed = pipe->closed;
  return w;
}

}  // namespace airlock::engine::exec

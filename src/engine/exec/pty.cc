// Terminal input and window size of a running pty exec (engine.h
// ExecRequest::pty). The exec itself runs in Engine::exec on its caller's
// thread; these are called from another thread (the daemon's websocket
// reader) and find its guest stream by exec id.
#include "common/error.h"
#include "engine/exec/service.h"
#include "engine/validate.h"

namespace airlock::engine::exec {

namespace {

uint32_t pty_stream(Sandbox& sb, const std::string& id, const std::string& exec_id) {
  std::lock_guard lock(sb.mu);
  auto it = sb.execs.find(exec_id);
  if (it != sb.execs.end()) return it->second;
  // A pty exec of a previous daemon, attached again (attach_exec).
  it = sb.attached_streams.find(exec_id);
  if (it != sb.attached_streams.end()) return it->second;
  throw Error(Errc::not_found, "no running exec " + exec_id + " in sandbox " + id, "exec_id");
}

}  // namespace

void ExecService::pty_input(const std::string& id, const std::string& exec_id,
                            std::string_view bytes) {
  auto sb = table_.running(id);
  ActivityGuard active(*sb);
  uint32_t stream = pty_stream(*sb, id, exec_id);
  if (!sb->channel->send_input(stream, bytes))
    throw Error(Errc::not_found, "exec " + exec_id + " in sandbox " + id + " has ended", "exec_id");
}

void ExecService::pty_resize(const std::string& id, const std::string& exec_id, int cols,
                             int rows) {
  validate_pty_size(cols, rows);
  auto sb = table_.running(id);
  sb->channel->resize(pty_stream(*sb, id, exec_id), cols, rows);
}

}  // namespace airlock::engine::exec

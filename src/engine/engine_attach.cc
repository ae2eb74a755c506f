// Engine::attach_exec: a client resumes a foreground exec that outlived its
// first client (the daemon was killed and restarted) from an offset of its
// output. The guest keeps running such execs, detached, with their last
// Config::exec_buffer_bytes of output in a log (api/guest-protocol.md §5,
// "Detach and attach"); the exec's journal record is written here, once,
// when an attached client sees it end (docs/design.md, "Daemon restarts").
#include <spdlog/spdlog.h>

#include "common/error.h"
#include "engine/engine.h"
#include "engine/engine_impl.h"
#include "engine/types_json.h"

namespace airlock::engine {

namespace {

// How long the guest gets to answer the attach request itself.
constexpr auto kAttachAnswer = std::chrono::seconds(30);

uint64_t count(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number_unsigned() ? it->get<uint64_t>() : 0;
}

}  // namespace

std::optional<ExecResult> Engine::attach_exec(const std::string& id, const std::string& exec_id,
                                              uint64_t offset, const AttachCallbacks& callbacks) {
  auto& impl = *impl_;
  auto sb = impl.running(id);
  ActivityGuard active(*sb);
  {
    std::lock_guard lock(sb->mu);
    if (sb->execs.count(exec_id))
      throw Error(Errc::conflict, "exec " + exec_id +
                                      " is still streaming to the client that "
                                      "started it; attach is for an exec whose client is gone");
  }
  channel::AttachHandlers handlers;
  handlers.on_attached = callbacks.on_attached;
  handlers.on_output = callbacks.on_output;
  handlers.cancelled = callbacks.cancelled;
  nlohmann::json r;
  try {
    r = sb->channel->attach(exec_id, offset, handlers, channel::Clock::now() + kAttachAnswer);
  } catch (const Error& e) {
    if (e.code() == Errc::not_found)
      throw Error(Errc::not_found,
                  "sandbox " + id + " has no exec " + exec_id +
                      " to attach to (unknown, or it ended and its result "
                      "was collected)",
                  "exec_id");
    if (e.code() == Errc::invalid_argument) throw Error(Errc::invalid_argument, e.what(), "offset");
    if (e.code() == Errc::conflict)
      throw Error(Errc::conflict, "exec " + exec_id + " already has a client attached");
    rethrow_exec_error(*sb, e);
  }
  if (r.is_object() && r.contains("detached") && r["detached"] == true) return std::nullopt;

  ExecResult result;
  result.exec_id = exec_id;
  read_exec_outcome(r, result);
  // What the process produced, as the guest counted it (this client saw
  // only the part from its offset).
  result.stdout_bytes = count(r, "stdout_bytes");
  result.stderr_bytes = count(r, "stderr_bytes");
  result.stdin_bytes = count(r, "stdin_bytes");

  // Written once: by the attach that saw the end of an exec of a previous
  // daemon. (A second client finds nothing to attach to: the guest forgets
  // an exec once its end was delivered.)
  std::optional<nlohmann::json> start;
  {
    std::lock_guard lock(sb->mu);
    if (auto it = sb->detached_execs.find(exec_id); it != sb->detached_execs.end()) {
      start = std::move(it->second);
      sb->detached_execs.erase(it);
    }
  }
  if (start) {
    nlohmann::json audit{{"exec_id", exec_id},
                         {"argv", start->value("argv", nlohmann::json::array())},
                         {"cwd", start->value("cwd", nlohmann::json("~"))},
                         {"user", start->value("user", nlohmann::json("root"))},
                         {"reattached", true},
                         {"output_lost", count(r, "output_lost")}};
    audit.update(to_json(result));
    try {
      impl.journal.append(id, "exec", audit);
    } catch (const std::exception& e) {
      spdlog::error("sandbox {}: audit: {}", id, e.what());
    }
  }
  return result;
}

}  // namespace airlock::engine

// ExecService::attach_exec (Engine::attach_exec): a client resumes a foreground exec that outlived
// its first client (the daemon was killed and restarted) from an offset of its output. The guest
// keeps running such execs, detached, with their last Config::exec_buffer_bytes of output in a log
// (api/guest-protocol.md §5, "Detach and attach"). Journal (docs/design.md, "Daemon restarts lose
// no output"): every attach that got going writes an `exec_attach` record with the SHA-256 of
// exactly the bytes IT delivered and their offsets; the exec's `exec` record is written once, by
// the attach that sees it end, and carries no output hash (no daemon saw all of the output: the one
// that died took its running hash with it).
#include <spdlog/spdlog.h>

#include <regex>

#include "common/error.h"
#include "engine/audit/chain.h"
#include "engine/channel/guest_client.h"
#include "engine/exec/outcome.h"
#include "engine/exec/service.h"
#include "engine/types_json.h"

namespace airlock::engine::exec {

namespace {

// How long the guest gets to answer the attach request itself.
constexpr auto kAttachAnswer = std::chrono::seconds(30);
// How long a kill of a detached exec waits for its end (collect_detached_end).
constexpr auto kKillCollect = std::chrono::seconds(10);

// The shape of the host's exec ids (random_id("ex-"), and the guest's
// limit): anything else names no exec.
bool plausible_exec_id(const std::string& s) {
  static const std::regex re("[A-Za-z0-9_-]{1,64}");
  return std::regex_match(s, re);
}

// What one attach delivered, journaled as `exec_attach` when it ends
// (exit, detach or error): offsets [from, to) of the exec's output and the
// SHA-256 of the stdout and stderr bytes among them, hashed here as they
// pass to the client.
struct Delivered {
  bool attached = false;
  uint64_t from = 0, to = 0, dropped = 0, out_bytes = 0, err_bytes = 0;
  uint64_t backlog = 0;  // bytes the guest held past `from` when this attach began
  Sha256 out, err;
  nlohmann::json record(const std::string& exec_id, const char* how) {
    return {{"exec_id", exec_id},
            {"offset", from},
            {"end", to},
            {"dropped", dropped},
            {"backlog", backlog},
            {"stdout_bytes", out_bytes},
            {"stderr_bytes", err_bytes},
            {"stdout_sha256", out.hex()},
            {"stderr_sha256", err.hex()},
            {"ended_by", how}};
  }
};

}  // namespace

namespace {

// The `exec` record of an exec of a previous daemon, written once: by the
// attach that saw its end. (A second client finds nothing to attach to: the
// guest forgets an exec once its end was delivered.)
void journal_reattached_end(AuditJournal& journal, Sandbox& sb, const std::string& exec_id,
                            const channel::ExecOutcome& outcome, const ExecResult& result) {
  std::optional<nlohmann::json> start;
  {
    std::lock_guard lock(sb.mu);
    if (auto it = sb.detached_execs.find(exec_id); it != sb.detached_execs.end()) {
      start = std::move(it->second);
      sb.detached_execs.erase(it);
    }
  }
  if (start) {
    // The byte counts are the guest's (untrusted, and no host saw them
    // all), so there is no stdout/stderr hash here: the exec_attach records
    // before this one hash what was delivered, with offsets.
    nlohmann::json audit{{"exec_id", exec_id},
                         {"argv", start->value("argv", nlohmann::json::array())},
                         {"cwd", start->value("cwd", nlohmann::json("~"))},
                         {"user", start->value("user", nlohmann::json("root"))},
                         {"env_keys", start->value("env_keys", nlohmann::json::array())},
                         {"reattached", true},
                         {"output_end", outcome.output_end},
                         {"output_lost", outcome.output_lost}};
    audit.update(to_json(result));
    try {
      journal.append(sb.id(), "exec", audit);
    } catch (const std::exception& e) {
      spdlog::error("sandbox {}: audit: {}", sb.id(), e.what());
    }
  }
}

}  // namespace

std::optional<ExecResult> ExecService::attach_exec(const std::string& id,
                                                   const std::string& exec_id, uint64_t offset,
                                                   const AttachCallbacks& callbacks) {
  auto sb = table_.running(id);
  ActivityGuard active(*sb);
  auto no_such = [&] {
    return Error(Errc::not_found,
                 "sandbox " + id + " has no exec " + exec_id +
                     " to attach to (unknown, or it ended and its result was collected)",
                 "exec_id");
  };
  if (!plausible_exec_id(exec_id)) throw no_such();
  {
    std::lock_guard lock(sb->mu);
    if (sb->execs.count(exec_id))
      throw Error(Errc::conflict, "exec " + exec_id +
                                      " is still streaming to the client that "
                                      "started it; attach is for an exec whose client is gone");
  }
  Delivered got;
  const char* ended_by = "error";
  auto journal_delivered = [&] {
    if (!got.attached) return;
    try {
      journal_.append(id, "exec_attach", got.record(exec_id, ended_by));
    } catch (const std::exception& e) {
      spdlog::error("sandbox {}: audit: {}", id, e.what());
    }
  };
  channel::AttachClientHandlers handlers;
  handlers.on_attached = [&](const channel::Attached& a) {
    got.attached = true;
    got.from = got.to = a.offset;
    got.dropped = a.dropped;
    got.backlog = a.end - a.offset;
    // The channel's checked event goes to the API's `attached` event as it
    // is (AttachCallbacks::on_attached documents its fields).
    if (callbacks.on_attached) callbacks.on_attached(a.event);
  };
  handlers.on_output = [&](int ch, std::string_view bytes) {
    got.to += bytes.size();
    (ch == 1 ? got.out_bytes : got.err_bytes) += bytes.size();
    (ch == 1 ? got.out : got.err).update(bytes);
    return callbacks.on_output ? callbacks.on_output(ch, bytes) : true;
  };
  handlers.cancelled = callbacks.cancelled;
  // While attached, pty_input / pty_resize find the stream by exec id.
  handlers.on_stream = [&](uint32_t stream) {
    std::lock_guard lock(sb->mu);
    sb->attached_streams[exec_id] = stream;
  };
  struct Unregister {
    Sandbox& sb;
    const std::string& exec_id;
    ~Unregister() {
      std::lock_guard lock(sb.mu);
      sb.attached_streams.erase(exec_id);
    }
  } unregister{*sb, exec_id};
  channel::AttachReply r;
  try {
    r = channel::attach(*sb->channel, exec_id, offset, handlers,
                        channel::Clock::now() + kAttachAnswer);
  } catch (const Error& e) {
    journal_delivered();
    if (e.code() == Errc::not_found) throw no_such();
    if (e.code() == Errc::invalid_argument) throw Error(Errc::invalid_argument, e.what(), "offset");
    if (e.code() == Errc::conflict)
      throw Error(Errc::conflict, "exec " + exec_id + " already has a client attached");
    rethrow_guest_failure(*sb, e);
  } catch (...) {
    journal_delivered();
    throw;
  }
  if (r.detached) {
    ended_by = "detach";
    journal_delivered();
    return std::nullopt;
  }
  ended_by = "exit";
  journal_delivered();

  ExecResult result;
  result.exec_id = exec_id;
  take_outcome(r.outcome, result);
  // What the process produced, as the guest counted it (this client saw
  // only the part from its offset).
  result.stdout_bytes = r.outcome.stdout_bytes;
  result.stderr_bytes = r.outcome.stderr_bytes;
  result.stdin_bytes = r.outcome.stdin_bytes;

  journal_reattached_end(journal_, *sb, exec_id, r.outcome, result);
  return result;
}

void ExecService::collect_detached_end(const std::string& id, const std::string& exec_id,
                                       uint64_t end) {
  const auto give_up = std::chrono::steady_clock::now() + kKillCollect;
  AttachCallbacks cb;
  // The output after `end` goes to nobody (its exec_attach record still
  // hashes it); past the deadline the collector lets go (detaches).
  cb.on_output = [&](int, std::string_view) { return std::chrono::steady_clock::now() < give_up; };
  cb.cancelled = [&] { return std::chrono::steady_clock::now() >= give_up; };
  try {
    attach_exec(id, exec_id, end, cb);
  } catch (const Error& e) {
    // Collected or attached by someone else meanwhile: they record the end.
    if (e.code() != Errc::not_found && e.code() != Errc::conflict)
      spdlog::warn("sandbox {}: collecting the end of killed exec {}: {}", id, exec_id, e.what());
  }
}

}  // namespace airlock::engine::exec

// File operations on a running sandbox: write and read (streamed, hashed on
// the host, journaled), list, stat, move, mkdir and remove, and what E2B's
// filesystem service needs beyond the native API's (list with depth, move,
// ownership of what a call creates). Every entry the guest reports is checked and rebuilt by the
// guest client (channel/file_entry.h) before the engine sees it.
#include <chrono>

#include "common/error.h"
#include "engine/audit/chain.h"
#include "engine/channel/guest_client.h"
#include "engine/engine.h"
#include "engine/engine_impl.h"
#include "engine/validate.h"

namespace airlock::engine {
namespace {

using channel::Clock;
using channel::Deadline;
using channel::GuestChannel;
using nlohmann::json;
constexpr size_t kMaxListEntries = 100000;  // bounds the host's memory for one listing
constexpr auto kJsonOpTimeout = std::chrono::seconds(60);

// Streaming file transfers may legitimately take long under TCG; the
// sandbox's life bounds them (the reaper kills the VM at expiry).
channel::Deadline transfer_deadline(const Sandbox& sb) {
  int64_t left_ms = std::max<int64_t>(sb.expires_steady_ms.load() - steady_ms(), 1000);
  return Clock::now() + std::chrono::milliseconds(std::min<int64_t>(left_ms, 3600 * 1000));
}

void validate_owner(const std::string& owner) {
  if (owner.size() > 64 || owner.find('\0') != std::string::npos ||
      owner.find(':') != std::string::npos)
    throw Error(Errc::invalid_argument, "user must be a name or uid of at most 64 bytes", "user");
}

// The guest's "no user X" (an unknown owner) names the user, not the path.
template <class F>
auto owner_errors(const std::string& owner, F f) {
  try {
    return f();
  } catch (const Error& e) {
    if (!owner.empty() && e.code() == Errc::not_found &&
        std::string(e.what()).find("no user ") != std::string::npos)
      throw Error(Errc::not_found, "no user " + owner + " in the sandbox", "user");
    throw;
  }
}

}  // namespace

json Engine::list_files(const std::string& id, const std::string& path, int depth) {
  if (depth < 1 || depth > 64)
    throw Error(Errc::invalid_argument, "depth must be between 1 and 64", "depth");
  // One guest answer fits one frame (64 KiB): page with "offset" until the
  // guest says it is complete, up to kMaxListEntries.
  json entries = json::array();
  for (;;) {
    channel::ListReply r;
    impl_->guest_op(id, path, nullptr, [&](GuestChannel& ch, Deadline d) {
      r = channel::list(ch, path, depth, entries.size(), d);
    });
    for (json& e : r.entries) entries.push_back(std::move(e));
    if (!r.truncated) return {{"entries", std::move(entries)}};
    if (r.entries.empty()) throw Error(Errc::guest_error, "guest list made no progress");
    if (entries.size() >= kMaxListEntries)
      return {{"entries", std::move(entries)}, {"truncated", true}};
  }
}

json Engine::stat_file(const std::string& id, const std::string& path) {
  json entry;
  impl_->guest_op(id, path, nullptr,
                  [&](GuestChannel& ch, Deadline d) { entry = channel::stat(ch, path, d); });
  return entry;
}

json Engine::move_file(const std::string& id, const std::string& from, const std::string& to,
                       const std::string& owner) {
  validate_guest_path(to, "destination");
  validate_owner(owner);
  // The journal's "file" record of the move (also of a refused one, with "error").
  json audit = {{"op", "move"}, {"path", from}, {"dest", to}, {"parents", true}};
  if (!owner.empty()) audit["owner"] = owner;
  json entry;
  owner_errors(owner, [&] {
    impl_->guest_op(id, from, &audit, [&](GuestChannel& ch, Deadline d) {
      entry = channel::move(ch, from, to, /*parents=*/true, owner, d);
    });
  });
  return entry;
}

std::string Engine::guest_home(const std::string& id, const std::string& user) {
  validate_owner(user);
  // Guest-written: the client takes only an absolute, bounded path.
  std::string home;
  try {
    impl_->guest_op(id, {}, nullptr,
                    [&](GuestChannel& ch, Deadline d) { home = channel::user_home(ch, user, d); });
  } catch (const Error& e) {
    if (e.code() == Errc::not_found)
      throw Error(Errc::not_found, "no user " + user + " in the sandbox", "user");
    throw;
  }
  return home;
}

void Engine::make_dir_as(const std::string& id, const std::string& path, const std::string& owner) {
  validate_owner(owner);
  json audit = {{"op", "mkdir"}, {"path", path}, {"parents", true}};
  if (!owner.empty()) audit["owner"] = owner;
  owner_errors(owner, [&] {
    impl_->guest_op(id, path, &audit, [&](GuestChannel& ch, Deadline d) {
      channel::mkdir(ch, path, /*parents=*/true, owner, d);
    });
  });
}

uint64_t Engine::write_file(const std::string& id, const std::string& path, uint32_t mode,
                            const ChunkSource& source) {
  return write_file_as(id, path, mode, source, {});
}

uint64_t Engine::write_file_as(const std::string& id, const std::string& path, uint32_t mode,
                               const ChunkSource& source, const std::string& owner) {
  auto sb = impl_->table.running(id);
  ActivityGuard active(*sb);
  validate_guest_path(path);
  if (mode > 07777) throw Error(Errc::invalid_argument, "mode must be at most 07777", "mode");
  if (owner.size() > 64 || owner.find('\0') != std::string::npos)
    throw Error(Errc::invalid_argument, "user must be a name or uid of at most 64 bytes", "user");
  uint64_t n;
  // Hashed as the bytes go to the guest: the journal names what was written.
  Sha256 hash;
  ChunkSource hashed = [&]() -> std::optional<std::string> {
    auto chunk = source();
    if (chunk) hash.update(*chunk);
    return chunk;
  };
  try {
    n = sb->channel->write_file(path, mode, /*parents=*/true, hashed, transfer_deadline(*sb),
                                owner);
  } catch (const Error& e) {
    impl_->journal.append(id, "file", {{"op", "write"}, {"path", path}, {"error", e.what()}});
    rethrow_guest_failure(*sb, e);
  }
  impl_->journal.append(id, "file",
                        {{"op", "write"},
                         {"path", path},
                         {"bytes", n},
                         {"size", n},
                         {"mode", mode},
                         {"sha256", hash.hex()}});
  return n;
}

uint64_t Engine::read_file(const std::string& id, const std::string& path, const ChunkSink& sink) {
  auto sb = impl_->table.running(id);
  ActivityGuard active(*sb);
  validate_guest_path(path);
  uint64_t n;
  try {
    n = sb->channel->read_file(path, sink, transfer_deadline(*sb));
  } catch (const Error& e) {
    impl_->journal.append(id, "file", {{"op", "read"}, {"path", path}, {"error", e.what()}});
    rethrow_guest_failure(*sb, e);
  }
  impl_->journal.append(id, "file", {{"op", "read"}, {"path", path}, {"bytes", n}});
  return n;
}

void Engine::Impl::guest_op(const std::string& id, const std::optional<std::string>& path,
                            const nlohmann::json* audit, const GuestOp& op) {
  auto sb = table.running(id);
  ActivityGuard active(*sb);
  if (path) validate_guest_path(*path);
  try {
    op(*sb->channel, Clock::now() + kJsonOpTimeout);
  } catch (const channel::GuestReplyError&) {
    // The guest did it; only its answer is unusable.
    if (audit) journal.append(id, "file", *audit);
    throw;
  } catch (const Error& e) {
    if (audit) {
      nlohmann::json failed = *audit;
      failed["error"] = e.what();
      journal.append(id, "file", failed);
    }
    rethrow_guest_failure(*sb, e);
  }
  if (audit) journal.append(id, "file", *audit);
}

nlohmann::json Engine::list_files(const std::string& id, const std::string& path) {
  return list_files(id, path, 1);
}

// The journal records these as "file" events: {"op": "mkdir"|"remove",
// "path", "parents"|"recursive"}, with "error" if the guest refused.
void Engine::make_dir(const std::string& id, const std::string& path, bool parents) {
  const nlohmann::json audit{{"op", "mkdir"}, {"path", path}, {"parents", parents}};
  impl_->guest_op(id, path, &audit, [&](channel::GuestChannel& ch, channel::Deadline d) {
    channel::mkdir(ch, path, parents, /*owner=*/"", d);
  });
}

void Engine::remove_file(const std::string& id, const std::string& path, bool recursive) {
  const nlohmann::json audit{{"op", "remove"}, {"path", path}, {"recursive", recursive}};
  impl_->guest_op(id, path, &audit, [&](channel::GuestChannel& ch, channel::Deadline d) {
    channel::remove(ch, path, recursive, d);
  });
}

nlohmann::json Engine::guest_info(const std::string& id) {
  // The guest's facts go to the API as the guest sent them (GuestInfo in
  // api/openapi.yaml takes any properties): the engine reads none of them.
  nlohmann::json info;
  impl_->guest_op(id, {}, nullptr, [&](channel::GuestChannel& ch, channel::Deadline d) {
    info = channel::info(ch, d);
  });
  return info;
}

}  // namespace airlock::engine

// The file operations E2B's filesystem service needs beyond the native
// API's: list with depth, move, and ownership of what a call
// creates. Every entry the guest reports is checked and rebuilt by the
// guest client (channel/file_entry.h) before the engine sees it.
#include "common/error.h"
#include "engine/channel/guest_client.h"
#include "engine/engine.h"
#include "engine/engine_impl.h"
#include "engine/validate.h"

namespace airlock::engine {
namespace {

using channel::Deadline;
using channel::GuestChannel;
using nlohmann::json;
constexpr size_t kMaxListEntries = 100000;  // bounds the host's memory for one listing

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

}  // namespace airlock::engine

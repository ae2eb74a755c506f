// The file operations E2B's filesystem service needs beyond the native
// API's (issue 11): list with depth, move, and ownership of what a call
// creates. Every entry the guest reports is rebuilt by file_entry_from_guest.
#include "common/error.h"
#include "engine/engine.h"
#include "engine/engine_impl.h"
#include "engine/channel/file_entry.h"
#include "engine/validate.h"

namespace airlock::engine {
namespace {

using nlohmann::json;
using channel::file_entry_from_guest;
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
    json r = impl_->json_op(
        id, {{"op", "list"}, {"path", path}, {"depth", depth}, {"offset", entries.size()}}, false);
    if (!r.contains("entries") || !r["entries"].is_array())
      throw Error(Errc::guest_error, "guest list response has no entries array");
    for (const json& e : r["entries"]) entries.push_back(file_entry_from_guest(e));
    if (r.value("truncated", false) != true) return {{"entries", std::move(entries)}};
    if (r["entries"].empty()) throw Error(Errc::guest_error, "guest list made no progress");
    if (entries.size() >= kMaxListEntries)
      return {{"entries", std::move(entries)}, {"truncated", true}};
  }
}

json Engine::stat_file(const std::string& id, const std::string& path) {
  return file_entry_from_guest(impl_->json_op(id, {{"op", "stat"}, {"path", path}}, false));
}

json Engine::move_file(const std::string& id, const std::string& from, const std::string& to,
                       const std::string& owner) {
  validate_guest_path(to, "destination");
  validate_owner(owner);
  json req = {{"op", "move"}, {"path", from}, {"dest", to}, {"parents", true}};
  if (!owner.empty()) req["owner"] = owner;
  return owner_errors(owner, [&] { return file_entry_from_guest(impl_->json_op(id, req, true)); });
}

std::string Engine::guest_home(const std::string& id, const std::string& user) {
  validate_owner(user);
  json req = {{"op", "user"}};
  if (!user.empty()) req["user"] = user;
  json r;
  try {
    r = impl_->json_op(id, req, false);
  } catch (const Error& e) {
    if (e.code() == Errc::not_found)
      throw Error(Errc::not_found, "no user " + user + " in the sandbox", "user");
    throw;
  }
  // Guest-written: only an absolute, bounded path is taken.
  auto it = r.find("home");
  if (it == r.end() || !it->is_string() || it->get_ref<const std::string&>().empty() ||
      it->get_ref<const std::string&>()[0] != '/' ||
      it->get_ref<const std::string&>().size() > 4096 ||
      it->get_ref<const std::string&>().find('\0') != std::string::npos)
    throw Error(Errc::guest_error, "the guest named no usable home directory for " +
                                       (user.empty() ? std::string("root") : user));
  return it->get<std::string>();
}

void Engine::make_dir_as(const std::string& id, const std::string& path, const std::string& owner) {
  validate_owner(owner);
  json req = {{"op", "mkdir"}, {"path", path}, {"parents", true}};
  if (!owner.empty()) req["owner"] = owner;
  owner_errors(owner, [&] { return impl_->json_op(id, req, true); });
}

}  // namespace airlock::engine

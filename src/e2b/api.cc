#include "e2b/api.h"

#include <algorithm>
#include <chrono>
#include <set>
#include <tuple>

#include "common/error.h"
#include "common/scope_guard.h"
#include "daemon/request.h"
#include "daemon/tenancy.h"
#include "e2b/audit.h"
#include "e2b/model.h"

namespace airlock::e2b {
namespace {

using nlohmann::json;
constexpr uint64_t kMaxBody = 1 << 20;

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(sep, start);
    if (end == std::string_view::npos) end = s.size();
    out.emplace_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

[[noreturn]] void not_found(const std::string& id) {
  throw Error(Errc::not_found, "sandbox \"" + id + "\" not found");
}

// The sandbox if this principal may see it (daemon/tenancy.h, the same
// check as the native routes) and it is alive (E2B knows only running and
// paused sandboxes); 404 otherwise, the same for every reason.
engine::SandboxInfo visible(engine::SandboxService& engine, const daemon::Principal& who,
                            const std::string& id) {
  engine::SandboxInfo info;
  try {
    daemon::check_id(id, "sandboxID");
    info = daemon::visible_sandbox(engine, who, id);
  } catch (const Error& e) {
    if (e.code() == Errc::not_found || e.code() == Errc::invalid_argument)
      not_found(id.substr(0, 64));
    throw;
  }
  if (info.state != engine::State::running && info.state != engine::State::paused) not_found(id);
  return info;
}

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// GET /sandboxes and /v2/sandboxes: metadata and state filters, order by
// start time, pages of `limit` with the next page's token in x-next-token
// ("<created ms>_<id>" of the page's successor, so a sandbox deleted
// between pages does not break the walk).
void list(engine::SandboxService& engine, daemon::Exchange& ex, const daemon::Principal& who) {
  daemon::Query q = daemon::parse_query(ex.query());
  std::map<std::string, std::string> filter;
  if (q.count("metadata")) filter = parse_metadata_query(q["metadata"]);
  for (const auto& [k, v] : filter)
    if (k.rfind(kMetaPrefix, 0) == 0)
      throw Error(Errc::invalid_argument, "metadata key '" + k + "' is reserved", "metadata");
  std::set<std::string> states = {"running", "paused"};
  if (q.count("state") && !q["state"].empty()) {
    states.clear();
    for (const std::string& s : split(q["state"], ',')) {
      if (s != "running" && s != "paused")
        throw Error(Errc::invalid_argument, "state must be running and/or paused, got '" + s + "'",
                    "state");
      states.insert(s);
    }
  }
  size_t limit = 100;
  if (q.count("limit")) {
    try {
      long n = std::stol(q["limit"]);
      if (n < 1 || n > 1000) throw std::out_of_range("limit");
      limit = static_cast<size_t>(n);
    } catch (const std::exception&) {
      throw Error(Errc::invalid_argument, "limit must be 1..1000", "limit");
    }
  }
  bool desc = q.count("order") && q["order"] == "desc";
  if (q.count("order") && q["order"] != "asc" && q["order"] != "desc")
    throw Error(Errc::invalid_argument, "order must be asc or desc", "order");

  std::vector<engine::SandboxInfo> all;
  for (auto& info : daemon::visible_sandboxes(engine, who, filter)) {
    if (info.state != engine::State::running && info.state != engine::State::paused) continue;
    if (!states.count(info.state == engine::State::paused ? "paused" : "running")) continue;
    all.push_back(std::move(info));
  }
  auto key = [](const engine::SandboxInfo& i) { return std::tie(i.created_at_ms, i.id); };
  std::sort(all.begin(), all.end(),
            [&](const auto& a, const auto& b) { return desc ? key(b) < key(a) : key(a) < key(b); });
  size_t start = 0;
  if (q.count("nextToken") && !q["nextToken"].empty()) {
    const std::string& t = q["nextToken"];
    auto us = t.find('_');
    int64_t ms = 0;
    try {
      if (us == std::string::npos) throw std::invalid_argument("no _");
      ms = std::stoll(t.substr(0, us));
    } catch (const std::exception&) {
      throw Error(Errc::invalid_argument, "nextToken is not one this server gave out", "nextToken");
    }
    auto tok = std::make_tuple(ms, t.substr(us + 1));
    while (start < all.size()) {
      auto k = std::make_tuple(all[start].created_at_ms, all[start].id);
      if (desc ? k <= tok : k >= tok) break;
      ++start;
    }
  }
  json items = json::array();
  for (size_t i = start; i < all.size() && i < start + limit; ++i)
    items.push_back(listed_json(all[i]));
  if (start + limit < all.size()) {
    const auto& n = all[start + limit];
    ex.send_json(200, items, "x-next-token", std::to_string(n.created_at_ms) + "_" + n.id);
    return;
  }
  ex.send_json(200, items);
}

}  // namespace

std::string Api::token_of(const engine::SandboxInfo& info) const {
  auto it = info.spec.metadata.find(kMetaSecure);
  if (it == info.spec.metadata.end() || it->second != "true") return "";
  return tokens_->token_for(info.id);
}

void Api::serve(engine::SandboxService& engine, daemon::Exchange& ex, const daemon::Principal& who) const {
  AuditNote note;
  std::string outcome;
  // The record is written as the answer starts, not after it: a caller that
  // reads the audit log right after its answer finds its call there.
  ex.before_answer([&](int status) {
    if (note.route.empty()) return;
    if (outcome.empty()) outcome = status < 400 ? note.ok_outcome : "refused";
    audit_call(ex, who, note.route, note.sandbox, outcome);
  });
  ScopeGuard drop_hook([&] { ex.before_answer(nullptr); });
  try {
    route(engine, ex, who, note);
  } catch (const Error& e) {
    if (ex.responded()) throw;  // mid-answer: the server cuts the connection
    int status = status_for(e);
    outcome = to_string(e.code());
    ex.send_json(status, error_json(status, e.what()));
  }
}

void Api::route(engine::SandboxService& engine, daemon::Exchange& ex, const daemon::Principal& who,
                AuditNote& note) const {
  // No API key at all on the TCP listener: E2B's 401 (the SDK raises
  // AuthenticationError). Bad keys never get here: the server answers them.
  if (who.kind == daemon::Principal::Kind::anonymous) {
    ex.send_json(401, error_json(401, "Invalid API key"));
    return;
  }
  std::string_view path = ex.path().substr(kApiPrefix.size());
  std::string_view method = ex.method();
  std::vector<std::string> seg = split(path.substr(path.empty() ? 0 : 1), '/');
  bool v2 = !seg.empty() && seg[0] == "v2";
  if (v2) seg.erase(seg.begin());
  if (seg.empty() || seg[0] != "sandboxes") {
    ex.send_json(404, error_json(404, "no such route in airlock's E2B API: " + std::string(path)));
    return;
  }

  if (seg.size() == 1 && method == "POST") {
    CreateRequest req = parse_create(ex.read_body(kMaxBody), v2, allow_insecure_);
    // Owner, quota and audit exactly as a native create (tenancy.h).
    engine::SandboxInfo info =
        daemon::create_sandbox_as(engine, who, req.spec, std::string(ex.stream().peer));
    ex.send_json(201, sandbox_json(info, req.secure ? tokens_->token_for(info.id) : ""));
    return;
  }
  if (seg.size() == 1 && method == "GET") return list(engine, ex, who);
  if (seg.size() < 2) {
    ex.send_json(405, error_json(405, "method not allowed"));
    return;
  }
  const std::string& id = seg[1];
  std::string action = seg.size() == 3 ? seg[2] : "";
  if (seg.size() > 3) {
    ex.send_json(404, error_json(404, "no such route in airlock's E2B API: " + std::string(path)));
    return;
  }
  if (method != "GET") {
    // Every call that may change a sandbox is on the audit log, refusals
    // (another tenant's id, not found, unsupported) included. Route
    // templates only: an action nobody serves is "{action}".
    static const std::set<std::string> known = {"timeout",   "connect", "pause",    "resume",
                                                "snapshots", "fork",    "metadata", "refreshes"};
    std::string label = action.empty() || known.count(action) ? action : "{action}";
    note.route = std::string(kApiPrefix) + (v2 ? "/v2" : "") + "/sandboxes/{id}" +
                 (label.empty() ? "" : "/" + label);
    note.sandbox = id;
    note.ok_outcome = action.empty()        ? "sandbox_deleted"
                      : action == "timeout" ? "timeout_set"
                      : action == "connect" ? "sandbox_connected"
                                            : "sandbox_" + label;
  }
  engine::SandboxInfo info = visible(engine, who, id);

  if (action.empty() && method == "GET") {
    ex.send_json(200, detail_json(info));
  } else if (action.empty() && method == "DELETE") {
    engine.destroy(id);
    ex.send_empty(204);
  } else if (action == "timeout" && method == "POST") {
    engine.set_timeout(id, *parse_timeout(ex.read_body(kMaxBody), false));
    ex.send_empty(204);
  } else if (action == "connect" && method == "POST") {
    // A running sandbox: connect never shortens its life, only extends it.
    if (auto t = parse_timeout(ex.read_body(kMaxBody), true);
        t && now_ms() + int64_t(*t) * 1000 > info.expires_at_ms)
      info = engine.set_timeout(id, *t);
    ex.send_json(200, sandbox_json(info, token_of(info)));
  } else if ((action == "pause" || action == "resume" || action == "snapshots" ||
              action == "fork") &&
             method == "POST") {
    ex.send_json(501, error_json(501, action + " is not supported by airlock yet: sandboxes run "
                                               "until killed or timed out"));
  } else if (action == "metrics" && method == "GET") {
    ex.send_json(501, error_json(501, "sandbox metrics are not served on airlock's E2B API yet"));
  } else {
    ex.send_json(404, error_json(404, "no such route in airlock's E2B API: " + std::string(path)));
  }
}

}  // namespace airlock::e2b

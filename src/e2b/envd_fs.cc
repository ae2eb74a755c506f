#include "e2b/envd_fs.h"

#include <time.h>

#include <atomic>
#include <cmath>
#include <future>
#include <optional>
#include <random>
#include <vector>

namespace airlock::e2b {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// A string field of a request message (proto3 JSON: absent = "").
// The call's user's home, asked of the guest only when a path needs it.
std::function<std::string()> home(const FsCall& call) {
  return [&call] { return guest_home(call.engine, call.sandbox, call.user); };
}

std::string str(const json& req, const char* field) {
  auto it = req.find(field);
  if (it == req.end() || it->is_null()) return {};
  if (!it->is_string()) throw FsError("invalid_argument", std::string(field) + " must be a string");
  return it->get<std::string>();
}

bool flag(const json& req, const char* field) {
  auto it = req.find(field);
  if (it == req.end() || it->is_null()) return false;
  if (!it->is_boolean()) throw FsError("invalid_argument", std::string(field) + " must be a bool");
  return it->get<bool>();
}

std::string timestamp(double mtime) {
  auto secs = static_cast<time_t>(std::floor(mtime));
  int millis = static_cast<int>((mtime - static_cast<double>(secs)) * 1000);
  struct tm tm {};
  gmtime_r(&secs, &tm);
  char buf[64];
  strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  char out[80];
  snprintf(out, sizeof out, "%s.%03dZ", buf, std::min(std::max(millis, 0), 999));
  return out;
}

std::string file_type(const std::string& type) {
  if (type == "file") return "FILE_TYPE_FILE";
  if (type == "dir") return "FILE_TYPE_DIRECTORY";
  return "FILE_TYPE_UNSPECIFIED";
}

std::string random_id() {
  static const char* hex = "0123456789abcdef";
  std::random_device rd;
  std::string id = "w-";
  for (int i = 0; i < 16; ++i) id.push_back(hex[rd() % 16]);
  return id;
}

template <class F>
auto engine_call(F f) {
  try {
    return f();
  } catch (const Error& e) {
    throw fs_error(e);
  }
}

}  // namespace

FsError fs_error(const Error& e) {
  switch (e.code()) {
    case Errc::not_found:
      return FsError(e.field() == "user" ? "unauthenticated" : "not_found", e.what());
    case Errc::invalid_argument:
      return FsError("invalid_argument", e.what());
    case Errc::conflict:
      return FsError("failed_precondition", e.what());
    case Errc::timeout:
      return FsError("deadline_exceeded", e.what());
    case Errc::unavailable:
    case Errc::payload_too_large:
    case Errc::quota_exceeded:
    case Errc::rate_limited:
      return FsError("resource_exhausted", e.what());
    case Errc::unauthenticated:
      return FsError("unauthenticated", e.what());
    default:
      return FsError("internal", e.what());
  }
}

std::string guest_home(engine::SandboxService& engine, const std::string& sandbox,
                       const std::string& user) {
  try {
    return engine.guest_home(sandbox, user);
  } catch (const Error& e) {
    throw fs_error(e);
  }
}

std::string resolve_path(std::string_view path, const std::function<std::string()>& home_fn) {
  std::string p(path);
  if (!p.empty() && p[0] == '/') return p;
  const std::string home = home_fn();
  if (!p.empty() && p[0] == '~') {
    if (p.size() > 1 && p[1] != '/')
      throw FsError("invalid_argument", "cannot expand user-specific home dir in '" + p + "'");
    p = p.substr(1);
  }
  // Relative: joined to the home and folded like Go's filepath.Join.
  std::vector<std::string> parts;
  std::string joined = home + "/" + p, seg;
  for (size_t i = 0; i <= joined.size(); ++i) {
    if (i == joined.size() || joined[i] == '/') {
      if (seg == "..") {
        if (!parts.empty()) parts.pop_back();
      } else if (!seg.empty() && seg != ".") {
        parts.push_back(seg);
      }
      seg.clear();
    } else {
      seg.push_back(joined[i]);
    }
  }
  std::string out;
  for (auto& s : parts) out += "/" + s;
  return out.empty() ? "/" : out;
}

std::string permissions_string(const std::string& type, uint32_t mode) {
  std::string s;
  if (type == "dir") s += 'd';
  if (type == "symlink") s += 'L';
  if (mode & 04000) s += 'u';
  if (mode & 02000) s += 'g';
  if (mode & 01000) s += 't';
  if (type == "other") s += '?';
  if (s.empty()) s = "-";
  const char* rwx = "rwxrwxrwx";
  for (int i = 0; i < 9; ++i) s += (mode & (0400 >> i)) ? rwx[i] : '-';
  return s;
}

json entry_info(const json& e) {
  const std::string type = e.value("type", "other");
  const uint32_t mode = e.value("mode", 0u);
  json out = {{"name", e.value("name", "")},
              {"path", e.value("path", "")},
              {"size", std::to_string(e.value("size", uint64_t(0)))},
              {"permissions", permissions_string(type, mode)},
              {"owner", e.value("owner", std::to_string(e.value("uid", 0u)))},
              {"group", e.value("group", std::to_string(e.value("gid", 0u)))},
              {"modifiedTime", timestamp(e.value("mtime", 0.0))}};
  if (type == "symlink") {
    out["type"] = file_type(e.value("target_type", "other"));
    out["mode"] = e.value("target_mode", 0u) & 0777;
    out["symlinkTarget"] = e.value("target", e.value("path", ""));
  } else {
    out["type"] = file_type(type);
    out["mode"] = mode & 0777;
  }
  return out;
}

// The guest's write_file writes "<dir>/.<name>.airlock-<digits>" and renames
// it over the target (atomic replace): envd writes in place, so the SDK
// never sees such a name.
bool write_temp(const std::string& path) {
  std::string base = path.substr(path.find_last_of('/') + 1);
  size_t at = base.rfind(".airlock-");
  if (base.empty() || base[0] != '.' || at == std::string::npos || at + 9 >= base.size())
    return false;
  return base.find_first_not_of("0123456789", at + 9) == std::string::npos;
}

std::vector<json> fs_events(const json& ev, const std::string& root) {
  auto rel = [&](const std::string& p) {
    if (p.size() > root.size() && p.compare(0, root.size(), root) == 0 &&
        (root == "/" || p[root.size()] == '/'))
      return p.substr(root == "/" ? 1 : root.size() + 1);
    return p;
  };
  const std::string type = ev.value("type", "");
  const std::string path = ev.value("path", "");
  auto one = [&](const std::string& p, const char* t) {
    return json{{"name", rel(p)}, {"type", t}};
  };
  if (write_temp(path)) return {};
  if (type == "renamed" && write_temp(ev.value("old_path", "")))
    return {one(path, "EVENT_TYPE_CREATE")};  // a file written through /files
  if (type == "created") return {one(path, "EVENT_TYPE_CREATE")};
  if (type == "modified") return {one(path, "EVENT_TYPE_WRITE")};
  if (type == "deleted") return {one(path, "EVENT_TYPE_REMOVE")};
  if (type == "renamed")
    return {one(ev.value("old_path", path), "EVENT_TYPE_RENAME"), one(path, "EVENT_TYPE_CREATE")};
  return {};
}

// ---- unary methods ----

bool Filesystem::is_unary(std::string_view m) {
  return m == "Stat" || m == "ListDir" || m == "MakeDir" || m == "Move" || m == "Remove" ||
         m == "CreateWatcher" || m == "GetWatcherEvents" || m == "RemoveWatcher";
}

json Filesystem::unary(const FsCall& call, std::string_view method, const json& req) {
  if (!req.is_object()) throw FsError("invalid_argument", "the request must be a JSON object");
  auto& engine = call.engine;
  const std::string& id = call.sandbox;
  if (method == "Stat") {
    std::string path = resolve_path(str(req, "path"), home(call));
    return {{"entry", entry_info(engine_call([&] { return engine.stat_file(id, path); }))}};
  }
  if (method == "ListDir") {
    std::string path = resolve_path(str(req, "path"), home(call));
    int64_t depth = 1;
    if (req.contains("depth") && !req["depth"].is_null()) {
      const json& d = req["depth"];
      if (d.is_number_unsigned())
        depth = d.get<int64_t>();
      else if (d.is_string() && !d.get<std::string>().empty() &&
               d.get<std::string>().find_first_not_of("0123456789") == std::string::npos &&
               d.get<std::string>().size() < 10)
        depth = std::stoll(d.get<std::string>());
      else
        throw FsError("invalid_argument", "depth must be a non-negative integer");
    }
    // envd: 0 means 1; deeper than the guest's 64 levels lists 64.
    int levels = static_cast<int>(std::clamp<int64_t>(depth, 1, 64));
    json r = engine_call([&] { return engine.list_files(id, path, levels); });
    if (r.value("truncated", false))
      throw FsError("out_of_range", "listing of " + path +
                                        " has more entries than airlock returns in one answer; "
                                        "list with a smaller depth");
    json entries = json::array();
    for (const json& e : r["entries"]) entries.push_back(entry_info(e));
    return {{"entries", std::move(entries)}};
  }
  if (method == "MakeDir") {
    std::string path = resolve_path(str(req, "path"), home(call));
    std::optional<json> existing;
    try {
      existing = engine.stat_file(id, path);
    } catch (const Error& e) {
      if (e.code() != Errc::not_found) throw fs_error(e);
    }
    if (existing) {
      bool dir = (*existing)["type"] == "dir" ||
                 ((*existing)["type"] == "symlink" && existing->value("target_type", "") == "dir");
      if (dir) throw FsError("already_exists", "directory already exists: " + path);
      throw FsError("invalid_argument", "path already exists but it is not a directory: " + path);
    }
    engine_call([&] {
      engine.make_dir_as(id, path, call.user);
      return 0;
    });
    return {{"entry", entry_info(engine_call([&] { return engine.stat_file(id, path); }))}};
  }
  if (method == "Move") {
    std::string from = resolve_path(str(req, "source"), home(call));
    std::string to = resolve_path(str(req, "destination"), home(call));
    return {{"entry",
             entry_info(engine_call([&] { return engine.move_file(id, from, to, call.user); }))}};
  }
  if (method == "Remove") {
    std::string path = resolve_path(str(req, "path"), home(call));
    try {
      engine.remove_file(id, path, /*recursive=*/true);
    } catch (const Error& e) {
      // envd removes with os.RemoveAll: a path that is not there is fine.
      if (e.code() != Errc::not_found) throw fs_error(e);
    }
    return json::object();
  }
  if (method == "CreateWatcher") return create_watcher(call, req);
  if (method == "GetWatcherEvents") return watcher_events(call, req);
  if (method == "RemoveWatcher") {
    remove_watcher(call, req);
    return json::object();
  }
  throw FsError("unimplemented", "filesystem.Filesystem/" + std::string(method) + " is not served");
}

// ---- WatchDir ----

void Filesystem::watch_dir(const FsCall& call, const json& req,
                           const std::function<bool(const json&)>& send,
                           std::chrono::milliseconds timeout, std::chrono::milliseconds keepalive) {
  if (!req.is_object()) throw FsError("invalid_argument", "the request must be a JSON object");
  const std::string path = resolve_path(str(req, "path"), home(call));
  const bool recursive = flag(req, "recursive");
  const auto start = Clock::now();
  auto last_sent = start;
  bool alive = true, timed_out = false;
  auto emit = [&](const json& m) {
    if (alive) alive = send(m);
    last_sent = Clock::now();
    return alive;
  };
  engine::WatchCallbacks cb;
  cb.on_start = [&](const json&) { emit({{"start", json::object()}}); };
  cb.on_event = [&](const json& ev) {
    for (const json& e : fs_events(ev, path))
      if (!emit({{"filesystem", e}})) return false;
    if (timeout.count() > 0 && Clock::now() - start >= timeout) timed_out = true;
    return alive && !timed_out;
  };
  cb.on_idle = [&] {
    if (timeout.count() > 0 && Clock::now() - start >= timeout) timed_out = true;
    if (!timed_out && Clock::now() - last_sent >= keepalive) emit({{"keepalive", json::object()}});
    return alive && !timed_out;
  };
  engine::WatchEnd end =
      engine_call([&] { return call.engine.watch_files(call.sandbox, path, recursive, cb); });
  if (!alive) return;
  if (timed_out) throw FsError("deadline_exceeded", "the watch of " + path + " timed out");
  if (end.reason == "sandbox_stopped") throw FsError("unavailable", "the sandbox stopped");
  if (end.reason == "watch_limit")
    throw FsError("resource_exhausted", "watch of " + path + " ended: " + end.message);
}

// ---- CreateWatcher / GetWatcherEvents / RemoveWatcher ----

Filesystem::Filesystem(WatchFn watch) : watch_(std::move(watch)) {
  if (!watch_)
    watch_ = [](engine::SandboxService& engine, const std::string& sandbox, const std::string& path,
                bool recursive, const engine::WatchCallbacks& cb) {
      return engine.watch_files(sandbox, path, recursive, cb);
    };
}

struct Filesystem::Watcher {
  std::string id, sandbox, tenant;
  std::mutex mu;
  std::deque<json> events;
  uint64_t dropped = 0;
  bool ended = false;
  std::string end_reason;
  Clock::time_point last_poll = Clock::now();
  std::atomic<bool> stop{false};
  std::thread thread;
  ~Watcher() {
    stop = true;
    if (thread.joinable()) thread.join();
  }
};

json Filesystem::create_watcher(const FsCall& call, const json& req) {
  const std::string path = resolve_path(str(req, "path"), home(call));
  const bool recursive = flag(req, "recursive");
  {
    std::lock_guard lock(mu_);
    // Ended watchers nobody polled for a while make room first.
    for (auto it = watchers_.begin(); it != watchers_.end();) {
      std::lock_guard wl(it->second->mu);
      bool idle = Clock::now() - it->second->last_poll > kWatcherIdle;
      it = it->second->ended && idle ? watchers_.erase(it) : std::next(it);
    }
    size_t held = 0;
    for (const auto& [id, other] : watchers_) held += other->tenant == call.tenant;
    if (held >= kMaxWatchersPerTenant)
      throw FsError("resource_exhausted", "too many watchers (at most " +
                                              std::to_string(kMaxWatchersPerTenant) +
                                              " per tenant); remove some");
  }
  auto w = std::make_shared<Watcher>();
  w->id = random_id();
  w->sandbox = call.sandbox;
  w->tenant = call.tenant;
  auto started = std::make_shared<std::promise<std::optional<FsError>>>();
  auto fut = started->get_future();
  engine::SandboxService& engine = call.engine;
  Watcher* raw = w.get();  // the thread ends before the Watcher is destroyed
  w->thread = std::thread([this, raw, &engine, path, recursive, started] {
    bool began = false;
    auto answer = [&](std::optional<FsError> err) {
      if (began) return;
      began = true;
      started->set_value(std::move(err));
    };
    engine::WatchCallbacks cb;
    cb.on_start = [&](const json&) { answer(std::nullopt); };
    cb.on_event = [&](const json& ev) {
      std::lock_guard lock(raw->mu);
      for (const json& e : fs_events(ev, path)) {
        if (raw->events.size() < kMaxBufferedEvents)
          raw->events.push_back(e);
        else
          ++raw->dropped;
      }
      return !raw->stop.load();
    };
    cb.on_idle = [&] {
      std::lock_guard lock(raw->mu);
      return !raw->stop.load() && Clock::now() - raw->last_poll < kWatcherIdle;
    };
    std::string reason;
    try {
      reason = watch_(engine, raw->sandbox, path, recursive, cb).reason;
    } catch (const Error& e) {
      answer(fs_error(e));
      reason = e.what();
    } catch (const std::exception& e) {
      answer(FsError("internal", e.what()));
      reason = e.what();
    }
    answer(FsError("internal", "the watch of " + path + " ended before it started: " + reason));
    std::lock_guard lock(raw->mu);
    raw->ended = true;
    raw->end_reason = reason;
  });
  std::optional<FsError> err = fut.get();  // the engine bounds the wait for the start
  if (err) throw *err;                     // w's destructor joins the finished thread
  std::lock_guard lock(mu_);
  watchers_[w->id] = w;
  return {{"watcherId", w->id}};
}

std::shared_ptr<Filesystem::Watcher> Filesystem::find_watcher(const FsCall& call, const json& req) {
  const std::string id = str(req, "watcherId");
  std::lock_guard lock(mu_);
  auto it = watchers_.find(id);
  // Another sandbox's watcher answers like one that does not exist.
  if (it == watchers_.end() || it->second->sandbox != call.sandbox)
    throw FsError("not_found", "watcher " + id.substr(0, 64) + " not found");
  return it->second;
}

json Filesystem::watcher_events(const FsCall& call, const json& req) {
  auto w = find_watcher(call, req);
  json events = json::array();
  bool gone;
  std::string reason;
  {
    std::lock_guard lock(w->mu);
    w->last_poll = Clock::now();
    while (!w->events.empty()) {
      events.push_back(std::move(w->events.front()));
      w->events.pop_front();
    }
    gone = w->ended && events.empty();
    reason = w->end_reason;
  }
  if (gone) {
    {
      std::lock_guard lock(mu_);
      watchers_.erase(w->id);
    }
    throw FsError("not_found", "watcher " + w->id + " ended: " + reason);
  }
  return {{"events", std::move(events)}};
}

void Filesystem::remove_watcher(const FsCall& call, const json& req) {
  auto w = find_watcher(call, req);
  w->stop = true;
  std::lock_guard lock(mu_);
  watchers_.erase(w->id);  // the last reference may be `w`: joined when it goes
}

void Filesystem::stop_all() {
  std::map<std::string, std::shared_ptr<Watcher>> all;
  {
    std::lock_guard lock(mu_);
    all.swap(watchers_);
  }
  for (auto& [id, w] : all) w->stop = true;
  all.clear();  // joins each watcher's thread (it sees `stop` within ~0.5 s)
}

}  // namespace airlock::e2b

// GuestChannel::watch: one guest inotify watch streamed as checked NDJSON
// lines (api/guest-protocol.md, watch). Split from guest_channel.cc.
#include <climits>
#include <cstring>

#include "common/error.h"
#include "engine/channel/guest_channel.h"
#include "engine/channel/guest_channel_detail.h"
#include "protocol/messages.h"

namespace airlock::channel {

using detail::kIn;
using detail::kKillGrace;
using detail::kOut;
using detail::parse_response;
using detail::StreamGuard;
using protocol::Frame;
using protocol::Type;

namespace {

// A guest path in a watch event: absolute, no NUL, at most PATH_MAX bytes.
bool good_watch_path(const nlohmann::json& v) {
  if (!v.is_string()) return false;
  const auto& p = v.get_ref<const std::string&>();
  return !p.empty() && p[0] == '/' && p.size() <= 4096 && p.find('\0') == std::string::npos;
}

// One NDJSON line of a watch stream, rebuilt from its known fields, or an
// empty string naming nothing (the caller counts it as ignored) with `why`.
std::optional<nlohmann::json> check_watch_event(std::string_view line, std::string& why) {
  if (protocol::json_too_deep(line)) {
    why = "nested too deep";
    return std::nullopt;
  }
  auto j = nlohmann::json::parse(line, nullptr, false);
  if (!j.is_object()) {
    why = "not a JSON object";
    return std::nullopt;
  }
  auto type = j.value("type", nlohmann::json());
  if (!type.is_string()) {
    why = "no type";
    return std::nullopt;
  }
  const std::string t = type.get<std::string>();
  if (t == "overflow") {
    auto d = j.value("dropped", nlohmann::json());
    if (!d.is_number_unsigned()) {
      why = "overflow without a count";
      return std::nullopt;
    }
    return nlohmann::json{{"type", t}, {"dropped", d.get<uint64_t>()}};
  }
  if (t != "created" && t != "modified" && t != "deleted" && t != "renamed") {
    why = "unknown type";
    return std::nullopt;
  }
  auto path = j.value("path", nlohmann::json());
  auto is_dir = j.value("is_dir", nlohmann::json());
  if (!good_watch_path(path) || !is_dir.is_boolean()) {
    why = "bad path or is_dir";
    return std::nullopt;
  }
  nlohmann::json out{{"type", t}, {"path", path}, {"is_dir", is_dir}};
  if (t == "renamed") {
    auto old = j.value("old_path", nlohmann::json());
    if (!good_watch_path(old)) {
      why = "renamed without a good old_path";
      return std::nullopt;
    }
    out["old_path"] = old;
  }
  return out;
}

}  // namespace

nlohmann::json GuestChannel::watch(const std::string& path, bool recursive,
                                   const WatchHandlers& handlers, Deadline start_deadline) {
  uint32_t id = open_stream();
  auto st = register_stream(id);
  StreamGuard guard{[&] { unregister_stream(id); }};
  send(protocol::json_frame(Type::request, id,
                            {{"op", "watch"}, {"path", path}, {"recursive", recursive}}));
  // The start: the `watching` event, or the error response.
  for (;;) {
    auto f = wait_frame(*st, start_deadline, false);
    if (f->type == Type::response) {
      parse_response(*f);  // throws the guest's error
      throw Error(Errc::guest_error, "guest ended watch " + path + " before it started");
    }
    if (f->type == Type::event) {
      nlohmann::json j;
      try {
        j = protocol::parse_json(*f);
      } catch (const Error& e) {
        ignore("watch event on stream " + std::to_string(id) + ": " + e.what());
        continue;
      }
      if (j.value("watching", false) != true) {
        ignore("watch event on stream " + std::to_string(id) + " without \"watching\"");
        continue;
      }
      auto dirs = j.value("dirs", nlohmann::json());
      if (handlers.on_start)
        handlers.on_start(
            {{"path", path}, {"dirs", dirs.is_number_unsigned() ? dirs.get<uint64_t>() : 0}});
      break;
    }
    ignore("frame type " + std::to_string(static_cast<int>(f->type)) +
           " before the watch started on stream " + std::to_string(id));
    if (f->type == Type::data) grant(id, *st, f->channel, static_cast<uint32_t>(f->payload.size()));
  }
  std::string partial;  // an incomplete last line, at most kMaxWatchLine
  bool stopping = false;
  Deadline until{};
  auto stop = [&] {
    if (stopping) return;
    stopping = true;
    try {
      send(Frame{Type::eof, kIn, id, {}});
    } catch (const Error&) {
      // The connection died meanwhile: wait_frame reports it.
    }
    until = Clock::now() + kKillGrace;
  };
  for (;;) {
    std::optional<Frame> f;
    try {
      f = wait_frame(*st, stopping ? until : Clock::now() + handlers.tick, false);
    } catch (const Error& e) {
      if (e.code() != Errc::timeout) throw;
      if (stopping) {
        // The guest did not confirm; the stream is abandoned (its late
        // frames are dropped as frames for a closed stream).
        return {{"reason", "cancelled"}, {"events", 0}, {"dropped", 0}};
      }
      if (handlers.on_idle && !handlers.on_idle()) stop();
      continue;
    }
    if (f->type == Type::response) {
      auto j = parse_response(*f);
      nlohmann::json out{{"reason", "ended"}, {"events", 0}, {"dropped", 0}};
      if (auto r = j.find("reason");
          r != j.end() && r->is_string() && r->get_ref<const std::string&>().size() <= 64)
        out["reason"] = *r;
      for (const char* k : {"events", "dropped"})
        if (auto v = j.find(k); v != j.end() && v->is_number_unsigned()) out[k] = *v;
      if (auto m = j.find("message");
          m != j.end() && m->is_string() && m->get_ref<const std::string&>().size() <= 4096)
        out["message"] = *m;
      return out;
    }
    if (f->type != Type::data) {
      ignore("frame type " + std::to_string(static_cast<int>(f->type)) + " on watch stream " +
             std::to_string(id));
      continue;
    }
    if (f->channel != kOut) throw Error(Errc::guest_error, "watch data on stderr from the guest");
    const uint32_t n = static_cast<uint32_t>(f->payload.size());
    if (!stopping) {
      partial += f->payload;
      size_t start = 0;
      for (size_t nl; !stopping && (nl = partial.find('\n', start)) != std::string::npos;
           start = nl + 1) {
        std::string_view line(partial.data() + start, nl - start);
        std::string why;
        auto ev = check_watch_event(line, why);
        if (!ev) {
          ignore("watch event on stream " + std::to_string(id) + ": " + why);
          continue;
        }
        if (handlers.on_event && !handlers.on_event(*ev)) stop();
      }
      partial.erase(0, start);
      if (partial.size() > kMaxWatchLine)
        throw Error(Errc::guest_error, "guest sent a watch event line over " +
                                           std::to_string(kMaxWatchLine) + " bytes");
    }
    // Only now: the consumer has taken the events.
    try {
      grant(id, *st, kOut, n);
    } catch (const Error&) {
      if (!stopping) throw;
    }
  }
}

}  // namespace airlock::channel

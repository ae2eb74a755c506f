// GuestChannel::attach: resuming a detached foreground exec from an offset of
// its output log (api/guest-protocol.md §5, "Detach and attach"). Split from
// guest_channel.cc.
#include "common/error.h"
#include "engine/channel/guest_channel.h"
#include "engine/channel/guest_channel_detail.h"
#include "protocol/messages.h"

namespace airlock::channel {

using detail::kKillGrace;
using detail::parse_response;
using detail::StreamGuard;
using protocol::Frame;
using protocol::Type;

namespace {

// A non-negative integer field of the guest's `attached` event, or nullopt.
std::optional<uint64_t> count(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_unsigned()) return std::nullopt;
  return it->get<uint64_t>();
}

// j[key] is the JSON value true (anything else, of any type, is not).
bool is_true(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && *it == true;
}

}  // namespace

nlohmann::json GuestChannel::attach(const std::string& exec_id, uint64_t offset,
                                    const AttachHandlers& handlers, Deadline start_deadline) {
  const uint32_t id = open_stream();
  auto st = register_stream(id);
  StreamGuard guard{[&] { unregister_stream(id); }};
  if (handlers.on_stream) handlers.on_stream(id);
  send(protocol::json_frame(Type::request, id,
                            {{"op", "attach"}, {"exec_id", exec_id}, {"offset", offset}}));
  bool attached = false, detaching = false;
  uint64_t at = offset;  // the next byte's offset, as far as the host counted
  Deadline detach_deadline{};
  auto detach = [&] {
    if (detaching) return;
    detaching = true;
    detach_deadline = Clock::now() + kKillGrace;
    try {
      send(protocol::json_frame(Type::signal, id, {{"detach", true}}));
    } catch (const Error&) {
      // The connection died meanwhile; the wait below reports that.
    }
  };
  for (;;) {
    Deadline until = detaching  ? detach_deadline
                     : attached ? Clock::now() + handlers.tick
                                : std::min(start_deadline, Clock::now() + handlers.tick);
    std::optional<Frame> f;
    try {
      f = wait_frame(*st, until, false);
    } catch (const Error& e) {
      if (e.code() != Errc::timeout || detaching) throw;
      if (!attached && Clock::now() >= start_deadline) throw;
      if (handlers.cancelled && handlers.cancelled()) detach();
      continue;
    }
    if (!f) continue;
    switch (f->type) {
      case Type::event: {
        nlohmann::json j;
        try {
          j = protocol::parse_json(*f);
        } catch (const Error& e) {
          ignore("attach event: " + std::string(e.what()));
          break;
        }
        auto first = count(j, "offset");
        // Once, before any output, and never before the offset asked for.
        if (attached || !j.is_object() || !is_true(j, "attached") || !first || *first < offset) {
          ignore("attach event on stream " + std::to_string(id) +
                 " out of place: " + j.dump().substr(0, 200));
          break;
        }
        attached = true;
        at = *first;
        nlohmann::json ev{{"offset", *first},
                          {"dropped", *first - offset},
                          {"end", count(j, "end").value_or(*first)},
                          {"lost", count(j, "lost").value_or(0)},
                          {"running", !j.contains("running") || is_true(j, "running")}};
        if (auto p = count(j, "pid"); p && *p > 0 && *p <= INT32_MAX) ev["pid"] = *p;
        if (handlers.on_attached) handlers.on_attached(ev);
        break;
      }
      case Type::data: {
        uint32_t n = static_cast<uint32_t>(f->payload.size());
        if (!attached) {
          ignore("attach data before the attached event");
        } else if (!detaching && (f->channel == 1 || f->channel == 2)) {
          at += n;
          if (handlers.on_output && !handlers.on_output(f->channel, f->payload)) detach();
        }
        grant(id, *st, f->channel, n);
        break;
      }
      case Type::response: {
        auto j = parse_response(*f);
        if (j.is_object() && is_true(j, "detached")) return {{"detached", true}, {"offset", at}};
        return j;
      }
      default:
        break;  // eof: the response follows
    }
  }
}

}  // namespace airlock::channel

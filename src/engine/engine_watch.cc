// File watches on a running sandbox (engine.h watch_files): one guest
// `watch` stream per call, driven on the caller's thread like exec output.
#include <spdlog/spdlog.h>

#include <chrono>

#include "common/error.h"
#include "engine/channel/guest_client.h"
#include "engine/engine.h"
#include "engine/engine_impl.h"
#include "engine/validate.h"

namespace airlock::engine {

namespace {
using channel::Clock;
constexpr auto kWatchStartTimeout = std::chrono::seconds(60);
}  // namespace

WatchEnd Engine::watch_files(const std::string& id, const std::string& path, bool recursive,
                             const WatchCallbacks& callbacks) {
  auto& impl = *impl_;
  auto sb = impl.table.running(id);
  validate_guest_path(path);
  // Only the start counts as activity: a watch alone does not keep an idle
  // sandbox alive (idle_timeout is about work done in it).
  { ActivityGuard active(*sb); }
  WatchEnd end;
  bool started = false;
  // The channel's checked `watching` event and events go to the API as they
  // are (WatchCallbacks documents their fields): the engine reads none.
  channel::WatchHandlers h;
  h.on_start = [&](const nlohmann::json& w) {
    started = true;
    if (callbacks.on_start) callbacks.on_start(w);
  };
  h.on_event = [&](const nlohmann::json& e) {
    return callbacks.on_event ? callbacks.on_event(e) : true;
  };
  h.on_idle = [&] { return callbacks.on_idle ? callbacks.on_idle() : true; };
  nlohmann::json audit{{"op", "watch"}, {"path", path}, {"recursive", recursive}};
  auto record = [&] {
    try {
      impl.journal.append(id, "file", audit);
    } catch (const std::exception& a) {
      spdlog::error("sandbox {}: audit: {}", id, a.what());
    }
  };
  channel::WatchReply r;
  try {
    r = channel::watch(*sb->channel, path, recursive, h, Clock::now() + kWatchStartTimeout);
  } catch (const Error& e) {
    if (!started) {
      audit["error"] = e.what();
      record();
      // The guest's path errors are about the caller's path.
      if (e.code() == Errc::invalid_argument || e.code() == Errc::not_found)
        throw Error(e.code(), e.what(), "path");
      auto [st, failure, reason] = sb->wait_ended(
          sb->channel->closed() ? std::chrono::milliseconds(5000) : std::chrono::milliseconds(0));
      if (st == State::running) throw;
      throw Error(Errc::conflict, "sandbox " + id + " was stopped (" + std::string(to_string(st)) +
                                      (reason.empty() ? "" : ": " + reason) + ")");
    }
    // Mid-stream: the sandbox going away ends the watch; anything else is
    // the guest's failure and is reported as such.
    auto [st, failure, reason] = sb->wait_ended(
        sb->channel->closed() ? std::chrono::milliseconds(5000) : std::chrono::milliseconds(0));
    if (st == State::running) {
      audit["error"] = e.what();
      record();
      throw;
    }
    end.reason = "sandbox_stopped";
    end.message = "sandbox " + id + " was stopped (" + std::string(to_string(st)) +
                  (reason.empty() ? "" : ": " + reason) + ")";
    audit["reason"] = end.reason;
    record();
    return end;
  }
  end.reason = r.reason;
  end.message = r.message;
  end.events = r.events;
  end.dropped = r.dropped;
  audit.update({{"reason", end.reason}, {"events", end.events}, {"dropped", end.dropped}});
  record();
  return end;
}

}  // namespace airlock::engine

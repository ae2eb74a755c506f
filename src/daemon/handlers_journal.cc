// GET .../journal/verify, GET .../events (follow), GET .../changes.
#include <chrono>

#include "common/error.h"
#include "daemon/handlers.h"
#include "daemon/request.h"
#include "engine/types_json.h"

namespace airlock::daemon {
namespace {

using nlohmann::json;

void no_body(Exchange& ex) {
  if (!ex.read_body(64 * 1024).empty())
    throw Error(Errc::invalid_argument, "this request takes no body", "body");
}

// The whole journal: a JSON array, or with follow an NDJSON stream of every
// record as it is appended (the JournalReader reads only what is new and
// sleeps on inotify), until the sandbox ends or the client hangs up.
void stream_events(engine::Engine& engine, Exchange& ex, const std::string& id, bool follow) {
  bool alive = engine::holds_resources(engine.get(id).state);  // state first: see handle_network_events
  auto follower = engine.follow_journal(id);
  auto records = follower->next();
  if (!follow) {
    json arr = json::array();
    for (auto& r : records) arr.push_back(std::move(r));
    ex.send_json(200, arr);
    return;
  }
  ex.begin_stream("application/x-ndjson");
  try {
    while (true) {
      for (const auto& r : records) {
        if (!ex.write_chunk(r.dump(-1, ' ', false, json::error_handler_t::replace) + "\n")) {
          ex.abort_stream();
          return;
        }
      }
      if (!alive) break;
      using Wake = engine::RecordFollower::Wake;
      if (follower->wait(std::chrono::milliseconds(500), ex.native_handle()) == Wake::hangup) {
        ex.abort_stream();
        return;
      }
      alive = engine::holds_resources(engine.get(id).state);
      records = follower->next();
    }
  } catch (const Error& e) {
    ex.write_chunk(error_body(to_string(e.code()), e.what(), e.field()).dump() + "\n");
  } catch (const std::exception& e) {
    ex.write_chunk(error_body("internal", e.what()).dump() + "\n");
  }
  ex.end_stream();
}

}  // namespace

void handle_journal_route(engine::Engine& engine, Exchange& ex, Route route, const std::string& id,
                          const std::map<std::string, std::string>& q) {
  switch (route) {
    case Route::journal_verify:
      check_query_keys(q, {});
      no_body(ex);
      engine.get(id);  // an unknown id is a 404 even when a stray journal exists
      ex.send_json(200, engine.verify_journal(id));
      return;
    case Route::events:
      check_query_keys(q, {"follow"});
      no_body(ex);
      stream_events(engine, ex, id, query_bool(q, "follow", false));
      return;
    case Route::changes: {
      check_query_keys(q, {"since", "content"});
      no_body(ex);
      auto it = q.find("since");
      std::string since = it == q.end() ? "start" : it->second;
      ex.send_json(200, engine.changes(id, since, query_bool(q, "content", false)));
      return;
    }
    default:
      throw Error(Errc::internal, "not a journal route");
  }
}

}  // namespace airlock::daemon

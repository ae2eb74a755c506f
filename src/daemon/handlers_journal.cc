// GET .../journal/verify, GET .../events (follow), GET .../changes.
#include <chrono>

#include "common/error.h"
#include "daemon/handlers.h"
#include "daemon/request.h"
#include "engine/types_json.h"

namespace airlock::daemon {
namespace {

using nlohmann::json;

// These routes take no body; one over this is refused as too large.
constexpr uint64_t kJournalQueryBody = 64 * 1024;

}  // namespace

void send_records(engine::SandboxService& engine, Exchange& ex, const std::string& id, RecordLog log,
                  bool follow) {
  // State first, records second: whatever the sandbox recorded before it
  // ended is in the batch fetched after seeing it ended. Both calls come
  // before the stream starts, so an unknown id is a plain 404.
  bool alive = engine::holds_resources(engine.get(id).state);
  std::unique_ptr<engine::RecordFollower> follower =
      log == RecordLog::journal ? engine.follow_journal(id) : engine.follow_network_events(id);
  // A journal record may carry a guest's bytes that are not UTF-8: they are
  // replaced rather than ending the stream.
  auto dump = [log](const json& r) {
    return log == RecordLog::journal ? r.dump(-1, ' ', false, json::error_handler_t::replace)
                                     : r.dump();
  };
  std::vector<json> records = follower->next();
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
        if (!ex.write_chunk(dump(r) + "\n")) {
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

namespace serve {

void journal_verify(const RouteContext& c) {
  check_query_keys(c.query, {});
  expect_no_body(c.ex, kJournalQueryBody);
  c.engine.get(c.id);  // an unknown id is a 404 even when a stray journal exists
  c.ex.send_json(200, c.engine.verify_journal(c.id));
}

void events(const RouteContext& c) {
  check_query_keys(c.query, {"follow"});
  expect_no_body(c.ex, kJournalQueryBody);
  send_records(c.engine, c.ex, c.id, RecordLog::journal, query_bool(c.query, "follow", false));
}

void changes(const RouteContext& c) {
  check_query_keys(c.query, {"since", "content"});
  expect_no_body(c.ex, kJournalQueryBody);
  auto it = c.query.find("since");
  std::string since = it == c.query.end() ? "start" : it->second;
  c.ex.send_json(200, c.engine.changes(c.id, since, query_bool(c.query, "content", false)));
}

}  // namespace serve
}  // namespace airlock::daemon

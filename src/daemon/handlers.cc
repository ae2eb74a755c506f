// Dispatch: the route table's row for a request, its Access checked once,
// then its handler (handlers_*.cc).
#include "daemon/handlers.h"

#include <spdlog/spdlog.h>

#include "daemon/request.h"
#include "daemon/router.h"
#include "daemon/tenancy.h"

namespace airlock::daemon {
namespace {

void send_no_route(Exchange& ex) {
  ex.send_error(404, "not_found",
                "no route for " + std::string(ex.method()) + " " + std::string(ex.path()));
}

// Who may call the route, from its row, before anything is read. False if
// the request was answered here (an operator route asked by a tenant);
// another tenant's sandbox or snapshot throws the not_found of a missing one.
bool admitted(engine::SandboxService& engine, Exchange& ex, const Principal& who, const RouteMatch& m) {
  if (who.is_operator()) return true;
  switch (m.spec->access) {
    case Access::operator_only:
      // The host's own business: a tenant sees these routes as absent.
      // An upload is read first, so its client gets the answer rather
      // than a broken pipe.
      ex.discard_body();
      send_no_route(ex);
      return false;
    case Access::own_sandbox:
      // Another tenant's sandbox is answered exactly like one that does
      // not exist (404).
      visible_sandbox(engine, who, m.id);
      return true;
    case Access::own_snapshot:
      visible_snapshot(engine, who, m.id);
      return true;
    case Access::anyone:
    case Access::tenant:
      return true;
  }
  return true;
}

void dispatch(engine::SandboxService& engine, Exchange& ex, const Caller& caller) {
  RouteMatch m = match_route(ex.method(), ex.path());
  if (m.status == RouteStatus::not_found) {
    send_no_route(ex);
    return;
  }
  if (m.status == RouteStatus::method_not_allowed) {
    ex.send_error(405, "method_not_allowed",
                  std::string(ex.method()) + " is not allowed on " + std::string(ex.path()) +
                      " (allowed: " + m.allow + ")",
                  m.allow);
    return;
  }
  if (!m.id.empty()) check_id(m.id, "id");
  if (!m.exec_id.empty()) check_id(m.exec_id, "exec_id");
  if (!admitted(engine, ex, caller.who, m)) return;
  const Query query = parse_query(ex.query());
  m.spec->handler({engine, ex, caller, m.id, m.exec_id, m.host_port, query});
}

}  // namespace

void expect_no_body(Exchange& ex, uint64_t limit) {
  if (!ex.read_body(limit).empty())
    throw Error(Errc::invalid_argument, "this request takes no body", "body");
}

nlohmann::json sandbox_json(const engine::SandboxInfo& info) {
  nlohmann::json j = engine::to_json(info);
  if (!j.contains("network")) j["network"] = info.spec.network;
  return j;
}

void end_stream_with_error(Exchange& ex, nlohmann::json error) {
  error["type"] = "error";
  ex.write_chunk(error.dump() + "\n");
  ex.end_stream();
}

void answer_errors(Exchange& ex, const std::function<void()>& fn) {
  auto answered = [&ex](std::string_view what) {
    if (!ex.responded()) return false;
    // The stream already reported the error in its own lines, or it must be cut.
    spdlog::warn("{} {}: error after the answer began: {}", ex.method(), ex.path(), what);
    if (ex.stream_open()) ex.abort_stream();
    return true;
  };
  try {
    fn();
  } catch (const Error& e) {
    if (!answered(e.what())) ex.send_error(e);
  } catch (const std::exception& e) {
    spdlog::error("{} {}: unexpected exception: {}", ex.method(), ex.path(), e.what());
    if (!answered(e.what()))
      ex.send_error(500, "internal", std::string("internal error: ") + e.what());
  }
}

void handle(engine::SandboxService& engine, Exchange& ex, const Caller& caller) {
  answer_errors(ex, [&] { dispatch(engine, ex, caller); });
}

}  // namespace airlock::daemon

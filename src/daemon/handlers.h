// The API handlers: route an Exchange to the engine (internal to airlockd).
#pragma once

#include <functional>

#include "daemon/exchange.h"
#include "daemon/principal.h"
#include "daemon/router.h"
#include "engine/engine.h"

namespace airlock::auth {
class Auth;
}

namespace airlock::daemon {

struct RouteMatch;

// Who asks and through what: the server's counters, the principal it
// computed (principal.h), the daemon's tokens/quotas/audit log and the
// peer address ("unix" for the socket file).
struct Caller {
  ServerCounters& counters;
  const Principal& who;
  auth::Auth* auth;  // null only in tests without auth: the token routes then 503
  std::string source;
};

// Runs `fn`, which answers `ex`; what it throws is answered in the one
// error style (airlock::Error as its HTTP status, anything else 500). Once
// an answer began nothing more is written, except that a stream left open
// is aborted so its client sees a truncated body instead of waiting.
// Never throws.
void answer_errors(Exchange& ex, const std::function<void()>& fn);

// Answers one request. Never throws for anything a client can cause:
// airlock::Error becomes its HTTP status, other exceptions 500.
void handle(engine::Engine& engine, Exchange& ex, const Caller& caller);

// The token and tenant routes (handlers_auth.cc). Operator only: dispatch
// answers anyone else from the route table (Access) before calling.
void handle_auth_route(engine::Engine& engine, Exchange& ex, const Caller& caller,
                       const RouteMatch& m);

// The image routes (handlers_images.cc): operator only, like the above.
void handle_image_route(engine::Engine& engine, Exchange& ex, const RouteMatch& m);

// The journal and disk-diff routes (handlers_journal.cc): journal_verify,
// events, changes. `query` is the request's parsed query string.
void handle_journal_route(engine::Engine& engine, Exchange& ex, Route route, const std::string& id,
                          const std::map<std::string, std::string>& query);

// GET .../exec/{exec_id}?offset=N (handlers_attach.cc): attach to an exec
// that outlived its client and stream its output from byte N.
void handle_attach_exec(engine::Engine& engine, Exchange& ex, const std::string& id,
                        const std::string& exec_id, const std::string& offset);

// Pause, resume, snapshots, fork (handlers_snapshots.cc).
enum class Route;
bool is_snapshot_route(Route route);
// A tenant sees its own snapshots only (daemon/tenancy.h): another
// tenant's name is answered like one that does not exist; its resumes and
// forks hold its quota like creates.
void handle_snapshot_route(engine::Engine& engine, Exchange& ex, const RouteMatch& m,
                           const Caller& caller);

// POST /v1/images/build (handlers_recipes.cc): operator only (checked by
// the caller); the recipe's progress as NDJSON.
void handle_build_image(engine::Engine& engine, Exchange& ex);

}  // namespace airlock::daemon

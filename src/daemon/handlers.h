// The API handlers: route an Exchange to the engine (internal to airlockd).
// handle() matches the request against the route table (router.h), checks
// the row's Access once, and calls the row's handler: one function per
// operation in namespace serve, each in the handlers_*.cc of its area.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "daemon/exchange.h"
#include "daemon/principal.h"
#include "daemon/request.h"
#include "daemon/router.h"
#include "engine/api/service.h"

namespace airlock::auth {
class Auth;
}

namespace airlock::daemon {

// Who asks and through what: the server's counters, the principal it
// computed (principal.h), the daemon's tokens/quotas/audit log and the
// peer address ("unix" for the socket file).
struct Caller {
  ServerCounters& counters;
  const Principal& who;
  auth::Auth* auth;  // null only in tests without auth: the token routes then 503
  std::string source;
};

// What a route's handler is given. Its Access was checked before the call,
// and the ids passed check_id; the handler checks its own query keys.
struct RouteContext {
  engine::SandboxService& engine;
  Exchange& ex;
  const Caller& caller;
  const std::string& id;         // {id}, or empty
  const std::string& exec_id;    // {exec_id}, or empty
  const std::string& host_port;  // {host_port} as given, or empty
  const Query& query;            // the parsed query string
};

// Runs `fn`, which answers `ex`; what it throws is answered in the one
// error style (airlock::Error as its HTTP status, anything else 500). Once
// an answer began nothing more is written, except that a stream left open
// is aborted so its client sees a truncated body instead of waiting.
// Never throws.
void answer_errors(Exchange& ex, const std::function<void()>& fn);

// Answers one request. Never throws for anything a client can cause:
// airlock::Error becomes its HTTP status, other exceptions 500.
void handle(engine::SandboxService& engine, Exchange& ex, const Caller& caller);

// Request bodies of routes that take none must be empty: a stray body is
// more likely a client bug than something to ignore. Error(invalid_argument)
// if there is one, Error(payload_too_large) above `limit`.
void expect_no_body(Exchange& ex, uint64_t limit = kMaxJsonBody);

// A sandbox as the API shows it. The policy is always included, also by an
// engine whose JSON form predates the network field.
nlohmann::json sandbox_json(const engine::SandboxInfo& info);

// The meaning of a policy's entries (CIDRs, names, the always-deny set), so
// a bad policy is a 400 naming the entry before the engine does anything
// (handlers_network.cc).
void check_policy(const nlohmann::json& policy);

// Ends a begun NDJSON stream with {"type":"error","error":{...}}, `error`
// being an error_body().
void end_stream_with_error(Exchange& ex, nlohmann::json error);

// A sandbox's records (handlers_journal.cc): a JSON array, or with follow an
// NDJSON stream of each as it is appended (the follower reads only what is
// new and sleeps until the log grows, the socket hangs up, or 500 ms pass to
// see the sandbox end), until the sandbox ends or the client hangs up.
enum class RecordLog { journal, network_events };
void send_records(engine::SandboxService& engine, Exchange& ex, const std::string& id, RecordLog log,
                  bool follow);

// GET .../exec/{exec_id}?offset=N (handlers_attach.cc): attach to an exec
// that outlived its client and stream its output from byte N.
void handle_attach_exec(engine::SandboxService& engine, Exchange& ex, const std::string& id,
                        const std::string& exec_id, const std::string& offset);

// One handler per row of the route table (routes.cc), by area.
namespace serve {

// The daemon itself (handlers_daemon.cc).
void info(const RouteContext& c);
void get_pool(const RouteContext& c);  // warm pool state
void set_pool(const RouteContext& c);  // warm pool size and shape for one image
void metrics(const RouteContext& c);   // Prometheus text exposition
void healthz(const RouteContext& c);   // liveness: the daemon answers
void readyz(const RouteContext& c);    // readiness: a create can succeed

// Sandboxes (handlers_sandboxes.cc).
void create_sandbox(const RouteContext& c);
void list_sandboxes(const RouteContext& c);
void get_sandbox(const RouteContext& c);
void delete_sandbox(const RouteContext& c);
void sandbox_stats(const RouteContext& c);
void logs(const RouteContext& c);
void guest_info(const RouteContext& c);
void posture(const RouteContext& c);      // the QEMU jail read back from /proc
void set_timeout(const RouteContext& c);  // move a running sandbox's expiry

// Execs (handlers_exec.cc).
void exec(const RouteContext& c);
void list_execs(const RouteContext& c);
void get_exec(const RouteContext& c);    // wait for it, or attach (?offset=N)
void exec_stdin(const RouteContext& c);  // a streamed stdin: its body is never capped
void kill_exec(const RouteContext& c);
void pty(const RouteContext& c);  // WebSocket: an interactive terminal (pty.h)

// Files in the guest (handlers_files.cc).
void put_file(const RouteContext& c);
void get_file(const RouteContext& c);
void delete_file(const RouteContext& c);
void list_files(const RouteContext& c);
void stat_file(const RouteContext& c);
void make_dir(const RouteContext& c);
void move_file(const RouteContext& c);    // rename in the guest
void watch_files(const RouteContext& c);  // NDJSON stream of changes under a directory

// Network policy and ports (handlers_network.cc).
void set_network(const RouteContext& c);
void network_events(const RouteContext& c);
void add_port(const RouteContext& c);
void list_ports(const RouteContext& c);
void remove_port(const RouteContext& c);

// The journal and the disk diff (handlers_journal.cc).
void journal_verify(const RouteContext& c);  // the journal's hash chain checked
void events(const RouteContext& c);          // the whole journal, JSON or a live NDJSON stream
void changes(const RouteContext& c);         // filesystem diff since the sandbox started

// Tokens and tenants (handlers_auth.cc), operator only.
void create_token(const RouteContext& c);
void list_tokens(const RouteContext& c);
void delete_token(const RouteContext& c);
void list_tenants(const RouteContext& c);  // quotas and usage
void set_tenant(const RouteContext& c);    // PUT a tenant's quota

// Pause, resume, snapshots, fork (handlers_snapshots.cc). A tenant sees its
// own snapshots only (daemon/tenancy.h); its resumes and forks hold its
// quota like creates.
void pause(const RouteContext& c);
void resume(const RouteContext& c);
void create_snapshot(const RouteContext& c);
void list_snapshots(const RouteContext& c);
void get_snapshot(const RouteContext& c);  // {id} is the snapshot's name
void delete_snapshot(const RouteContext& c);
void save_snapshot_image(const RouteContext& c);  // {name}: `airlock image save`
void fork(const RouteContext& c);

// Images (handlers_images.cc), operator only.
void list_images(const RouteContext& c);
void get_image(const RouteContext& c);
void delete_image(const RouteContext& c);
void import_image(const RouteContext& c);  // body: docker save / OCI layout tar
void disk_usage(const RouteContext& c);
void prune(const RouteContext& c);

// An image from a recipe, NDJSON progress (handlers_recipes.cc), operator only.
void build_image(const RouteContext& c);

}  // namespace serve
}  // namespace airlock::daemon

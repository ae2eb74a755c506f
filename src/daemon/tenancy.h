// Tenant isolation and quotas for every surface that touches sandboxes (the
// native handlers and the extensions, e.g. src/e2b): what a principal may
// see, and creates that belong to it and fit its quota.
//
//   auto sb = visible_sandbox(engine, who, id);         // or 404, as if no such id
//   auto made = create_sandbox_as(engine, who, spec);   // tenant set, quota held, audited
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "daemon/principal.h"
#include "engine/api/service.h"

namespace airlock::auth {
class Auth;
}

namespace airlock::daemon {

// The daemon's tokens/quotas/audit log (set once by Server::set_auth), for
// code that is handed only a Principal (extensions). Null in tests without.
auth::Auth* daemon_auth();
void set_daemon_auth(auth::Auth* auth);

// The sandbox `id` if `who` may see it; else exactly the engine's answer for
// an id that does not exist: Error(not_found, "no sandbox <id>", "id").
engine::SandboxInfo visible_sandbox(engine::SandboxService& engine, const Principal& who,
                                    const std::string& id);

// engine.list(filter, all) without the sandboxes `who` may not see.
std::vector<engine::SandboxInfo> visible_sandboxes(
    engine::SandboxService& engine, const Principal& who,
    const std::map<std::string, std::string>& filter = {}, bool all = false);

// Creates `spec` for `who`: spec.tenant = who.owner() (whatever it said
// before), and for a tenant within its quota (auth/quotas.h: a reservation
// is held until the create returns, so concurrent creates cannot overshoot;
// over a limit: 429 quota_exceeded / rate_limited naming it, and nothing
// is created). Tenant creates, refusals included, go to the audit log.
engine::SandboxInfo create_sandbox_as(engine::SandboxService& engine, const Principal& who,
                                      engine::SandboxSpec spec, const std::string& source = "tcp");

// Resumes `id` for `who`. A tenant's resume reserves its quota like a
// create (the sandbox's own memory_mb and disk_mb against what the tenant's
// other sandboxes hold): a quota lowered while it was paused is a 429
// quota_exceeded naming the limit, and it stays paused. Audited.
engine::SandboxInfo resume_sandbox_as(engine::SandboxService& engine, const Principal& who,
                                      const std::string& id, const std::string& source = "tcp");

// Forks `id` `count` times for `who`: a tenant's forks are creates (each
// reserves the source's shape; over a limit nothing is forked). Audited.
std::vector<engine::SandboxInfo> fork_sandbox_as(engine::SandboxService& engine, const Principal& who,
                                                 const std::string& id, int count,
                                                 const std::string& source = "tcp");

// Snapshot `name` (engine.get_snapshot's JSON) if `who` may use it: the
// operator every one, a tenant the snapshots of its own sandboxes. Another
// tenant's is answered exactly like a name that does not exist (404 "no
// snapshot NAME", field "name").
nlohmann::json visible_snapshot(engine::SandboxService& engine, const Principal& who,
                                const std::string& name);
// engine.list_snapshots() without the ones `who` may not see.
nlohmann::json visible_snapshots(engine::SandboxService& engine, const Principal& who);

// GET /v1/info as a tenant sees it: what it needs to create sandboxes
// (version, accelerator, the images it may boot: global and its own) and
// nothing of the host or of others: no data dir or other host paths, no
// pool members (ids a tenant will be handed), no templates, no daemon pid
// or connection counts. `full` is Engine::info().
nlohmann::json tenant_info(engine::SandboxService& engine, const Principal& who,
                           const nlohmann::json& full);
// GET .../posture as a tenant sees it: its own QEMU's jail without host
// identifiers (the host pid, namespace inode ids, host paths).
nlohmann::json tenant_posture(nlohmann::json posture);

// What `tenant` holds now: its sandboxes in a state that holds resources
// (engine::holds_resources: paused ones too) and their sizes.
struct TenantUsage {
  int64_t sandboxes = 0, memory_mb = 0, disk_mb = 0;
};
// `except`: a sandbox not to count (the one a resume reserves for).
std::map<std::string, TenantUsage> tenant_usage(engine::SandboxService& engine,
                                                const std::string& except = "");

}  // namespace airlock::daemon

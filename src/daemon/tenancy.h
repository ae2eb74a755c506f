// Tenant isolation and quotas for every surface that touches sandboxes (the
// native handlers and the extensions, e.g. src/e2b): what a principal may
// see, and creates that belong to it and fit its quota.
//
//   auto sb = visible_sandbox(engine, who, id);         // or 404, as if no such id
//   auto made = create_sandbox_as(engine, who, spec);   // tenant set, quota held, audited
#pragma once

#include <map>
#include <string>
#include <vector>

#include "daemon/principal.h"
#include "engine/engine.h"

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
engine::SandboxInfo visible_sandbox(engine::Engine& engine, const Principal& who,
                                    const std::string& id);

// engine.list(filter, all) without the sandboxes `who` may not see.
std::vector<engine::SandboxInfo> visible_sandboxes(
    engine::Engine& engine, const Principal& who,
    const std::map<std::string, std::string>& filter = {}, bool all = false);

// Creates `spec` for `who`: spec.tenant = who.owner() (whatever it said
// before), and for a tenant within its quota (auth/quotas.h: a reservation
// is held until the create returns, so concurrent creates cannot overshoot;
// over a limit: 429 quota_exceeded / rate_limited naming it, and nothing
// is created). Tenant creates, refusals included, go to the audit log.
engine::SandboxInfo create_sandbox_as(engine::Engine& engine, const Principal& who,
                                      engine::SandboxSpec spec, const std::string& source = "tcp");

// What `tenant` holds now: its live (not ended) sandboxes and their sizes.
struct TenantUsage {
  int64_t sandboxes = 0, memory_mb = 0, disk_mb = 0;
};
std::map<std::string, TenantUsage> tenant_usage(engine::Engine& engine);

}  // namespace airlock::daemon

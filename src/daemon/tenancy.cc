#include "daemon/tenancy.h"

#include <atomic>

#include "auth/auth.h"
#include "common/error.h"

namespace airlock::daemon {

namespace {
std::atomic<auth::Auth*> g_auth{nullptr};

// A sandbox that still holds resources (counts against its tenant's quota).
bool holds_resources(engine::State s) {
  return s == engine::State::starting || s == engine::State::running ||
         s == engine::State::stopping;
}
}  // namespace

auth::Auth* daemon_auth() { return g_auth.load(); }
void set_daemon_auth(auth::Auth* auth) { g_auth = auth; }

engine::SandboxInfo visible_sandbox(engine::Engine& engine, const Principal& who,
                                    const std::string& id) {
  engine::SandboxInfo info = engine.get(id);
  if (!who.can_see(info.spec.tenant)) throw Error(Errc::not_found, "no sandbox " + id, "id");
  return info;
}

std::vector<engine::SandboxInfo> visible_sandboxes(engine::Engine& engine, const Principal& who,
                                                   const std::map<std::string, std::string>& filter,
                                                   bool all) {
  std::vector<engine::SandboxInfo> out;
  for (auto& sb : engine.list(filter, all))
    if (who.can_see(sb.spec.tenant)) out.push_back(std::move(sb));
  return out;
}

std::map<std::string, TenantUsage> tenant_usage(engine::Engine& engine) {
  std::map<std::string, TenantUsage> usage;
  for (const auto& sb : engine.list({}, false)) {
    if (sb.spec.tenant.empty() || !holds_resources(sb.state)) continue;
    auto& u = usage[sb.spec.tenant];
    u.sandboxes += 1;
    u.memory_mb += sb.spec.memory_mb;
    u.disk_mb += sb.spec.disk_mb;
  }
  return usage;
}

engine::SandboxInfo create_sandbox_as(engine::Engine& engine, const Principal& who,
                                      engine::SandboxSpec spec, const std::string& source) {
  if (who.kind == Principal::Kind::anonymous)
    throw Error(Errc::unauthenticated, "authentication required");
  spec.tenant = who.owner();
  auth::Auth* a = daemon_auth();
  if (!a) return engine.create(spec);
  auto audit = [&](const std::string& outcome, int status, const std::string& id,
                   const std::string& detail) {
    nlohmann::json r = {{"source", source}, {"tenant", who.tenant},      {"token_id", who.token_id},
                        {"method", "POST"}, {"route", "create_sandbox"}, {"outcome", outcome},
                        {"status", status}};
    if (!id.empty()) r["sandbox"] = id;
    if (!detail.empty()) r["detail"] = detail;
    a->audit().append(std::move(r));
  };
  std::unique_ptr<auth::Quotas::Reservation> held;
  if (who.is_operator()) {
    engine::SandboxInfo info = engine.create(spec);  // the operator has no quota
    audit("sandbox_created", 201, info.id, "");
    return info;
  }
  try {
    held = a->quotas().reserve(who.tenant, spec.memory_mb, spec.disk_mb, [&] {
      TenantUsage u = tenant_usage(engine)[who.tenant];
      return auth::Usage{u.sandboxes, u.memory_mb, u.disk_mb};
    });
  } catch (const Error& e) {
    audit(std::string(to_string(e.code())), http_status(e.code()), "", e.what());
    throw;
  }
  engine::SandboxInfo info = engine.create(spec);  // the reservation ends after it
  audit("sandbox_created", 201, info.id, "");
  return info;
}

}  // namespace airlock::daemon

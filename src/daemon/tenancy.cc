#include "daemon/tenancy.h"

#include <atomic>

#include "auth/auth.h"
#include "common/error.h"

namespace airlock::daemon {

namespace {
std::atomic<auth::Auth*> g_auth{nullptr};

// One audit record of a tenant-facing action (creates, resumes, forks).
void audit_action(const Principal& who, const std::string& source, const std::string& route,
                  const std::string& outcome, int status, const std::string& id,
                  const std::string& detail) {
  auth::Auth* a = daemon_auth();
  if (!a) return;
  nlohmann::json r = {{"source", source}, {"tenant", who.tenant}, {"token_id", who.token_id},
                      {"method", "POST"}, {"route", route},       {"outcome", outcome},
                      {"status", status}};
  if (!id.empty()) r["sandbox"] = id;
  if (!detail.empty()) r["detail"] = detail;
  a->audit().append(std::move(r));
}

// Reserves `count` sandboxes of the given size against `who`'s quota (none
// for the operator or without auth); a refusal is audited under `route` and
// rethrown, and nothing stays reserved.
std::vector<std::unique_ptr<auth::Quotas::Reservation>> reserve_as(
    engine::SandboxService& engine, const Principal& who, const std::string& source,
    const std::string& route, int count, int64_t memory_mb, int64_t disk_mb,
    const std::string& except = "", bool counts_as_create = true) {
  std::vector<std::unique_ptr<auth::Quotas::Reservation>> held;
  auth::Auth* a = daemon_auth();
  if (!a || who.is_operator()) return held;
  try {
    for (int i = 0; i < count; ++i)
      held.push_back(a->quotas().reserve(
          who.tenant, memory_mb, disk_mb,
          [&] {
            TenantUsage u = tenant_usage(engine, except)[who.tenant];
            return auth::Usage{u.sandboxes, u.memory_mb, u.disk_mb};
          },
          counts_as_create));
  } catch (const Error& e) {
    audit_action(who, source, route, std::string(to_string(e.code())), http_status(e.code()),
                 except, e.what());
    throw;
  }
  return held;
}
}  // namespace

auth::Auth* daemon_auth() { return g_auth.load(); }
void set_daemon_auth(auth::Auth* auth) { g_auth = auth; }

engine::SandboxInfo visible_sandbox(engine::SandboxService& engine, const Principal& who,
                                    const std::string& id) {
  engine::SandboxInfo info = engine.get(id);
  if (!who.can_see(info.spec.tenant)) throw Error(Errc::not_found, "no sandbox " + id, "id");
  return info;
}

std::vector<engine::SandboxInfo> visible_sandboxes(engine::SandboxService& engine, const Principal& who,
                                                   const std::map<std::string, std::string>& filter,
                                                   bool all) {
  std::vector<engine::SandboxInfo> out;
  for (auto& sb : engine.list(filter, all))
    if (who.can_see(sb.spec.tenant)) out.push_back(std::move(sb));
  return out;
}

std::map<std::string, TenantUsage> tenant_usage(engine::SandboxService& engine, const std::string& except) {
  std::map<std::string, TenantUsage> usage;
  for (const auto& sb : engine.list({}, false)) {
    if (sb.spec.tenant.empty() || !engine::holds_resources(sb.state) || sb.id == except) continue;
    auto& u = usage[sb.spec.tenant];
    u.sandboxes += 1;
    u.memory_mb += sb.spec.memory_mb;
    u.disk_mb += sb.spec.disk_mb;
  }
  return usage;
}

engine::SandboxInfo create_sandbox_as(engine::SandboxService& engine, const Principal& who,
                                      engine::SandboxSpec spec, const std::string& source) {
  if (who.kind == Principal::Kind::anonymous)
    throw Error(Errc::unauthenticated, "authentication required");
  spec.tenant = who.owner();
  // A create from a snapshot takes the snapshot's disk, and a memory
  // snapshot its cpus and memory too (Engine::create): that, not what the
  // body says, is what the quota must hold. A snapshot the tenant may not
  // use is left to the engine, which answers it like an unknown name.
  int64_t memory_mb = spec.memory_mb, disk_mb = spec.disk_mb;
  if (!spec.from.empty() && !who.is_operator()) {
    try {
      nlohmann::json snap = engine.get_snapshot(spec.from);
      if (snap.value("tenant", "") == who.tenant) {
        disk_mb = std::max<int64_t>(disk_mb, snap.value("disk_mb", 0));
        if (snap.value("memory", false)) memory_mb = snap.value("memory_mb", memory_mb);
      }
    } catch (const Error& e) {
      if (e.code() != Errc::not_found && e.code() != Errc::invalid_argument) throw;
    }
  }
  auto held = reserve_as(engine, who, source, "create_sandbox", 1, memory_mb, disk_mb);
  engine::SandboxInfo info = engine.create(spec);  // the reservation ends after it
  audit_action(who, source, "create_sandbox", "sandbox_created", 201, info.id, "");
  return info;
}

engine::SandboxInfo resume_sandbox_as(engine::SandboxService& engine, const Principal& who,
                                      const std::string& id, const std::string& source) {
  engine::SandboxInfo info = visible_sandbox(engine, who, id);
  // Not counted as itself: the reservation asks whether it fits beside the
  // tenant's other sandboxes, as a create of its size would.
  auto held = reserve_as(engine, who, source, "resume_sandbox", 1, info.spec.memory_mb,
                         info.spec.disk_mb, id, /*counts_as_create=*/false);
  engine::SandboxInfo out = engine.resume(id);
  audit_action(who, source, "resume_sandbox", "sandbox_resumed", 200, id, "");
  return out;
}

std::vector<engine::SandboxInfo> fork_sandbox_as(engine::SandboxService& engine, const Principal& who,
                                                 const std::string& id, int count,
                                                 const std::string& source) {
  engine::SandboxInfo info = visible_sandbox(engine, who, id);
  auto held = reserve_as(engine, who, source, "fork_sandbox", count, info.spec.memory_mb,
                         info.spec.disk_mb);
  std::vector<engine::SandboxInfo> forks = engine.fork(id, count);
  for (const auto& f : forks)
    audit_action(who, source, "fork_sandbox", "sandbox_created", 201, f.id, "");
  return forks;
}

nlohmann::json visible_snapshot(engine::SandboxService& engine, const Principal& who,
                                const std::string& name) {
  nlohmann::json snap = engine.get_snapshot(name);  // not_found "no snapshot NAME"
  if (!who.can_see(snap.value("tenant", "")))
    throw Error(Errc::not_found, "no snapshot " + name, "name");
  return snap;
}

nlohmann::json visible_snapshots(engine::SandboxService& engine, const Principal& who) {
  nlohmann::json out = nlohmann::json::array();
  for (auto& s : engine.list_snapshots())
    if (who.can_see(s.value("tenant", ""))) out.push_back(std::move(s));
  return out;
}

nlohmann::json tenant_info(engine::SandboxService& engine, const Principal& who,
                           const nlohmann::json& full) {
  nlohmann::json out = nlohmann::json::object();
  for (const char* k : {"version", "accelerator", "accelerator_reason", "recipes", "limits"})
    if (full.contains(k)) out[k] = full[k];
  if (out.contains("limits")) out["limits"].erase("pool_size");  // the pool is the host's business
  out["images"] = nlohmann::json::array();
  for (const auto& img : engine.list_images()) {
    if (!who.can_see(img.value("tenant", "")) && !img.value("tenant", "").empty()) continue;
    nlohmann::json v = {{"name", img.value("name", "")},
                        {"kernel_release", img.value("kernel_release", "")},
                        {"created_at", img.value("created_at", 0)}};
    if (img.contains("tenant")) v["tenant"] = img["tenant"];
    out["images"].push_back(std::move(v));
  }
  out["daemon"] = {{"version", AIRLOCK_VERSION}};
  return out;
}

namespace {
// Removes host paths (strings starting with '/') from a JSON tree.
void drop_host_paths(nlohmann::json& j) {
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end();) {
      if (it->is_string() && it->get<std::string>().rfind('/', 0) == 0) {
        it = j.erase(it);
        continue;
      }
      drop_host_paths(*it);
      ++it;
    }
  } else if (j.is_array()) {
    for (auto& v : j) drop_host_paths(v);
  }
}
}  // namespace

nlohmann::json tenant_posture(nlohmann::json posture) {
  if (auto p = posture.find("process"); p != posture.end() && p->is_object()) {
    p->erase("pid");
    if (auto ns = p->find("namespaces"); ns != p->end() && ns->is_object())
      for (auto& [name, v] : ns->items())
        if (v.is_object()) v.erase("id");  // host namespace inode numbers
  }
  drop_host_paths(posture);
  return posture;
}

}  // namespace airlock::daemon

#include "e2b/audit.h"

#include "auth/auth.h"
#include "common/error.h"
#include "daemon/tenancy.h"

namespace airlock::e2b {
namespace {

nlohmann::json record(daemon::Exchange& ex, const daemon::Principal& who, const std::string& route,
                      const std::string& sandbox, const std::string& outcome, int status) {
  nlohmann::json r = {{"source", ex.stream().peer},
                      {"method", ex.method()},
                      {"route", route.substr(0, 256)},
                      {"outcome", outcome},
                      {"status", status}};
  if (who.kind == daemon::Principal::Kind::tenant) {
    r["tenant"] = who.tenant;
    r["token_id"] = who.token_id;
  }
  // Ids come from the caller: bounded like the API bounds them.
  if (!sandbox.empty()) r["sandbox"] = sandbox.substr(0, 64);
  return r;
}

}  // namespace

void audit_call(daemon::Exchange& ex, const daemon::Principal& who, const std::string& route,
                const std::string& sandbox, const std::string& outcome) {
  auth::Auth* a = daemon::daemon_auth();
  if (!a || !ex.responded()) return;
  a->audit().append(record(ex, who, route, sandbox, outcome, ex.status()));
}

bool count_envd_auth_failure(daemon::Exchange& ex, const daemon::Principal& who,
                             const std::string& route, const std::string& sandbox) {
  auth::Auth* a = daemon::daemon_auth();
  if (!a || !ex.stream().network) return false;
  bool limited = a->count_failure(ex.stream().peer);
  a->audit().append(record(ex, who, route, sandbox, limited ? "rate_limited" : "unauthenticated",
                           limited ? 429 : 502));
  if (limited)
    ex.send_error(Error(Errc::rate_limited,
                        "too many failed authentications from this address; try again later"));
  return limited;
}

}  // namespace airlock::e2b

// What the E2B surface tells the daemon's security machinery (src/auth):
// its mutating control-plane calls go to the audit log like the native
// API's, and an envd call refused for want of a valid access token counts
// as a failed authentication of its source address, like a wrong API key.
// The one place src/e2b reaches the audit log and the failure limiter.
#pragma once

#include <string>

#include "daemon/exchange.h"
#include "daemon/principal.h"

namespace airlock::e2b {

// One record of a control-plane call that changes something: source (the
// peer address), tenant, token_id, method, `route` (a template, never the
// raw path), outcome ("ok" below 400, else the error code), status and the
// sandbox id if any. Nothing without a daemon Auth (unit tests) or before
// the exchange was answered.
void audit_call(daemon::Exchange& ex, const daemon::Principal& who, const std::string& route,
                const std::string& sandbox, const std::string& outcome);

// An envd call refused because its caller did not prove it may use the
// sandbox (unknown id, another tenant's, missing or wrong access token):
// counted by the daemon's auth-failure limiter against the peer address and
// recorded. Calls over the unix socket (the operator) are never counted.
// True if this failure spent the address's budget: then the call is
// answered 429 as the daemon answers the failure that tips a wrong API key
// over (the caller answers otherwise).
bool count_envd_auth_failure(daemon::Exchange& ex, const daemon::Principal& who,
                             const std::string& route, const std::string& sandbox);

}  // namespace airlock::e2b

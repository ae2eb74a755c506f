// The E2B control plane: the routes of E2B's published REST API that its SDK
// uses, under /e2b/api on airlockd's listener (docs/e2b.md), so E2B's own
// SDK drives airlock with E2B_API_URL=http://HOST:PORT/e2b/api.
//
// Every call goes through the Engine, so it is journaled exactly like the
// native API; a tenant sees only its own sandboxes (another tenant's are
// 404, like ids that never existed); errors use E2B's shape
// {"code": <status>, "message"} because the SDK reads `code` (404 -> "not
// found", 401 -> AuthenticationError).
#pragma once

#include <memory>
#include <string>

#include "daemon/exchange.h"
#include "daemon/principal.h"
#include "e2b/access.h"
#include "engine/api/service.h"

namespace airlock::e2b {

inline constexpr std::string_view kApiPrefix = "/e2b/api";

class Api {
 public:
  // `allow_insecure`: airlockd --e2b-allow-insecure (model.h, parse_create).
  explicit Api(std::shared_ptr<const AccessTokens> tokens, bool allow_insecure = false)
      : tokens_(std::move(tokens)), allow_insecure_(allow_insecure) {}
  // Answers one request whose path starts with kApiPrefix.
  void serve(engine::SandboxService& engine, daemon::Exchange& ex, const daemon::Principal& who) const;

 private:
  // What the audit log gets for a call that changes something (audit.h);
  // route() fills it once it knows the call.
  struct AuditNote {
    std::string route;       // template, e.g. "/e2b/api/sandboxes/{id}/timeout"; "" = none
    std::string sandbox;     // the id the call named
    std::string ok_outcome;  // the outcome if it succeeds, e.g. "sandbox_deleted"
  };
  void route(engine::SandboxService& engine, daemon::Exchange& ex, const daemon::Principal& who,
             AuditNote& note) const;
  std::string token_of(const engine::SandboxInfo& info) const;

  std::shared_ptr<const AccessTokens> tokens_;
  bool allow_insecure_;
};

}  // namespace airlock::e2b

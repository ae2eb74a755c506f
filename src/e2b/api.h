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

#include "daemon/exchange.h"
#include "daemon/principal.h"
#include "e2b/access.h"
#include "engine/engine.h"

namespace airlock::e2b {

inline constexpr std::string_view kApiPrefix = "/e2b/api";

class Api {
 public:
  explicit Api(std::shared_ptr<const AccessTokens> tokens) : tokens_(std::move(tokens)) {}
  // Answers one request whose path starts with kApiPrefix.
  void serve(engine::Engine& engine, daemon::Exchange& ex, const daemon::Principal& who) const;

 private:
  void route(engine::Engine& engine, daemon::Exchange& ex, const daemon::Principal& who) const;
  std::string token_of(const engine::SandboxInfo& info) const;

  std::shared_ptr<const AccessTokens> tokens_;
};

}  // namespace airlock::e2b

// airlock::auth: who may use airlockd over the network. One Auth per
// daemon owns the token store, the tenants' quotas, the audit log and the
// per-source limit on authentication failures.
//
//   Auth auth(data_dir, {.failure_burst = 10, .failure_per_second = 0.2});
//   Verdict v = auth.authenticate(credential, "203.0.113.7");
//   if (v.outcome == Verdict::ok) ... v.token.tenant ...
//
// A source (peer address) whose failures exhaust its bucket is refused with
// 429 for every credentialed request until the bucket refills, valid token
// or not: a guesser learns nothing while limited.
#pragma once

#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "auth/audit_log.h"
#include "auth/quotas.h"
#include "auth/tokens.h"
#include "engine/audit/limiter.h"

namespace airlock::auth {

struct AuthOptions {
  double failure_burst = 10;        // failures admitted back to back per source
  double failure_per_second = 0.2;  // refill rate
};

struct Verdict {
  enum Outcome { ok, missing, invalid, limited } outcome = missing;
  Token token;  // when ok
};

class Auth {
 public:
  explicit Auth(const std::filesystem::path& data_dir, AuthOptions options = {});

  // `credential` is the bearer token or X-API-KEY value ("" = none given).
  // An invalid credential counts as a failure of `source`; a missing one is
  // returned as `missing` without counting (see count_failure).
  Verdict authenticate(const std::string& credential, const std::string& source);
  // Counts a failure of `source` that the caller decided on (a request
  // without a credential where one is required); true if now limited.
  bool count_failure(const std::string& source);

  TokenStore& tokens() { return tokens_; }
  Quotas& quotas() { return quotas_; }
  AuditLog& audit() { return audit_; }

 private:
  bool limited(const std::string& source);  // mu_ held

  TokenStore tokens_;
  Quotas quotas_;
  AuditLog audit_;
  std::mutex mu_;
  engine::EventLimiter failures_;
  std::map<std::string, std::chrono::steady_clock::time_point> blocked_until_;
  std::chrono::steady_clock::duration block_for_;
};

}  // namespace airlock::auth

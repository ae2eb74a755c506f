// airlock::auth: who may use airlockd over the network. One Auth per
// daemon owns the token store, the tenants' quotas, the audit log and the
// per-source limit on authentication failures.
//
//   Auth auth(data_dir, {.failure_burst = 10, .failure_per_second = 0.2});
//   Verdict v = auth.authenticate(credential, "203.0.113.7");
//   if (v.outcome == Verdict::ok) ... v.token.tenant ...
//
// A source whose failures exhaust its bucket is refused with 429 for every
// failing request until the bucket refills. A request with a valid token is
// always served, limited source or not: many clients may share an address
// (a TLS proxy on the host makes every client 127.0.0.1), and one bad one
// must not lock the others out. What the limit bounds is the cost of
// failures (hashing, audit records); guessing a 160-bit secret is no threat.
// Sources are keyed by source_key: an IPv6 address by its /64, which one
// host usually holds whole.
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
  AuditLogOptions audit;            // the size bound of audit.jsonl
};

// The key a peer address is counted under: an IPv4 address as is (also
// when IPv4-mapped, "::ffff:192.0.2.1"), an IPv6 address as its /64
// ("2001:db8:1:2::/64"), anything else ("unix") unchanged.
std::string source_key(const std::string& address);

struct Verdict {
  enum Outcome { ok, missing, invalid, limited } outcome = missing;
  Token token;  // when ok
};

class Auth {
 public:
  explicit Auth(const std::filesystem::path& data_dir, AuthOptions options = {});

  // `credential` is the bearer token or X-API-KEY value ("" = none given).
  // A valid one is `ok` whatever the source's count. An invalid one counts
  // as a failure of `source` (`limited` once over the limit); a missing one
  // is returned as `missing` without counting or checking the limit (see
  // note_auth_failure).
  Verdict authenticate(const std::string& credential, const std::string& source);
  // Counts a failure of `source` that the caller decided on (a request
  // without a credential where one is required, a wrong E2B envd access
  // token); true if `source` is now limited (answer 429).
  bool note_auth_failure(const std::string& source);
  // The same, under the name callers outside src/daemon were first written with.
  bool count_failure(const std::string& source) { return note_auth_failure(source); }
  // Whether `source` is limited now (its failures exhausted its bucket).
  bool limited(const std::string& source);

  TokenStore& tokens() { return tokens_; }
  Quotas& quotas() { return quotas_; }
  AuditLog& audit() { return audit_; }

 private:
  bool limited_locked(const std::string& key);  // mu_ held

  TokenStore tokens_;
  Quotas quotas_;
  AuditLog audit_;
  std::mutex mu_;
  engine::EventLimiter failures_;
  std::map<std::string, std::chrono::steady_clock::time_point> blocked_until_;
  std::chrono::steady_clock::duration block_for_;
};

}  // namespace airlock::auth

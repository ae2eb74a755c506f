#include "auth/auth.h"

#include <arpa/inet.h>

#include <cstring>

namespace airlock::auth {

Auth::Auth(const std::filesystem::path& data_dir, AuthOptions options)
    : tokens_(data_dir / "tokens.json"),
      quotas_(data_dir / "tenants.json"),
      audit_(data_dir / "audit.jsonl", options.audit),
      failures_({.per_second = options.failure_per_second, .burst = options.failure_burst}) {
  // Limited until one token is back in the bucket.
  double s = options.failure_per_second > 0 ? 1.0 / options.failure_per_second : 3600;
  block_for_ = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(s));
}

std::string source_key(const std::string& address) {
  in6_addr a6{};
  if (::inet_pton(AF_INET6, address.c_str(), &a6) != 1) return address;
  static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  char text[INET6_ADDRSTRLEN] = {};
  if (std::memcmp(a6.s6_addr, mapped, sizeof mapped) == 0) {
    ::inet_ntop(AF_INET, a6.s6_addr + 12, text, sizeof text);
    return text;
  }
  std::memset(a6.s6_addr + 8, 0, 8);
  ::inet_ntop(AF_INET6, &a6, text, sizeof text);
  return std::string(text) + "/64";
}

bool Auth::limited(const std::string& source) {
  std::lock_guard lock(mu_);
  return limited_locked(source_key(source));
}

bool Auth::limited_locked(const std::string& key) {
  auto it = blocked_until_.find(key);
  if (it == blocked_until_.end()) return false;
  if (std::chrono::steady_clock::now() < it->second) return true;
  blocked_until_.erase(it);
  return false;
}

bool Auth::note_auth_failure(const std::string& source) {
  std::string key = source_key(source);
  std::lock_guard lock(mu_);
  if (limited_locked(key)) return true;
  if (failures_.admit(key)) return false;
  if (blocked_until_.size() >= 4096) blocked_until_.clear();  // bounded; a flood only resets
  blocked_until_[key] = std::chrono::steady_clock::now() + block_for_;
  return true;
}

Verdict Auth::authenticate(const std::string& credential, const std::string& source) {
  Verdict v;
  if (credential.empty()) {
    v.outcome = Verdict::missing;  // the caller decides (extensions may serve it)
    return v;
  }
  if (auto t = tokens_.verify(credential)) {
    v.outcome = Verdict::ok;
    v.token = *t;
    return v;
  }
  v.outcome = note_auth_failure(source) ? Verdict::limited : Verdict::invalid;
  return v;
}

}  // namespace airlock::auth

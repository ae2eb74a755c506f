#include "auth/auth.h"

namespace airlock::auth {

Auth::Auth(const std::filesystem::path& data_dir, AuthOptions options)
    : tokens_(data_dir / "tokens.json"),
      quotas_(data_dir / "tenants.json"),
      audit_(data_dir / "audit.jsonl"),
      failures_({.per_second = options.failure_per_second, .burst = options.failure_burst}) {
  // Limited until one token is back in the bucket.
  double s = options.failure_per_second > 0 ? 1.0 / options.failure_per_second : 3600;
  block_for_ = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(s));
}

bool Auth::limited(const std::string& source) {
  auto it = blocked_until_.find(source);
  if (it == blocked_until_.end()) return false;
  if (std::chrono::steady_clock::now() < it->second) return true;
  blocked_until_.erase(it);
  return false;
}

bool Auth::count_failure(const std::string& source) {
  std::lock_guard lock(mu_);
  if (limited(source)) return true;
  if (failures_.admit(source)) return false;
  if (blocked_until_.size() >= 4096) blocked_until_.clear();  // bounded; a flood only resets
  blocked_until_[source] = std::chrono::steady_clock::now() + block_for_;
  return true;
}

Verdict Auth::authenticate(const std::string& credential, const std::string& source) {
  Verdict v;
  {
    std::lock_guard lock(mu_);
    if (limited(source)) {
      v.outcome = Verdict::limited;
      return v;
    }
  }
  if (credential.empty()) {
    v.outcome = Verdict::missing;  // the caller decides (extensions may serve it)
    return v;
  }
  if (auto t = tokens_.verify(credential)) {
    v.outcome = Verdict::ok;
    v.token = *t;
    return v;
  }
  v.outcome = count_failure(source) ? Verdict::limited : Verdict::invalid;
  return v;
}

}  // namespace airlock::auth

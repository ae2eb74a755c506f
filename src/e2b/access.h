// Access tokens of "secure" E2B sandboxes (E2B's envdAccessToken): the
// secret the SDK sends as X-Access-Token on every in-sandbox (envd) call.
//
// A token is HMAC-SHA256(daemon key, sandbox id), so none is stored: create
// and connect hand it out (E2B's connect returns it again), the envd surface
// recomputes and compares in constant time. The key is 32 random bytes in
// <data dir>/e2b-access.key (0600, created once, never sent anywhere); a new
// key invalidates every token.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace airlock::e2b {

class AccessTokens {
 public:
  // Reads the key, creating it if missing. Error(internal) naming the file
  // if it cannot be read or created, or has the wrong size or mode.
  explicit AccessTokens(const std::filesystem::path& key_file);
  // For tests: a key given directly (any length).
  static AccessTokens from_key(std::string key);

  std::string token_for(std::string_view sandbox_id) const;  // 64 hex digits
  bool check(std::string_view sandbox_id, std::string_view presented) const;

 private:
  AccessTokens() = default;
  std::string key_;
};

}  // namespace airlock::e2b

// The daemon's API tokens: who may call airlockd over TCP, and for which
// tenant. Stored in <data dir>/tokens.json (0600, rewritten atomically);
// a token's secret is kept only as its SHA-256 and shown once, by create().
//
//   TokenStore store(data_dir / "tokens.json");
//   auto made = store.create("acme", 3600, TokenFormat::e2b);  // made.secret: "e2b_<40 hex>"
//   auto tok = store.verify(made.secret);                     // the Token, or nullopt
//   store.remove(made.token.id);                              // verify fails from now on
//
// Secrets are 160 random bits as 40 lowercase hex digits, prefixed
// "airlock_" (the default) or "e2b_" (E2B's SDK accepts only keys of that
// shape). Either form works on every route. Thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace airlock::auth {

enum class TokenFormat { airlock, e2b };

struct Token {
  std::string id;      // public: "tok_" + 16 hex; what ls shows and rm takes
  std::string tenant;  // the tenant it acts for
  std::string sha256;  // of the secret
  std::string format;  // "airlock" | "e2b"
  int64_t created = 0;
  int64_t expires = 0;  // unix seconds; 0 = never
};
// Without the hash: what GET /v1/tokens shows.
nlohmann::json to_public_json(const Token& t);

// Tenant names: 1..63 of [a-z0-9_-], starting with a letter or digit.
// Throws Error(invalid_argument, field) otherwise.
void check_tenant(const std::string& tenant, const char* field = "tenant");

class TokenStore {
 public:
  explicit TokenStore(std::filesystem::path file,
                      std::function<int64_t()> now = nullptr);  // default: the wall clock

  struct Created {
    Token token;
    std::string secret;  // shown once, never stored
  };
  // expires_in_s 0 = never. Throws Error(invalid_argument) for a bad tenant
  // or a negative / over ten years expiry.
  Created create(const std::string& tenant, int64_t expires_in_s, TokenFormat format);
  std::vector<Token> list() const;
  // False if no token has this id.
  bool remove(const std::string& id);
  // The token whose secret this is, if it exists and has not expired.
  std::optional<Token> verify(const std::string& secret) const;

 private:
  void save() const;  // mu_ held

  std::filesystem::path file_;
  std::function<int64_t()> now_;
  mutable std::mutex mu_;
  std::map<std::string, Token> by_id_;
};

}  // namespace airlock::auth

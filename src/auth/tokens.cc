#include "auth/tokens.h"

#include <spdlog/spdlog.h>

#include "auth/files.h"
#include "common/error.h"

namespace airlock::auth {

using nlohmann::json;

nlohmann::json to_public_json(const Token& t) {
  json j = {{"id", t.id}, {"tenant", t.tenant}, {"format", t.format}, {"created", t.created}};
  j["expires"] = t.expires ? json(t.expires) : json(nullptr);
  return j;
}

void check_tenant(const std::string& tenant, const char* field) {
  bool ok = !tenant.empty() && tenant.size() <= 63 && tenant[0] != '-' && tenant[0] != '_';
  for (char c : tenant)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_')) ok = false;
  if (!ok)
    throw Error(Errc::invalid_argument,
                std::string(field) +
                    " must be 1..63 characters of a-z, 0-9, '-' and '_', starting with a letter "
                    "or digit",
                field);
}

TokenStore::TokenStore(std::filesystem::path file, std::function<int64_t()> now)
    : file_(std::move(file)), now_(now ? std::move(now) : std::function<int64_t()>(unix_now)) {
  auto text = read_file(file_);
  if (!text) return;
  json j = json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("tokens") || !j["tokens"].is_array())
    throw Error(Errc::internal, file_.string() + " is not a token file (fix or remove it)");
  for (const auto& t : j["tokens"]) {
    Token tok;
    tok.id = t.value("id", "");
    tok.tenant = t.value("tenant", "");
    tok.sha256 = t.value("sha256", "");
    tok.format = t.value("format", "airlock");
    tok.created = t.value("created", int64_t{0});
    tok.expires = t.value("expires", int64_t{0});
    if (tok.id.empty() || tok.sha256.size() != 64) continue;
    by_id_[tok.id] = tok;
  }
}

void TokenStore::save() const {
  json arr = json::array();
  for (const auto& [id, t] : by_id_)
    arr.push_back({{"id", t.id},
                   {"tenant", t.tenant},
                   {"sha256", t.sha256},
                   {"format", t.format},
                   {"created", t.created},
                   {"expires", t.expires}});
  write_private(file_, json{{"tokens", arr}}.dump(2) + "\n");
}

TokenStore::Created TokenStore::create(const std::string& tenant, int64_t expires_in_s,
                                       TokenFormat format) {
  check_tenant(tenant);
  if (expires_in_s < 0 || expires_in_s > 10ll * 366 * 86400)
    throw Error(Errc::invalid_argument, "expires_in_s must be 0 (never) .. 316224000 (ten years)",
                "expires_in_s");
  Created c;
  c.secret = (format == TokenFormat::e2b ? "e2b_" : "airlock_") + random_hex(20);
  c.token.id = "tok_" + random_hex(8);
  c.token.tenant = tenant;
  c.token.sha256 = sha256_hex(c.secret);
  c.token.format = format == TokenFormat::e2b ? "e2b" : "airlock";
  c.token.created = now_();
  c.token.expires = expires_in_s ? c.token.created + expires_in_s : 0;
  std::lock_guard lock(mu_);
  by_id_[c.token.id] = c.token;
  try {
    save();
  } catch (...) {
    by_id_.erase(c.token.id);  // a token that is not on disk was never made
    throw;
  }
  return c;
}

std::vector<Token> TokenStore::list() const {
  std::lock_guard lock(mu_);
  std::vector<Token> out;
  for (const auto& [id, t] : by_id_) out.push_back(t);
  return out;
}

bool TokenStore::remove(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  Token old = it->second;
  by_id_.erase(it);
  try {
    save();
  } catch (...) {
    by_id_[id] = old;
    throw;
  }
  return true;
}

std::optional<Token> TokenStore::verify(const std::string& secret) const {
  if (secret.empty() || secret.size() > 256) return std::nullopt;
  // Compared as hashes: what is looked up reveals nothing of a secret.
  std::string h = sha256_hex(secret);
  int64_t now = now_();
  std::lock_guard lock(mu_);
  for (const auto& [id, t] : by_id_)
    if (t.sha256 == h) {
      if (t.expires && now >= t.expires) return std::nullopt;
      return t;
    }
  return std::nullopt;
}

}  // namespace airlock::auth

// The daemon-level audit log: <data dir>/audit.jsonl (0600, appended), one
// JSON object per line: {"time", "source", "tenant"?, "token_id"?, "method",
// "route", "outcome", "status"?, "detail"?}. It records authentication
// failures, token and tenant administration, and sandbox creates and
// deletes. Never a token secret: callers pass ids and route templates only.
// Thread-safe.
#pragma once

#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <vector>

namespace airlock::auth {

class AuditLog {
 public:
  explicit AuditLog(std::filesystem::path file);
  ~AuditLog();
  AuditLog(const AuditLog&) = delete;
  AuditLog& operator=(const AuditLog&) = delete;

  // Adds "time" (RFC 3339 UTC) and appends. Never throws (a full disk is
  // logged by spdlog, the request goes on).
  void append(nlohmann::json record);
  // The last `limit` records, oldest first.
  std::vector<nlohmann::json> tail(size_t limit) const;

 private:
  std::filesystem::path file_;
  mutable std::mutex mu_;
  int fd_ = -1;
};

}  // namespace airlock::auth

// The daemon-level audit log: <data dir>/audit.jsonl (0600, appended), one
// JSON object per line: {"time", "source", "tenant"?, "token_id"?, "method",
// "route", "outcome", "status"?, "detail"?}. It records authentication
// failures, token and tenant administration, and sandbox creates and
// deletes. Never a token secret: callers pass ids and route templates only.
//
// Bounded whatever clients send: a string field longer than kMaxField bytes
// is cut there and marked ("...[truncated, N bytes]"), bytes that are not
// UTF-8 are replaced, and once the file would pass max_bytes it is rotated
// (audit.jsonl -> audit.jsonl.1 -> ... -> audit.jsonl.<generations>, the
// oldest dropped). Thread-safe.
#pragma once

#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <vector>

namespace airlock::auth {

struct AuditLogOptions {
  uint64_t max_bytes = 4 << 20;  // per file; at least one record is always written
  int generations = 2;           // rotated files kept beside the current one
};

class AuditLog {
 public:
  static constexpr size_t kMaxField = 256;

  explicit AuditLog(std::filesystem::path file, AuditLogOptions options = {});
  ~AuditLog();
  AuditLog(const AuditLog&) = delete;
  AuditLog& operator=(const AuditLog&) = delete;

  // Adds "time" (RFC 3339 UTC) and appends. Never throws (a full disk is
  // logged by spdlog, the request goes on).
  void append(nlohmann::json record);
  // The last `limit` records, oldest first (the current file, then the
  // newest rotated one if that is not enough).
  std::vector<nlohmann::json> tail(size_t limit) const;

 private:
  void rotate();  // mu_ held
  std::filesystem::path generation(int n) const;

  std::filesystem::path file_;
  AuditLogOptions options_;
  mutable std::mutex mu_;
  int fd_ = -1;
  uint64_t size_ = 0;  // of the current file
};

}  // namespace airlock::auth

// The audit journal: one append-only JSON-lines file per sandbox,
// <dir>/<sandbox id>.jsonl, kept after the sandbox is deleted.
//
// Every record has "ts" (RFC 3339, milliseconds, UTC), "sandbox" and
// "event", plus the event's own fields:
//
//   {"ts":"2024-05-01T12:00:00.123Z","sandbox":"sb-0123456789ab","event":"exec",
//    "exec_id":"...","argv":["sh","-c","exit 7"],"exit_code":7,...}
//
// Events the engine writes: created, boot_failed, retry, exec, file (op, path,
// bytes), timed_out, deleted, failed, adopted.
//
// Each record is one write(2) on an O_APPEND descriptor, so concurrent
// appenders (threads, or a second daemon) never interleave partial lines;
// lifecycle events are fsync'd so they survive a host crash.
//
//   AuditJournal journal(data_dir / "audit");
//   journal.append("sb-...", "created", {{"image", "minimal"}}, Durability::sync);
//   for (auto& rec : journal.read("sb-...")) ...
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace airlock::engine {

enum class Durability { buffered, sync };

class AuditJournal {
 public:
  // Creates `dir` if missing.
  explicit AuditJournal(std::filesystem::path dir);

  // Appends one record. `fields` must be a JSON object (or null); its keys
  // ts/sandbox/event are overwritten. Throws Error(invalid_argument) for an
  // id that is not a plain name, Error(internal) if the write fails.
  void append(const std::string& sandbox, const std::string& event, nlohmann::json fields = nullptr,
              Durability durability = Durability::buffered);

  // Every record of `sandbox`, oldest first. A torn last line (crash during a
  // write) is skipped. Throws Error(not_found) if the sandbox has no journal.
  std::vector<nlohmann::json> read(const std::string& sandbox) const;

  std::filesystem::path path_of(const std::string& sandbox) const;

 private:
  std::filesystem::path dir_;
};

// Now as RFC 3339 UTC with milliseconds, e.g. "2024-05-01T12:00:00.123Z".
std::string rfc3339_now();
std::string rfc3339_ms(int64_t unix_ms);

}  // namespace airlock::engine

// The audit journal: one append-only JSON-lines file per sandbox,
// <dir>/<sandbox id>.jsonl, kept after the sandbox is deleted.
//
// Every record has "ts" (RFC 3339, milliseconds, UTC), "sandbox" and
// "event", plus the event's own fields:
//
//   {"ts":"2024-05-01T12:00:00.123Z","sandbox":"sb-0123456789ab","event":"exec",
//    "exec_id":"...","argv":["sh","-c","exit 7"],"exit_code":7,...}
//
// Events the engine writes: created, boot_failed, retry, exec_start, exec
// (argv, cwd, user, env_keys, exit, duration, bytes, stdout_sha256,
// stderr_sha256), exec_attach (a reattach's delivered range and its
// hashes: exec/attach.cc), file (op, path, bytes, sha256 for writes), net_*,
// network_changed, timed_out, deleted, failed, adopted; the journal's own
// journal_truncated, journal_torn_tail, journal_reanchored,
// journal_anchor_mismatch. Whatever else changes a sandbox (snapshots,
// forks, pauses...) appends its own event the same way: append() is the
// one door into the chain.
//
// Hash chain (chain.h): every record also has "seq" and "prev" (the SHA-256
// of the previous line), and the head is anchored (JournalAnchor: the
// registry) and signed with the host key. verify() names the first broken
// link. A sync record's head is anchored before append() returns; a
// buffered record's (exec_start, exec, a pool hand-out's created: the hot
// paths) within `anchor_lag` by a thread of the journal, one anchor for all
// the appends of that window: the signature and the registry write were
// ~0.2-0.6 ms of every exec under TCG. While the daemon lives, the lag hides
// nothing: the anchor names the head as this process wrote it, so a file cut
// short meanwhile still fails verify(), which anchors what is pending first.
// A daemon killed inside the window leaves those records unanchored, as a
// kill between a write and its anchor always could: the next daemon's first
// append notes it (journal_reanchored).
//
// Each record is one write(2) on an O_APPEND descriptor, so concurrent
// appenders (threads, or a second daemon) never interleave partial lines;
// lifecycle events are fsync'd so they survive a host crash.
//
// Size cap (JournalLimits): the guest drives some records (DNS answers,
// flows), so a journal is capped. Past max_bytes - lifecycle_reserve_bytes,
// ordinary records are dropped and counted; the first drop writes one
// `journal_truncated` record {max_bytes, dropped_records, dropped_bytes}.
// Lifecycle records (is_lifecycle: created, exec..., file, Durability::sync)
// may use the reserve up to max_bytes; the terminal ones (deleted, failed,
// timed_out) are always written, and carry "journal_dropped": {"records",
// "bytes"} when anything was dropped, so the end of a sandbox and the extent
// of the loss are always on record.
//
//   AuditJournal journal(data_dir / "audit");
//   journal.append("sb-...", "created", {{"image", "minimal"}}, Durability::sync);
//   for (auto& rec : journal.read("sb-...")) ...
//
// Following (JournalReader): a reader keeps its byte offset and only reads
// what was appended since its last call, so a follower costs O(journal size)
// in total, not O(size) per wake:
//
//   JournalReader r = journal.reader("sb-...", "net_");
//   while (live) { for (auto& rec : r.next()) send(rec); r.wait(500ms, sock_fd); }
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "engine/audit/chain.h"

namespace airlock::engine {

enum class Durability { buffered, sync };

struct JournalLimits {
  uint64_t max_bytes = 64ull << 20;  // 0 = no cap
  // The last part of max_bytes that only lifecycle records may fill.
  uint64_t lifecycle_reserve_bytes = 1ull << 20;
};

struct JournalStats {
  uint64_t bytes = 0;            // the file's size
  bool truncated = false;        // a record was dropped (this process) or the cap is reached
  uint64_t dropped_records = 0;  // counted by this process
  uint64_t dropped_bytes = 0;
};

// What a follower reads: the records appended since its last call. An
// interface because the daemon's HTTP tests run against a fake engine that
// keeps its journal in memory (src/daemon/fake_service_test_support.cc).
class RecordFollower {
 public:
  enum class Wake { grew, timeout, hangup };
  virtual ~RecordFollower() = default;
  // Complete records appended since the last call (the first call: all so
  // far), oldest first, each exactly once.
  virtual std::vector<nlohmann::json> next() = 0;
  // Blocks until the journal may have grown (grew), `timeout` passed, or
  // `hangup_fd` (if >= 0) reports POLLHUP/POLLERR (hangup). `grew` may be
  // spurious: next() can return nothing.
  virtual Wake wait(std::chrono::milliseconds timeout, int hangup_fd = -1) = 0;
};

// Follows one journal file from byte 0. A torn last line (an append in
// progress, or a crash) is held back until its newline arrives; a line that
// is not JSON is skipped, as read() does. Waits with inotify on the file
// (which also sees appends by other processes, e.g. the network helper), or
// a bounded poll (100 ms) when inotify is unavailable or the file does not
// exist yet. Not thread-safe: one reader per follower.
class JournalReader : public RecordFollower {
 public:
  // Only records whose "event" starts with `event_prefix` are returned.
  explicit JournalReader(std::filesystem::path path, std::string event_prefix = "");
  ~JournalReader() override;
  JournalReader(JournalReader&& other) noexcept;
  JournalReader& operator=(JournalReader&&) = delete;
  JournalReader(const JournalReader&) = delete;

  std::vector<nlohmann::json> next() override;
  Wake wait(std::chrono::milliseconds timeout, int hangup_fd = -1) override;

  uint64_t offset() const { return offset_; }
  uint64_t bytes_read() const { return bytes_read_; }  // for tests: O(size), not O(size^2)
  bool exists() const { return fd_ >= 0; }

 private:
  bool open_file();
  std::filesystem::path path_;
  std::string prefix_;
  int fd_ = -1;
  int inotify_fd_ = -1;
  uint64_t offset_ = 0;
  uint64_t bytes_read_ = 0;
  std::string partial_;     // bytes after the last newline
  bool skip_line_ = false;  // dropping an over-long line up to its newline
};

class AuditJournal {
 public:
  // Creates `dir` if missing. Throws Error(invalid_argument, field
  // "journal_max_bytes") when the reserve does not fit in the cap.
  // `anchor` (may be null: no anchoring) receives the chain's head, signed
  // with `key` when given (chain.h): after each sync append, and within
  // `anchor_lag` of a buffered one (0: after every append).
  explicit AuditJournal(std::filesystem::path dir, JournalLimits limits = {},
                        JournalAnchor* anchor = nullptr,
                        std::shared_ptr<const HostKey> key = nullptr,
                        std::chrono::milliseconds anchor_lag = std::chrono::milliseconds(0));
  // Anchors what is pending, then stops the anchoring thread.
  ~AuditJournal();
  AuditJournal(const AuditJournal&) = delete;
  AuditJournal& operator=(const AuditJournal&) = delete;

  // Appends one record. `fields` must be a JSON object (or null); its keys
  // ts/sandbox/event are overwritten. Throws Error(invalid_argument) for an
  // id that is not a plain name, Error(internal) if the write fails.
  // Returns false when the size cap dropped the record (counted, see above).
  bool append(const std::string& sandbox, const std::string& event, nlohmann::json fields = nullptr,
              Durability durability = Durability::buffered);

  // Every record of `sandbox`, oldest first. A torn last line (crash during a
  // write) is skipped. Throws Error(not_found) if the sandbox has no journal.
  std::vector<nlohmann::json> read(const std::string& sandbox) const;

  // A follower of `sandbox`'s journal from its start (the file need not
  // exist yet). Error(invalid_argument) for a bad id.
  JournalReader reader(const std::string& sandbox, std::string event_prefix = "") const;

  JournalStats stats(const std::string& sandbox) const;

  // Checks `sandbox`'s hash chain and its anchored head (chain.h), after
  // anchoring its pending head. Error(not_found) if it has no journal.
  VerifyReport verify(const std::string& sandbox);
  const HostKey* key() const { return key_.get(); }

  std::filesystem::path path_of(const std::string& sandbox) const;
  const JournalLimits& limits() const { return limits_; }

  // Records that may use the reserve: the sandbox's lifecycle and what the
  // API caller did on it (exec*, file; host-initiated, one per API call).
  static bool is_lifecycle(const std::string& event);
  // Records always written, cap or not: the end of a sandbox.
  static bool is_terminal(const std::string& event);

 private:
  struct Dropped {
    uint64_t records = 0, bytes = 0;
    bool noted = false;  // journal_truncated is on record
  };
  bool already_noted(const std::filesystem::path& path, uint64_t size) const;
  // A sandbox's chain end as this process knows it.
  struct Chain {
    std::mutex mu;  // held for a whole append
    bool loaded = false;
    uint64_t bytes = 0;  // the file size after our last append
    uint64_t seq = 0;
    std::string hash;
    uint64_t anchored_seq = 0;  // the head last anchored by this process
  };
  std::shared_ptr<Chain> chain_of(const std::string& sandbox);
  void load_chain(int fd, const std::string& sandbox, Chain& c, uint64_t size,
                  const std::filesystem::path& path);
  void write_chained(int fd, const std::string& sandbox, Chain& c, const std::string& line,
                     Durability durability, const std::filesystem::path& path);
  // Signs and stores c's head (c.mu held); never throws.
  void anchor_head(const std::string& sandbox, Chain& c);
  // Anchors `sandbox`'s head if this process wrote records it has not
  // anchored yet (and nobody appended after them).
  void anchor_pending(const std::string& sandbox);
  void anchor_loop();

  std::filesystem::path dir_;
  JournalLimits limits_;
  JournalAnchor* anchor_;
  std::shared_ptr<const HostKey> key_;
  mutable std::mutex mu_;                   // dropped_, chains_
  std::map<std::string, Dropped> dropped_;  // only sandboxes that hit the cap
  std::map<std::string, std::shared_ptr<Chain>> chains_;

  std::chrono::milliseconds anchor_lag_;
  std::mutex pending_mu_;  // never held while taking a chain's mutex
  std::condition_variable pending_cv_;
  std::set<std::string> pending_;  // sandboxes with a buffered head not anchored
  bool stopping_ = false;
  std::thread anchorer_;  // with anchor_ and a lag only
};

// Now as RFC 3339 UTC with milliseconds, e.g. "2024-05-01T12:00:00.123Z".
std::string rfc3339_now();
std::string rfc3339_ms(int64_t unix_ms);

}  // namespace airlock::engine

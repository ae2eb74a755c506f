// The sandbox registry: one SQLite database (<data_dir>/registry.db, WAL) that
// records every sandbox the engine ever made, so a restarted daemon knows
// what to re-adopt and what to clean up, and list(all) can show history.
//
//   Registry reg(data_dir / "registry.db");
//   reg.insert({.info = info, .run_dir = dir});       // state starting
//   reg.set_running(id, pid, boot_ms);
//   reg.set_state(id, State::deleted, "deleted by caller");
//   for (auto& r : reg.list(/*all=*/false)) ...;
//
// Schema changes are additive columns, added on open to databases made by
// older versions (their rows get the column's default).
//
// Thread-safe (one connection behind a mutex). Every failure of SQLite is an
// Error(internal) naming the statement's purpose and SQLite's message.
#pragma once

#include <cstdint>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/audit/chain.h"
#include "engine/api/types.h"

struct sqlite3;

namespace airlock::engine {

struct SandboxRecord {
  SandboxInfo info;
  std::filesystem::path run_dir;  // <data_dir>/sandboxes/<id>
};

// A compare-and-set of a row's state (Registry::compare_and_set_state).
struct RegistryStateWrite {
  State from, to;
  std::string reason;
  std::string failure;  // stored only for `failed`
  std::optional<int> pid;
  std::optional<int64_t> boot_ms;
  // Also write every other column from this record (pool hand-out),
  // its id included: the row is renamed to record->info.id.
  const SandboxRecord* record = nullptr;
};

class Registry : public JournalAnchor {
 public:
  // Opens (creating if needed) the database and its schema. The database
  // and its -wal/-shm files are 0600: specs hold env values.
  explicit Registry(const std::filesystem::path& db_path);
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Adds a new row. Throws Error(conflict) if the id exists.
  void insert(const SandboxRecord& record);
  // Overwrites every column of an existing row. Throws Error(not_found).
  void update(const SandboxRecord& record);
  // Changes state, reason and failure (SandboxInfo::failure; empty unless
  // failed); clears pid when the state is terminal.
  // Throws Error(not_found) for an unknown id.
  void set_state(const std::string& id, State state, const std::string& reason = {},
                 const std::string& failure = {});
  // starting -> running with the QEMU pid and measured boot time.
  void set_running(const std::string& id, int pid, int64_t boot_ms);
  // UPDATE ... WHERE id AND state = w.from: false if the row is not in
  // w.from (someone else moved it; nothing written). Clears pid for a
  // terminal state. Error(not_found) for an unknown id.
  bool compare_and_set_state(const std::string& id, const RegistryStateWrite& w);
  // Columns that are not the state (the engine's sandbox owns that).
  void set_pid(const std::string& id, int pid);
  void set_spec(const std::string& id, const SandboxSpec& spec);
  // A new expiry (Engine::set_timeout) with the spec that records its timeout.
  void set_expiry(const std::string& id, int64_t expires_at_ms, const SandboxSpec& spec);

  std::optional<SandboxRecord> get(const std::string& id) const;
  // Oldest first. all=false: only rows in a non-terminal state.
  std::vector<SandboxRecord> list(bool all) const;

  // The anchored head of a sandbox's journal chain (table journal_heads).
  std::optional<JournalHead> load_head(const std::string& sandbox) override;
  void store_head(const std::string& sandbox, const JournalHead& head) override;

 private:
  sqlite3* db_ = nullptr;
  mutable std::mutex mu_;
};

}  // namespace airlock::engine

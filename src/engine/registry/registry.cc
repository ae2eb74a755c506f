#include "engine/registry/registry.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "common/error.h"
#include "engine/types_json.h"

namespace airlock::engine {
namespace {

[[noreturn]] void fail(sqlite3* db, const std::string& what) {
  throw Error(Errc::internal, "registry: " + what + ": " + (db ? sqlite3_errmsg(db) : "no db"));
}

// RAII prepared statement with typed binders; keeps registry.cc free of
// manual finalize calls on every error path.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql, const std::string& what) : db_(db), what_(what) {
    if (sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr) != SQLITE_OK) fail(db, what);
  }
  ~Stmt() { sqlite3_finalize(stmt_); }
  Stmt& bind(int i, const std::string& v) {
    check(sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT));
    return *this;
  }
  Stmt& bind(int i, int64_t v) {
    check(sqlite3_bind_int64(stmt_, i, v));
    return *this;
  }
  // Returns true while there is a row.
  bool step() {
    int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    fail(db_, what_);
  }
  std::string text(int col) const {
    auto* p = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, col));
    return p ? std::string(p, sqlite3_column_bytes(stmt_, col)) : std::string();
  }
  int64_t integer(int col) const { return sqlite3_column_int64(stmt_, col); }

 private:
  void check(int rc) {
    if (rc != SQLITE_OK) fail(db_, what_);
  }
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  std::string what_;
};

void exec_sql(sqlite3* db, const char* sql, const std::string& what) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    throw Error(Errc::internal, "registry: " + what + ": " + msg);
  }
}

constexpr const char* kColumns =
    "id, spec, state, reason, accel, start, created_at_ms, expires_at_ms, boot_ms, pid, run_dir,"
    " failure";

SandboxRecord read_row(const Stmt& s) {
  SandboxRecord r;
  r.info.id = s.text(0);
  try {
    r.info.spec = spec_from_json(nlohmann::json::parse(s.text(1)));
  } catch (const nlohmann::json::exception& e) {
    throw Error(Errc::internal, "registry: spec of " + r.info.id + " is not JSON: " + e.what());
  }
  r.info.state = state_from_string(s.text(2));
  r.info.reason = s.text(3);
  r.info.accel = s.text(4);
  r.info.start = s.text(5);
  r.info.created_at_ms = s.integer(6);
  r.info.expires_at_ms = s.integer(7);
  r.info.boot_ms = s.integer(8);
  r.info.pid = static_cast<int>(s.integer(9));
  r.run_dir = s.text(10);
  r.info.failure = s.text(11);
  return r;
}

// Binds the 11 non-id columns starting at parameter `first`, in kColumns order.
void bind_fields(Stmt& s, int first, const SandboxRecord& r) {
  s.bind(first, spec_to_json(r.info.spec).dump())
      .bind(first + 1, std::string(to_string(r.info.state)))
      .bind(first + 2, r.info.reason)
      .bind(first + 3, r.info.accel)
      .bind(first + 4, r.info.start)
      .bind(first + 5, r.info.created_at_ms)
      .bind(first + 6, r.info.expires_at_ms)
      .bind(first + 7, r.info.boot_ms)
      .bind(first + 8, static_cast<int64_t>(r.info.pid))
      .bind(first + 9, r.run_dir.string())
      .bind(first + 10, r.info.failure);
}

// Columns added after the first schema, with their definitions. A database
// made before one existed gets it here (ALTER TABLE keeps every row, with
// the default), so an upgraded daemon opens its old registry as is.
constexpr std::pair<const char*, const char*> kAddedColumns[] = {
    {"failure", "TEXT NOT NULL DEFAULT ''"},
};

void migrate(sqlite3* db) {
  std::vector<std::string> have;
  {
    Stmt q(db, "PRAGMA table_info(sandboxes)", "read schema");
    while (q.step()) have.push_back(q.text(1));
  }
  for (const auto& [name, def] : kAddedColumns) {
    if (std::find(have.begin(), have.end(), name) != have.end()) continue;
    std::string sql = std::string("ALTER TABLE sandboxes ADD COLUMN ") + name + " " + def;
    exec_sql(db, sql.c_str(), std::string("add column ") + name);
  }
}

}  // namespace

Registry::Registry(const std::filesystem::path& db_path) {
  // Created 0600 before SQLite opens it (SQLite gives -wal and -shm the
  // database's mode); an older 0644 one is tightened.
  if (int fd = ::open(db_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600); fd >= 0) {
    ::fchmod(fd, 0600);
    ::close(fd);
  }
  for (const char* suffix : {"-wal", "-shm"}) ::chmod((db_path.string() + suffix).c_str(), 0600);
  int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX;
  if (sqlite3_open_v2(db_path.c_str(), &db_, flags, nullptr) != SQLITE_OK) {
    std::string msg = db_ ? sqlite3_errmsg(db_) : "out of memory";
    sqlite3_close(db_);
    db_ = nullptr;
    throw Error(Errc::internal, "registry: cannot open " + db_path.string() + ": " + msg);
  }
  try {
    // Another process (a CLI reading the db, a daemon being replaced) may
    // hold the lock briefly; wait instead of failing.
    sqlite3_busy_timeout(db_, 5000);
    exec_sql(db_, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;", "enable WAL");
    exec_sql(db_,
             "CREATE TABLE IF NOT EXISTS sandboxes ("
             " id TEXT PRIMARY KEY,"
             " spec TEXT NOT NULL,"
             " state TEXT NOT NULL,"
             " reason TEXT NOT NULL DEFAULT '',"
             " accel TEXT NOT NULL DEFAULT '',"
             " start TEXT NOT NULL DEFAULT 'boot',"
             " created_at_ms INTEGER NOT NULL,"
             " expires_at_ms INTEGER NOT NULL,"
             " boot_ms INTEGER NOT NULL DEFAULT 0,"
             " pid INTEGER NOT NULL DEFAULT 0,"
             " run_dir TEXT NOT NULL DEFAULT '');"
             "CREATE INDEX IF NOT EXISTS sandboxes_state ON sandboxes(state);"
             // The head of each sandbox's journal chain (audit/chain.h).
             "CREATE TABLE IF NOT EXISTS journal_heads ("
             " sandbox TEXT PRIMARY KEY,"
             " seq INTEGER NOT NULL,"
             " hash TEXT NOT NULL,"
             " bytes INTEGER NOT NULL,"
             " signature TEXT NOT NULL DEFAULT '');",
             "create schema");
    migrate(db_);
  } catch (...) {
    sqlite3_close(db_);
    throw;
  }
}

Registry::~Registry() { sqlite3_close(db_); }

void Registry::insert(const SandboxRecord& r) {
  std::lock_guard lock(mu_);
  {
    Stmt q(db_, "SELECT 1 FROM sandboxes WHERE id = ?1", "look up " + r.info.id);
    q.bind(1, r.info.id);
    if (q.step()) throw Error(Errc::conflict, "sandbox " + r.info.id + " already exists");
  }
  Stmt s(db_,
         "INSERT INTO sandboxes (id, spec, state, reason, accel, start, created_at_ms,"
         " expires_at_ms, boot_ms, pid, run_dir, failure)"
         " VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12)",
         "insert " + r.info.id);
  s.bind(1, r.info.id);
  bind_fields(s, 2, r);
  s.step();
}

void Registry::update(const SandboxRecord& r) {
  std::lock_guard lock(mu_);
  Stmt s(db_,
         "UPDATE sandboxes SET spec=?2, state=?3, reason=?4, accel=?5, start=?6,"
         " created_at_ms=?7, expires_at_ms=?8, boot_ms=?9, pid=?10, run_dir=?11, failure=?12"
         " WHERE id=?1",
         "update " + r.info.id);
  s.bind(1, r.info.id);
  bind_fields(s, 2, r);
  s.step();
  if (sqlite3_changes(db_) == 0) throw Error(Errc::not_found, "no sandbox " + r.info.id);
}

void Registry::set_state(const std::string& id, State state, const std::string& reason,
                         const std::string& failure) {
  std::lock_guard lock(mu_);
  Stmt s(db_,
         "UPDATE sandboxes SET state=?2, reason=?3, failure=?5,"
         " pid = CASE WHEN ?4 THEN 0 ELSE pid END WHERE id=?1",
         "set state of " + id);
  s.bind(1, id).bind(2, std::string(to_string(state))).bind(3, reason);
  s.bind(4, static_cast<int64_t>(is_terminal(state)));
  s.bind(5, state == State::failed ? failure : std::string());
  s.step();
  if (sqlite3_changes(db_) == 0) throw Error(Errc::not_found, "no sandbox " + id);
}

void Registry::set_running(const std::string& id, int pid, int64_t boot_ms) {
  std::lock_guard lock(mu_);
  Stmt s(db_,
         "UPDATE sandboxes SET state='running', reason='', failure='', pid=?2, boot_ms=?3"
         " WHERE id=?1",
         "mark " + id + " running");
  s.bind(1, id).bind(2, static_cast<int64_t>(pid)).bind(3, boot_ms);
  s.step();
  if (sqlite3_changes(db_) == 0) throw Error(Errc::not_found, "no sandbox " + id);
}

bool Registry::compare_and_set_state(const std::string& id, const RegistryStateWrite& w) {
  std::lock_guard lock(mu_);
  const int64_t terminal = is_terminal(w.to);
  const std::string failure = w.to == State::failed ? w.failure : std::string();
  if (w.record) {
    Stmt s(db_,
           "UPDATE sandboxes SET spec=?3, state=?4, reason=?5, accel=?6, start=?7,"
           " created_at_ms=?8, expires_at_ms=?9, boot_ms=?10, pid=?11, run_dir=?12, failure=?13,"
           " id=?14 WHERE id=?1 AND state=?2",
           "move " + id + " to " + to_string(w.to));
    SandboxRecord r = *w.record;
    r.info.state = w.to;
    r.info.reason = w.reason;
    r.info.failure = failure;
    if (w.pid) r.info.pid = *w.pid;
    if (terminal) r.info.pid = 0;
    if (w.boot_ms) r.info.boot_ms = *w.boot_ms;
    s.bind(1, id).bind(2, std::string(to_string(w.from)));
    bind_fields(s, 3, r);
    s.bind(14, r.info.id);  // a pool member's hand-out renames its row
    s.step();
  } else {
    Stmt s(db_,
           "UPDATE sandboxes SET state=?3, reason=?4, failure=?5,"
           " pid = CASE WHEN ?6 THEN 0 WHEN ?7 >= 0 THEN ?7 ELSE pid END,"
           " boot_ms = CASE WHEN ?8 >= 0 THEN ?8 ELSE boot_ms END"
           " WHERE id=?1 AND state=?2",
           "move " + id + " to " + to_string(w.to));
    s.bind(1, id).bind(2, std::string(to_string(w.from))).bind(3, std::string(to_string(w.to)));
    s.bind(4, w.reason).bind(5, failure).bind(6, terminal);
    s.bind(7, static_cast<int64_t>(w.pid.value_or(-1))).bind(8, w.boot_ms.value_or(-1));
    s.step();
  }
  if (sqlite3_changes(db_) > 0) return true;
  Stmt q(db_, "SELECT 1 FROM sandboxes WHERE id = ?1", "look up " + id);
  q.bind(1, id);
  if (!q.step()) throw Error(Errc::not_found, "no sandbox " + id);
  return false;
}

void Registry::set_pid(const std::string& id, int pid) {
  std::lock_guard lock(mu_);
  Stmt s(db_, "UPDATE sandboxes SET pid=?2 WHERE id=?1", "set pid of " + id);
  s.bind(1, id).bind(2, static_cast<int64_t>(pid));
  s.step();
  if (sqlite3_changes(db_) == 0) throw Error(Errc::not_found, "no sandbox " + id);
}

void Registry::set_spec(const std::string& id, const SandboxSpec& spec) {
  std::lock_guard lock(mu_);
  Stmt s(db_, "UPDATE sandboxes SET spec=?2 WHERE id=?1", "set spec of " + id);
  s.bind(1, id).bind(2, spec_to_json(spec).dump());
  s.step();
  if (sqlite3_changes(db_) == 0) throw Error(Errc::not_found, "no sandbox " + id);
}

void Registry::set_expiry(const std::string& id, int64_t expires_at_ms, const SandboxSpec& spec) {
  std::lock_guard lock(mu_);
  Stmt s(db_, "UPDATE sandboxes SET spec=?2, expires_at_ms=?3 WHERE id=?1", "set expiry of " + id);
  s.bind(1, id).bind(2, spec_to_json(spec).dump()).bind(3, expires_at_ms);
  s.step();
  if (sqlite3_changes(db_) == 0) throw Error(Errc::not_found, "no sandbox " + id);
}

std::optional<SandboxRecord> Registry::get(const std::string& id) const {
  std::lock_guard lock(mu_);
  Stmt s(db_, (std::string("SELECT ") + kColumns + " FROM sandboxes WHERE id = ?1").c_str(),
         "get " + id);
  s.bind(1, id);
  if (!s.step()) return std::nullopt;
  return read_row(s);
}

std::vector<SandboxRecord> Registry::list(bool all) const {
  std::lock_guard lock(mu_);
  std::string sql = std::string("SELECT ") + kColumns + " FROM sandboxes";
  if (!all) sql += " WHERE state NOT IN ('deleted','timed_out','failed')";
  sql += " ORDER BY created_at_ms, id";
  Stmt s(db_, sql.c_str(), "list sandboxes");
  std::vector<SandboxRecord> out;
  while (s.step()) out.push_back(read_row(s));
  return out;
}

std::optional<JournalHead> Registry::load_head(const std::string& sandbox) {
  std::lock_guard lock(mu_);
  Stmt q(db_, "SELECT seq, hash, bytes, signature FROM journal_heads WHERE sandbox = ?",
         "read journal head");
  q.bind(1, sandbox);
  if (!q.step()) return std::nullopt;
  return JournalHead{static_cast<uint64_t>(q.integer(0)), q.text(1),
                     static_cast<uint64_t>(q.integer(2)), q.text(3)};
}

void Registry::store_head(const std::string& sandbox, const JournalHead& h) {
  std::lock_guard lock(mu_);
  Stmt q(db_,
         "INSERT INTO journal_heads (sandbox, seq, hash, bytes, signature) VALUES (?, ?, ?, ?, ?)"
         " ON CONFLICT(sandbox) DO UPDATE SET seq = excluded.seq, hash = excluded.hash,"
         " bytes = excluded.bytes, signature = excluded.signature",
         "anchor journal head");
  q.bind(1, sandbox)
      .bind(2, static_cast<int64_t>(h.seq))
      .bind(3, h.hash)
      .bind(4, static_cast<int64_t>(h.bytes))
      .bind(5, h.signature);
  q.step();
}

}  // namespace airlock::engine

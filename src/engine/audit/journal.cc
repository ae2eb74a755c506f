#include "engine/audit/journal.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <fstream>
#include <set>
#include <string_view>
#include <utility>

#include "common/error.h"
#include "common/unique_fd.h"

namespace airlock::engine {
namespace {

// Ids come from the engine, but the journal is also read by id straight
// from an API path: refuse anything that could name another file.
void check_id(const std::string& id) {
  bool ok = !id.empty() && id.size() <= 64;
  for (char c : id) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_')) ok = false;
  }
  if (!ok) throw Error(Errc::invalid_argument, "invalid sandbox id '" + id + "'", "id");
}

// One write of the whole line (see append), fsync'd for Durability::sync.
void write_line(int fd, const std::string& line, Durability durability,
                const std::filesystem::path& path) {
  // One write: O_APPEND makes it atomic with respect to other appenders for
  // regular files. A short write (disk full) is reported, not retried, so a
  // retry can never splice a second half onto someone else's line.
  ssize_t n;
  do {
    n = ::write(fd, line.data(), line.size());
  } while (n < 0 && errno == EINTR);
  int saved = errno;
  if (n == static_cast<ssize_t>(line.size()) && durability == Durability::sync) {
    if (::fsync(fd) != 0) saved = errno, n = -1;
  }
  if (n != static_cast<ssize_t>(line.size())) {
    errno = n < 0 ? saved : ENOSPC;
    throw_errno("append to audit journal " + path.string());
  }
}

std::string make_line(const std::string& sandbox, const std::string& event,
                      const nlohmann::json& fields, uint64_t seq, const std::string& prev) {
  // ts/sandbox/event first so a human reading the file sees them first;
  // seq/prev next: the chain (chain.h).
  nlohmann::ordered_json rec;
  rec["ts"] = rfc3339_now();
  rec["sandbox"] = sandbox;
  rec["event"] = event;
  rec["seq"] = seq;
  rec["prev"] = prev;
  for (auto& [k, v] : fields.items()) {
    if (k != "ts" && k != "sandbox" && k != "event" && k != "seq" && k != "prev") rec[k] = v;
  }
  // Invalid UTF-8 (argv is bytes) is replaced rather than making dump() throw.
  return rec.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

// Reads the complete line that ends just before `end` (the offset of its
// newline); "" if none (end == 0). Bounded by kMaxLine.
std::string line_before(int fd, uint64_t end, size_t max_line) {
  std::string acc;
  uint64_t pos = end;
  char buf[8192];
  while (pos > 0 && acc.size() <= max_line) {
    size_t want = static_cast<size_t>(std::min<uint64_t>(pos, sizeof buf));
    ssize_t n = ::pread(fd, buf, want, static_cast<off_t>(pos - want));
    if (n != static_cast<ssize_t>(want)) break;
    std::string_view chunk(buf, want);
    size_t nl = chunk.rfind('\n');
    if (nl != std::string_view::npos) {
      acc.insert(0, chunk.substr(nl + 1));
      return acc;
    }
    acc.insert(0, chunk);
    pos -= want;
  }
  return acc;
}

// A record line longer than this is not ours (a record is at most a request
// body plus fields): the reader drops it rather than buffer without bound.
constexpr size_t kMaxLine = 32u << 20;
// How far before the ordinary cap journal_truncated may sit (one record).
constexpr uint64_t kNoteWindow = 1u << 20;

}  // namespace

std::string rfc3339_ms(int64_t unix_ms) {
  time_t secs = static_cast<time_t>(unix_ms / 1000);
  int ms = static_cast<int>(unix_ms % 1000);
  if (ms < 0) {
    ms += 1000;
    secs -= 1;
  }
  struct tm tm {};
  gmtime_r(&secs, &tm);
  char buf[64];
  snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
           tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
  return buf;
}

std::string rfc3339_now() {
  auto now = std::chrono::system_clock::now().time_since_epoch();
  return rfc3339_ms(std::chrono::duration_cast<std::chrono::milliseconds>(now).count());
}

AuditJournal::AuditJournal(std::filesystem::path dir, JournalLimits limits, JournalAnchor* anchor,
                           std::shared_ptr<const HostKey> key, std::chrono::milliseconds anchor_lag)
    : dir_(std::move(dir)),
      limits_(limits),
      anchor_(anchor),
      key_(std::move(key)),
      anchor_lag_(anchor_lag) {
  if (limits_.max_bytes != 0 && limits_.lifecycle_reserve_bytes >= limits_.max_bytes)
    throw Error(Errc::invalid_argument,
                "journal cap (" + std::to_string(limits_.max_bytes) +
                    " bytes) must be larger than its lifecycle reserve (" +
                    std::to_string(limits_.lifecycle_reserve_bytes) + " bytes)",
                "journal_max_bytes");
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec)
    throw Error(Errc::internal, "cannot create audit dir " + dir_.string() + ": " + ec.message());
  if (anchor_ && anchor_lag_.count() > 0) anchorer_ = std::thread([this] { anchor_loop(); });
}

AuditJournal::~AuditJournal() {
  if (!anchorer_.joinable()) return;
  {
    std::lock_guard lock(pending_mu_);
    stopping_ = true;
  }
  pending_cv_.notify_all();
  anchorer_.join();
  for (const auto& sandbox : pending_) anchor_pending(sandbox);
}

void AuditJournal::anchor_loop() {
  std::unique_lock lock(pending_mu_);
  while (!stopping_) {
    pending_cv_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
    // The appends of the next anchor_lag share one anchor.
    pending_cv_.wait_for(lock, anchor_lag_, [&] { return stopping_; });
    if (stopping_) break;  // the destructor anchors what is left
    std::set<std::string> batch;
    batch.swap(pending_);
    lock.unlock();
    for (const auto& sandbox : batch) anchor_pending(sandbox);
    lock.lock();
  }
}

void AuditJournal::anchor_pending(const std::string& sandbox) {
  auto chain = chain_of(sandbox);
  std::lock_guard chain_lock(chain->mu);
  if (!chain->loaded || chain->anchored_seq == chain->seq) return;
  // Under the file's lock, as an append: a file grown past our head was
  // appended to by another process (a second daemon), whose own append
  // anchored its newer head. A file shorter than our head lost what we
  // wrote: our head is anchored all the same, so that verify says so.
  UniqueFd fd{::open(path_of(sandbox).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW)};
  if (fd.fd >= 0) {
    int fl;
    do {
      fl = ::flock(fd.fd, LOCK_EX);
    } while (fl != 0 && errno == EINTR);
    struct stat st {};
    if (fl == 0 && ::fstat(fd.fd, &st) == 0 && static_cast<uint64_t>(st.st_size) > chain->bytes)
      return;
  }
  anchor_head(sandbox, *chain);
}

void AuditJournal::anchor_head(const std::string& sandbox, Chain& c) {
  JournalHead head{c.seq, c.hash, c.bytes, {}};
  try {
    if (key_) head.signature = key_->sign_hex(head_message(sandbox, c.seq, c.hash));
    anchor_->store_head(sandbox, head);
    c.anchored_seq = c.seq;
  } catch (const std::exception&) {
    // The record is written; a head not anchored now is anchored by the next
    // append, and verify reports the lag meanwhile (unanchored).
  }
}

std::filesystem::path AuditJournal::path_of(const std::string& sandbox) const {
  check_id(sandbox);
  return dir_ / (sandbox + ".jsonl");
}

bool AuditJournal::is_terminal(const std::string& event) {
  return event == "deleted" || event == "failed" || event == "timed_out";
}

bool AuditJournal::is_lifecycle(const std::string& event) {
  static const std::set<std::string, std::less<>> kLifecycle = {
      "created", "boot_failed", "clone_failed", "retry", "pooled", "adopted", "file",
      "network_changed", "journal_truncated",
      // What the state-keeping work (snapshots, forks, pause/resume) records.
      "snapshot", "snapshot_deleted", "fork", "forked", "restored", "paused", "resumed"};
  // exec, exec_kill and the start/end records of an exec.
  return is_terminal(event) || kLifecycle.count(event) > 0 || event.rfind("exec", 0) == 0;
}

std::shared_ptr<AuditJournal::Chain> AuditJournal::chain_of(const std::string& sandbox) {
  std::lock_guard lock(mu_);
  auto& c = chains_[sandbox];
  if (!c) c = std::make_shared<Chain>();
  return c;
}

void AuditJournal::write_chained(int fd, const std::string& sandbox, Chain& c,
                                 const std::string& line, Durability durability,
                                 const std::filesystem::path& path) {
  write_line(fd, line, durability, path);
  c.seq += 1;
  c.hash = sha256_hex(std::string_view(line).substr(0, line.size() - 1));
  c.bytes += line.size();
  if (!anchor_) return;
  if (durability == Durability::sync || !anchorer_.joinable()) {
    anchor_head(sandbox, c);
    return;
  }
  {
    std::lock_guard lock(pending_mu_);
    pending_.insert(sandbox);
  }
  pending_cv_.notify_one();
}

// Learns the chain's end from the file (first append of this process, or the
// file grew behind our back: another daemon). Repairs what a crash left and
// puts it on record: a torn last line is cut off (journal_torn_tail, with its
// size and hash), a head the registry had not anchored yet is noted
// (journal_reanchored), and a file that no longer contains its anchored head
// is noted (journal_anchor_mismatch) before anything else is appended.
void AuditJournal::load_chain(int fd, const std::string& sandbox, Chain& c, uint64_t size,
                              const std::filesystem::path& path) {
  std::vector<std::pair<std::string, nlohmann::json>> notes;
  uint64_t end = size;
  if (size > 0) {
    char lastc = 0;
    if (::pread(fd, &lastc, 1, static_cast<off_t>(size - 1)) != 1)
      throw_errno("read audit journal " + path.string());
    if (lastc != '\n') {
      std::string torn = line_before(fd, size, kMaxLine);
      end = size - torn.size();
      if (::ftruncate(fd, static_cast<off_t>(end)) != 0)
        throw_errno("cut torn tail of audit journal " + path.string());
      notes.push_back(
          {"journal_torn_tail", {{"bytes", torn.size()}, {"sha256", sha256_hex(torn)}}});
    }
  }
  c.bytes = end;
  c.seq = 0;
  c.hash = genesis_hash(sandbox);
  if (end > 0) {
    std::string last = line_before(fd, end - 1, kMaxLine);
    c.hash = sha256_hex(last);
    auto j = nlohmann::json::parse(last, nullptr, false);
    // A line without seq (a journal from before the chain) starts a chain
    // at seq 1 whose prev is that line's hash.
    if (j.is_object() && j.contains("seq") && j["seq"].is_number_unsigned())
      c.seq = j["seq"].get<uint64_t>();
  }
  c.loaded = true;
  if (anchor_) {
    std::optional<JournalHead> a;
    try {
      a = anchor_->load_head(sandbox);
    } catch (const std::exception&) {
    }
    if (a) {
      bool intact = a->bytes > 0 && a->bytes <= end &&
                    sha256_hex(line_before(fd, a->bytes - 1, kMaxLine)) == a->hash;
      if (!intact)
        notes.push_back({"journal_anchor_mismatch",
                         {{"anchor", {{"seq", a->seq}, {"hash", a->hash}, {"bytes", a->bytes}}},
                          {"file", {{"seq", c.seq}, {"hash", c.hash}, {"bytes", end}}}}});
      else if (a->seq < c.seq)
        notes.push_back({"journal_reanchored", {{"anchored_seq", a->seq}, {"head_seq", c.seq}}});
      // The notes (sync) anchor the new head; without them it is anchored.
      c.anchored_seq = intact ? a->seq : 0;
    }
  }
  for (auto& [event, fields] : notes)
    write_chained(fd, sandbox, c, make_line(sandbox, event, fields, c.seq + 1, c.hash),
                  Durability::sync, path);
}

bool AuditJournal::append(const std::string& sandbox, const std::string& event,
                          nlohmann::json fields, Durability durability) {
  auto path = path_of(sandbox);
  if (fields.is_null()) fields = nlohmann::json::object();
  if (!fields.is_object()) throw Error(Errc::internal, "audit fields must be a JSON object");
  bool terminal = is_terminal(event);
  if (terminal && limits_.max_bytes != 0) {
    std::lock_guard lock(mu_);
    auto it = dropped_.find(sandbox);
    if (it != dropped_.end())
      fields["journal_dropped"] = {{"records", it->second.records}, {"bytes", it->second.bytes}};
  }
  // One appender per sandbox at a time: in this process (the chain's mutex)
  // and across processes (flock on the file, e.g. a second daemon), so each
  // record links to the one really before it.
  auto chain = chain_of(sandbox);
  std::lock_guard chain_lock(chain->mu);
  UniqueFd fd{::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW,
                     0600)};  // owner only
  if (fd.fd < 0) throw_errno("open audit journal " + path.string());
  int fl;
  do {
    fl = ::flock(fd.fd, LOCK_EX);
  } while (fl != 0 && errno == EINTR);
  if (fl != 0) throw_errno("lock audit journal " + path.string());
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) throw_errno("stat audit journal " + path.string());
  uint64_t size = static_cast<uint64_t>(st.st_size);
  if (!chain->loaded || chain->bytes != size) {
    load_chain(fd.fd, sandbox, *chain, size, path);
    size = chain->bytes;
  }
  std::string line = make_line(sandbox, event, fields, chain->seq + 1, chain->hash);

  if (limits_.max_bytes != 0 && !terminal) {
    // The file's own size, not a count kept here: appends by other processes
    // (a second daemon) count too.
    bool lifecycle = durability == Durability::sync || is_lifecycle(event);
    uint64_t limit =
        lifecycle ? limits_.max_bytes : limits_.max_bytes - limits_.lifecycle_reserve_bytes;
    if (size + line.size() > limit) {
      std::lock_guard lock(mu_);
      Dropped& d = dropped_[sandbox];
      d.records += 1;
      d.bytes += line.size();
      if (!d.noted) {
        d.noted = true;
        // Once per journal, also across daemon restarts. Written whatever the
        // size: it is small and there is one.
        if (!already_noted(path, size)) {
          write_chained(fd.fd, sandbox, *chain,
                        make_line(sandbox, "journal_truncated",
                                  {{"max_bytes", limits_.max_bytes},
                                   {"lifecycle_reserve_bytes", limits_.lifecycle_reserve_bytes},
                                   {"dropped_records", d.records},
                                   {"dropped_bytes", d.bytes},
                                   {"first_dropped", event}},
                                  chain->seq + 1, chain->hash),
                        Durability::sync, path);
        }
      }
      return false;
    }
  }
  write_chained(fd.fd, sandbox, *chain, line, durability, path);
  if (event == "deleted") {
    std::lock_guard lock(mu_);
    dropped_.erase(sandbox);  // nothing of it is written after its end
  }
  return true;
}

VerifyReport AuditJournal::verify(const std::string& sandbox) {
  auto path = path_of(sandbox);
  if (anchorer_.joinable()) anchor_pending(sandbox);
  // The anchor first, the file second: whatever was anchored is in the file
  // by then (it is written before it is anchored).
  std::optional<JournalHead> head;
  if (anchor_) head = anchor_->load_head(sandbox);
  return verify_journal(path, sandbox, head, key_.get());
}

// Whether `path` (of `size` bytes) already has its journal_truncated record,
// written by an earlier daemon. It sits just past the ordinary cap (or, when
// other writers grew the file first, near its end), so only those two
// windows are read, once per sandbox and process.
bool AuditJournal::already_noted(const std::filesystem::path& path, uint64_t size) const {
  UniqueFd fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW)};
  if (fd.fd < 0) return false;
  uint64_t soft = limits_.max_bytes - limits_.lifecycle_reserve_bytes;
  uint64_t near_cap = soft > kNoteWindow ? soft - kNoteWindow : 0;
  uint64_t near_end = size > 2 * kNoteWindow ? size - 2 * kNoteWindow : 0;
  for (uint64_t from : {near_cap, std::max(near_end, near_cap + 4 * kNoteWindow)}) {
    if (from >= size) continue;
    std::string tail(static_cast<size_t>(std::min<uint64_t>(size - from, 4 * kNoteWindow)), '\0');
    ssize_t n = ::pread(fd.fd, tail.data(), tail.size(), static_cast<off_t>(from));
    if (n <= 0) continue;
    tail.resize(static_cast<size_t>(n));
    size_t pos = 0;
    while ((pos = tail.find("\"journal_truncated\"", pos)) != std::string::npos) {
      size_t b = tail.rfind('\n', pos);
      b = b == std::string::npos ? 0 : b + 1;
      size_t e = tail.find('\n', pos);
      if (e == std::string::npos) break;
      // A whole line whose own event is journal_truncated, not a field value.
      auto j = nlohmann::json::parse(tail.substr(b, e - b), nullptr, false);
      if (j.is_object() && j.value("event", "") == "journal_truncated") return true;
      pos = e;
    }
  }
  return false;
}

JournalStats AuditJournal::stats(const std::string& sandbox) const {
  auto path = path_of(sandbox);
  JournalStats s;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) s.bytes = static_cast<uint64_t>(st.st_size);
  std::lock_guard lock(mu_);
  auto it = dropped_.find(sandbox);
  if (it != dropped_.end()) {
    s.dropped_records = it->second.records;
    s.dropped_bytes = it->second.bytes;
  }
  s.truncated =
      s.dropped_records > 0 ||
      (limits_.max_bytes != 0 && s.bytes >= limits_.max_bytes - limits_.lifecycle_reserve_bytes);
  return s;
}

std::vector<nlohmann::json> AuditJournal::read(const std::string& sandbox) const {
  auto path = path_of(sandbox);
  JournalReader r(path);
  if (!r.exists()) throw Error(Errc::not_found, "no audit journal for sandbox " + sandbox, "id");
  return r.next();
}

JournalReader AuditJournal::reader(const std::string& sandbox, std::string event_prefix) const {
  return JournalReader(path_of(sandbox), std::move(event_prefix));
}

JournalReader::JournalReader(std::filesystem::path path, std::string event_prefix)
    : path_(std::move(path)), prefix_(std::move(event_prefix)) {
  open_file();
}

JournalReader::JournalReader(JournalReader&& o) noexcept
    : path_(std::move(o.path_)),
      prefix_(std::move(o.prefix_)),
      fd_(std::exchange(o.fd_, -1)),
      inotify_fd_(std::exchange(o.inotify_fd_, -1)),
      offset_(o.offset_),
      bytes_read_(o.bytes_read_),
      partial_(std::move(o.partial_)),
      skip_line_(o.skip_line_) {}

JournalReader::~JournalReader() {
  if (fd_ >= 0) ::close(fd_);
  if (inotify_fd_ >= 0) ::close(inotify_fd_);
}

bool JournalReader::open_file() {
  if (fd_ >= 0) return true;
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd_ < 0) return false;
  // Watch after opening: an append in between is seen by wait()'s size check.
  // Without inotify (the per-user instance limit) wait() polls instead.
  int ino = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (ino >= 0 && ::inotify_add_watch(ino, path_.c_str(), IN_MODIFY | IN_DONT_FOLLOW) < 0) {
    ::close(ino);
    ino = -1;
  }
  inotify_fd_ = ino;
  return true;
}

std::vector<nlohmann::json> JournalReader::next() {
  std::vector<nlohmann::json> out;
  if (!open_file()) return out;
  auto take = [&](std::string_view line) {
    if (line.empty()) return;
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return;  // torn line from a crash mid-write
    if (!prefix_.empty()) {
      auto ev = j.find("event");
      if (ev == j.end() || !ev->is_string() || ev->get_ref<const std::string&>().rfind(prefix_, 0))
        return;
    }
    out.push_back(std::move(j));
  };
  std::string buf(64 * 1024, '\0');
  while (true) {
    ssize_t n = ::pread(fd_, buf.data(), buf.size(), static_cast<off_t>(offset_));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    offset_ += static_cast<uint64_t>(n);
    bytes_read_ += static_cast<uint64_t>(n);
    std::string_view chunk(buf.data(), static_cast<size_t>(n));
    size_t nl;
    while ((nl = chunk.find('\n')) != std::string_view::npos) {
      if (skip_line_) {
        skip_line_ = false;
      } else if (partial_.empty()) {
        take(chunk.substr(0, nl));
      } else {
        partial_.append(chunk.substr(0, nl));
        take(partial_);
        partial_.clear();
      }
      chunk.remove_prefix(nl + 1);
    }
    if (!skip_line_) partial_.append(chunk);
    if (partial_.size() > kMaxLine) {
      partial_.clear();
      skip_line_ = true;
    }
  }
  return out;
}

RecordFollower::Wake JournalReader::wait(std::chrono::milliseconds timeout, int hangup_fd) {
  open_file();
  auto grown = [&] {
    struct stat st {};
    return fd_ >= 0 && ::fstat(fd_, &st) == 0 && static_cast<uint64_t>(st.st_size) > offset_;
  };
  if (grown()) return Wake::grew;
  pollfd fds[2];
  int n = 0, hang = -1, ino = -1;
  if (hangup_fd >= 0) {
    fds[n] = {hangup_fd, 0, 0};  // POLLHUP/POLLERR are always reported
    hang = n++;
  }
  if (inotify_fd_ >= 0) {
    fds[n] = {inotify_fd_, POLLIN, 0};
    ino = n++;
  }
  // Bounded poll where nothing will wake us: no inotify, or no file yet.
  auto ms = timeout.count();
  if (inotify_fd_ < 0) ms = std::min<decltype(ms)>(ms, 100);
  int r = ::poll(fds, static_cast<nfds_t>(n), static_cast<int>(std::max<decltype(ms)>(ms, 0)));
  if (r < 0) return Wake::grew;  // EINTR: let the caller look
  if (hang >= 0 && (fds[hang].revents & (POLLHUP | POLLERR | POLLNVAL))) return Wake::hangup;
  if (ino >= 0 && (fds[ino].revents & POLLIN)) {
    char drain[4096];
    while (::read(inotify_fd_, drain, sizeof drain) > 0) {
    }
    return Wake::grew;
  }
  return grown() ? Wake::grew : Wake::timeout;
}

}  // namespace airlock::engine

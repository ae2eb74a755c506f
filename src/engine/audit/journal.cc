#include "engine/audit/journal.h"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <fstream>

#include "common/error.h"

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

AuditJournal::AuditJournal(std::filesystem::path dir) : dir_(std::move(dir)) {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec)
    throw Error(Errc::internal, "cannot create audit dir " + dir_.string() + ": " + ec.message());
}

std::filesystem::path AuditJournal::path_of(const std::string& sandbox) const {
  check_id(sandbox);
  return dir_ / (sandbox + ".jsonl");
}

void AuditJournal::append(const std::string& sandbox, const std::string& event,
                          nlohmann::json fields, Durability durability) {
  auto path = path_of(sandbox);
  if (fields.is_null()) fields = nlohmann::json::object();
  if (!fields.is_object()) throw Error(Errc::internal, "audit fields must be a JSON object");
  // ts/sandbox/event first so a human reading the file sees them first.
  nlohmann::ordered_json rec;
  rec["ts"] = rfc3339_now();
  rec["sandbox"] = sandbox;
  rec["event"] = event;
  for (auto& [k, v] : fields.items()) {
    if (k != "ts" && k != "sandbox" && k != "event") rec[k] = v;
  }
  // Invalid UTF-8 (argv is bytes) is replaced rather than making dump() throw.
  std::string line = rec.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";

  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);  // owner only
  if (fd < 0) throw_errno("open audit journal " + path.string());
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
  ::close(fd);
  if (n != static_cast<ssize_t>(line.size())) {
    errno = n < 0 ? saved : ENOSPC;
    throw_errno("append to audit journal " + path.string());
  }
}

std::vector<nlohmann::json> AuditJournal::read(const std::string& sandbox) const {
  auto path = path_of(sandbox);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(Errc::not_found, "no audit journal for sandbox " + sandbox, "id");
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) continue;  // torn line from a crash mid-write
    out.push_back(std::move(j));
  }
  return out;
}

}  // namespace airlock::engine

#include "auth/audit_log.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <deque>
#include <fstream>

#include "common/error.h"

namespace airlock::auth {

namespace {

int open_log(const std::filesystem::path& file, uint64_t& size) {
  int fd = ::open(file.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) throw_errno("cannot open the audit log " + file.string());
  ::fchmod(fd, 0600);
  struct stat st {};
  size = ::fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  return fd;
}

// A client's path (or any string) of any length leaves kMaxField bytes.
void truncate_strings(nlohmann::json& record) {
  for (auto& [k, v] : record.items()) {
    if (!v.is_string()) continue;
    const auto& text = v.get_ref<const std::string&>();
    if (text.size() <= AuditLog::kMaxField) continue;
    v = text.substr(0, AuditLog::kMaxField) + "...[truncated, " + std::to_string(text.size()) +
        " bytes]";
  }
}

}  // namespace

AuditLog::AuditLog(std::filesystem::path file, AuditLogOptions options)
    : file_(std::move(file)), options_(options) {
  fd_ = open_log(file_, size_);
}

std::filesystem::path AuditLog::generation(int n) const {
  return file_.string() + "." + std::to_string(n);
}

void AuditLog::rotate() {
  std::error_code ec;
  if (options_.generations <= 0) {
    std::filesystem::remove(file_, ec);
  } else {
    for (int g = options_.generations - 1; g >= 1; --g)
      std::filesystem::rename(generation(g), generation(g + 1), ec);  // a missing one: skipped
    std::filesystem::rename(file_, generation(1), ec);
  }
  if (ec) spdlog::error("audit log {}: rotation: {}", file_.string(), ec.message());
  int fd = -1;
  try {
    uint64_t size = 0;
    fd = open_log(file_, size);
    size_ = size;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return;  // keep appending to the old descriptor rather than lose records
  }
  ::close(fd_);
  fd_ = fd;
}

AuditLog::~AuditLog() {
  if (fd_ >= 0) ::close(fd_);
}

void AuditLog::append(nlohmann::json record) {
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()) % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[40];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  char full[48];
  std::snprintf(full, sizeof full, "%s.%03dZ", buf, static_cast<int>(ms.count()));
  nlohmann::json line = {{"time", full}};
  for (auto& [k, v] : record.items()) line[k] = v;
  truncate_strings(line);
  std::string text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  std::lock_guard lock(mu_);
  if (size_ > 0 && size_ + text.size() > options_.max_bytes) rotate();
  // One write per record with O_APPEND: lines never interleave.
  if (::write(fd_, text.data(), text.size()) != static_cast<ssize_t>(text.size()))
    spdlog::error("audit log {}: write failed", file_.string());
  else
    size_ += text.size();
}

std::vector<nlohmann::json> AuditLog::tail(size_t limit) const {
  std::lock_guard lock(mu_);
  auto read = [limit](const std::filesystem::path& p) {
    std::ifstream in(p);
    std::deque<std::string> lines;
    for (std::string line; std::getline(in, line);) {
      if (line.empty()) continue;
      lines.push_back(std::move(line));
      if (lines.size() > limit) lines.pop_front();
    }
    return lines;
  };
  std::deque<std::string> lines = read(file_);
  if (lines.size() < limit && options_.generations > 0) {
    auto older = read(generation(1));
    while (!older.empty() && lines.size() < limit) {
      lines.push_front(std::move(older.back()));
      older.pop_back();
    }
  }
  std::vector<nlohmann::json> out;
  for (const auto& l : lines) {
    auto j = nlohmann::json::parse(l, nullptr, false);
    if (!j.is_discarded()) out.push_back(std::move(j));
  }
  return out;
}

}  // namespace airlock::auth

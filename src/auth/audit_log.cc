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

AuditLog::AuditLog(std::filesystem::path file) : file_(std::move(file)) {
  fd_ = ::open(file_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd_ < 0) throw_errno("cannot open the audit log " + file_.string());
  ::fchmod(fd_, 0600);
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
  std::string text = line.dump() + "\n";
  std::lock_guard lock(mu_);
  // One write per record with O_APPEND: lines never interleave.
  if (::write(fd_, text.data(), text.size()) != static_cast<ssize_t>(text.size()))
    spdlog::error("audit log {}: write failed", file_.string());
}

std::vector<nlohmann::json> AuditLog::tail(size_t limit) const {
  std::lock_guard lock(mu_);
  std::ifstream in(file_);
  std::deque<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    lines.push_back(std::move(line));
    if (lines.size() > limit) lines.pop_front();
  }
  std::vector<nlohmann::json> out;
  for (const auto& l : lines) {
    auto j = nlohmann::json::parse(l, nullptr, false);
    if (!j.is_discarded()) out.push_back(std::move(j));
  }
  return out;
}

}  // namespace airlock::auth

#include "auth/quotas.h"

#include "auth/files.h"
#include "auth/tokens.h"
#include "common/error.h"

namespace airlock::auth {

using nlohmann::json;

namespace {
constexpr const char* kFields[] = {"max_sandboxes", "max_memory_mb", "max_disk_mb",
                                   "creates_per_minute"};
int64_t* field_of(Quota& q, const std::string& k) {
  if (k == "max_sandboxes") return &q.max_sandboxes;
  if (k == "max_memory_mb") return &q.max_memory_mb;
  if (k == "max_disk_mb") return &q.max_disk_mb;
  if (k == "creates_per_minute") return &q.creates_per_minute;
  return nullptr;
}
}  // namespace

json to_json(const Quota& q) {
  json j;
  Quota c = q;
  for (const char* k : kFields) {
    int64_t v = *field_of(c, k);
    j[k] = v < 0 ? json(nullptr) : json(v);
  }
  return j;
}

Quota parse_quota(const json& body) {
  if (!body.is_object())
    throw Error(Errc::invalid_argument, "request body must be a JSON object", "body");
  Quota q;
  for (const auto& [k, v] : body.items()) {
    int64_t* f = field_of(q, k);
    if (!f)
      throw Error(
          Errc::invalid_argument,
          "unknown field " + k + " (max_sandboxes, max_memory_mb, max_disk_mb, creates_per_minute)",
          k);
    if (v.is_null()) continue;
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > (int64_t{1} << 40))
      throw Error(Errc::invalid_argument, k + " must be a non-negative integer or null", k);
    *f = v.get<int64_t>();
  }
  return q;
}

Quotas::Quotas(std::filesystem::path file, std::function<Clock::time_point()> now)
    : file_(std::move(file)), now_(std::move(now)) {
  auto text = read_file(file_);
  if (!text) return;
  json j = json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("tenants") || !j["tenants"].is_object())
    throw Error(Errc::internal, file_.string() + " is not a tenants file (fix or remove it)");
  for (const auto& [t, q] : j["tenants"].items()) quotas_[t] = parse_quota(q);
}

void Quotas::save() const {
  json t = json::object();
  for (const auto& [name, q] : quotas_) t[name] = to_json(q);
  write_private(file_, json{{"tenants", t}}.dump(2) + "\n");
}

void Quotas::set(const std::string& tenant, const Quota& quota) {
  check_tenant(tenant);
  std::lock_guard lock(mu_);
  auto old = quotas_;
  quotas_[tenant] = quota;
  try {
    save();
  } catch (...) {
    quotas_ = old;
    throw;
  }
}

std::map<std::string, Quota> Quotas::list() const {
  std::lock_guard lock(mu_);
  return quotas_;
}

Quota Quotas::get(const std::string& tenant) const {
  std::lock_guard lock(mu_);
  auto it = quotas_.find(tenant);
  return it == quotas_.end() ? Quota{} : it->second;
}

std::unique_ptr<Quotas::Reservation> Quotas::reserve(const std::string& tenant, int64_t memory_mb,
                                                     int64_t disk_mb,
                                                     const std::function<Usage()>& usage,
                                                     bool counts_as_create) {
  std::lock_guard lock(mu_);
  Quota q;
  if (auto it = quotas_.find(tenant); it != quotas_.end()) q = it->second;
  auto over = [&](const char* field, int64_t limit, const std::string& what) {
    throw Error(Errc::quota_exceeded,
                "tenant " + tenant + ": " + field + " " + std::to_string(limit) + " " + what,
                field);
  };
  Usage u = usage();
  const Pending& p = pending_[tenant];
  if (q.max_sandboxes >= 0 && u.sandboxes + p.sandboxes + 1 > q.max_sandboxes)
    over("max_sandboxes", q.max_sandboxes, "reached");
  if (q.max_memory_mb >= 0 && u.memory_mb + p.memory_mb + memory_mb > q.max_memory_mb)
    over("max_memory_mb", q.max_memory_mb,
         "would be exceeded (" + std::to_string(u.memory_mb + p.memory_mb) + " in use, " +
             std::to_string(memory_mb) + " asked)");
  if (q.max_disk_mb >= 0 && u.disk_mb + p.disk_mb + disk_mb > q.max_disk_mb)
    over("max_disk_mb", q.max_disk_mb,
         "would be exceeded (" + std::to_string(u.disk_mb + p.disk_mb) + " in use, " +
             std::to_string(disk_mb) + " asked)");
  if (counts_as_create && q.creates_per_minute >= 0) {
    auto now = now_();
    auto& window = creates_[tenant];
    while (!window.empty() && now - window.front() >= std::chrono::minutes(1)) window.pop_front();
    if (static_cast<int64_t>(window.size()) >= q.creates_per_minute)
      throw Error(Errc::rate_limited,
                  "tenant " + tenant + ": creates_per_minute " +
                      std::to_string(q.creates_per_minute) + " reached; try again later",
                  "creates_per_minute");
    window.push_back(now);
  }
  Pending& pw = pending_[tenant];
  pw.sandboxes += 1;
  pw.memory_mb += memory_mb;
  pw.disk_mb += disk_mb;
  return std::unique_ptr<Reservation>(new Reservation(this, tenant, memory_mb, disk_mb));
}

void Quotas::release(const std::string& tenant, int64_t mem, int64_t disk) {
  std::lock_guard lock(mu_);
  Pending& p = pending_[tenant];
  p.sandboxes -= 1;
  p.memory_mb -= mem;
  p.disk_mb -= disk;
  if (p.sandboxes <= 0) pending_.erase(tenant);
}

Quotas::Reservation::~Reservation() { q_->release(tenant_, mem_, disk_); }

}  // namespace airlock::auth

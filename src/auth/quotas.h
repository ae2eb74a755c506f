// Per-tenant quotas, set by the operator (PUT /v1/tenants/{tenant}) and kept
// in <data dir>/tenants.json (0600, rewritten atomically). A create first
// takes a Reservation: the tenant's live sandboxes plus the reservations
// of creates still booting must fit, so concurrent creates cannot overshoot;
// the reservation ends when the create returns (the sandbox then counts
// itself) or fails (nothing was made).
//
//   Quotas q(data_dir / "tenants.json");
//   q.set("acme", {.max_sandboxes = 2});
//   auto r = q.reserve("acme", 512, 2048, [&] { return usage_of("acme"); });  // or 429
//   engine.create(spec);   // r released at scope end
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

namespace airlock::auth {

struct Quota {
  // -1 = no limit.
  int64_t max_sandboxes = -1;
  int64_t max_memory_mb = -1;  // sum of memory_mb over live sandboxes
  int64_t max_disk_mb = -1;    // sum of disk_mb over live sandboxes
  int64_t creates_per_minute = -1;
};
nlohmann::json to_json(const Quota& q);
// {"max_sandboxes": N|null, ...}: unknown fields and non-integers refused by
// name; null or absent = no limit.
Quota parse_quota(const nlohmann::json& body);

// What a tenant holds right now (its live sandboxes).
struct Usage {
  int64_t sandboxes = 0, memory_mb = 0, disk_mb = 0;
};

class Quotas {
 public:
  using Clock = std::chrono::steady_clock;
  explicit Quotas(std::filesystem::path file, std::function<Clock::time_point()> now = Clock::now);

  void set(const std::string& tenant, const Quota& quota);
  std::map<std::string, Quota> list() const;
  Quota get(const std::string& tenant) const;  // all -1 if never set

  class Reservation {
   public:
    ~Reservation();
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;

   private:
    friend class Quotas;
    Reservation(Quotas* q, std::string tenant, int64_t mem, int64_t disk)
        : q_(q), tenant_(std::move(tenant)), mem_(mem), disk_(disk) {}
    Quotas* q_;
    std::string tenant_;
    int64_t mem_, disk_;
  };
  // Throws Error(quota_exceeded, field = the limit) naming the limit and its
  // value, or Error(rate_limited, field "creates_per_minute"). `usage` is
  // called with the quota lock held, so it must not call back into Quotas.
  // A resume reserves like a create but is not a create (`counts_as_create`
  // false: creates_per_minute neither limits nor counts it).
  std::unique_ptr<Reservation> reserve(const std::string& tenant, int64_t memory_mb,
                                       int64_t disk_mb, const std::function<Usage()>& usage,
                                       bool counts_as_create = true);

 private:
  void save() const;  // mu_ held
  void release(const std::string& tenant, int64_t mem, int64_t disk);

  struct Pending {
    int64_t sandboxes = 0, memory_mb = 0, disk_mb = 0;
  };
  std::filesystem::path file_;
  std::function<Clock::time_point()> now_;
  mutable std::mutex mu_;
  std::map<std::string, Quota> quotas_;
  std::map<std::string, Pending> pending_;
  std::map<std::string, std::deque<Clock::time_point>> creates_;
};

}  // namespace airlock::auth

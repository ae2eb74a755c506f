#include "engine/audit/limiter.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "common/error.h"

namespace airlock::engine {
namespace {

void check_rate(const EventLimiter::Rate& r) {
  if (!(r.per_second >= 0) || !std::isfinite(r.per_second) || !(r.burst >= 1) ||
      !std::isfinite(r.burst))
    throw Error(Errc::invalid_argument,
                "event rate must be >= 0 per second with a burst >= 1 (got " +
                    std::to_string(r.per_second) + "/s, burst " + std::to_string(r.burst) + ")",
                "rate");
}

}  // namespace

EventLimiter::EventLimiter(Rate default_rate, std::function<Clock::time_point()> now)
    : default_(default_rate), now_(std::move(now)) {
  check_rate(default_);
}

void EventLimiter::set_rate(const std::string& kind, Rate rate) {
  check_rate(rate);
  std::lock_guard lock(mu_);
  Bucket& b = bucket(kind);
  b.rate = rate;
  b.tokens = rate.burst;
}

EventLimiter::Bucket& EventLimiter::bucket(std::string_view kind) {
  auto it = buckets_.find(kind);
  if (it != buckets_.end()) return it->second;
  // Past the cap, new kinds share one bucket: memory stays bounded whatever
  // names reach here.
  std::string key(kind);
  if (buckets_.size() >= kMaxKinds) {
    key = "other";
    it = buckets_.find(key);
    if (it != buckets_.end()) return it->second;
  }
  Bucket b;
  b.rate = default_;
  b.tokens = default_.burst;
  b.last = now_();
  return buckets_.emplace(std::move(key), b).first->second;
}

bool EventLimiter::admit(std::string_view kind) {
  std::lock_guard lock(mu_);
  Bucket& b = bucket(kind);
  auto t = now_();
  if (t > b.last) {
    double secs = std::chrono::duration<double>(t - b.last).count();
    b.tokens = std::min(b.rate.burst, b.tokens + secs * b.rate.per_second);
    b.last = t;
  }
  if (b.tokens >= 1) {
    b.tokens -= 1;
    return true;
  }
  ++b.pending;
  ++b.total;
  return false;
}

std::map<std::string, uint64_t> EventLimiter::take_suppressed() {
  std::lock_guard lock(mu_);
  std::map<std::string, uint64_t> out;
  for (auto& [kind, b] : buckets_) {
    if (b.pending) out[kind] = std::exchange(b.pending, 0);
  }
  return out;
}

bool EventLimiter::has_suppressed() const {
  std::lock_guard lock(mu_);
  return std::any_of(buckets_.begin(), buckets_.end(),
                     [](const auto& kv) { return kv.second.pending > 0; });
}

uint64_t EventLimiter::total_suppressed(std::string_view kind) const {
  std::lock_guard lock(mu_);
  auto it = buckets_.find(kind);
  return it == buckets_.end() ? 0 : it->second.total;
}

}  // namespace airlock::engine

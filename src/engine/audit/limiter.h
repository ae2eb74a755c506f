// A rate limiter for guest-driven events (DNS answers, flows, exec events
// from the guest...): one token bucket per event kind, with the events it
// suppresses counted per kind so a summary record can say what was left out.
//
//   EventLimiter lim({.per_second = 20, .burst = 100});
//   lim.set_rate("net_dns", {.per_second = 5, .burst = 50});
//   if (lim.admit("net_dns")) journal.append(id, "net_dns", rec);
//   ...
//   auto s = lim.take_suppressed();   // {"net_dns": 1234}, counts reset
//   if (!s.empty()) journal.append(id, "events_suppressed", {{"suppressed", s}});
//
// Kinds are meant to be the caller's constants; a kind the limiter has not
// seen beyond max_kinds shares one bucket ("other") so a guest-chosen string
// cannot grow it. Time is a steady clock (injectable for tests): a wall clock
// step must neither flood nor starve. Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

namespace airlock::engine {

struct EventRate {
  double per_second = 20;  // tokens added per second; 0 = only the burst, ever
  double burst = 100;      // bucket size: events admitted back to back
};

class EventLimiter {
 public:
  using Clock = std::chrono::steady_clock;
  using Rate = EventRate;
  static constexpr size_t kMaxKinds = 64;

  explicit EventLimiter(Rate default_rate = {},
                        std::function<Clock::time_point()> now = Clock::now);

  // The rate of `kind` (else the default). Resets its bucket to full.
  // Error(invalid_argument, field "rate") for a negative rate or a burst < 1.
  void set_rate(const std::string& kind, Rate rate);

  // True: record this event (a token is taken). False: suppressed, counted.
  bool admit(std::string_view kind);

  // Suppressed counts per kind since the last call (kinds with 0 left out),
  // and resets them: the fields of a summary record.
  std::map<std::string, uint64_t> take_suppressed();
  // Whether anything is waiting for take_suppressed().
  bool has_suppressed() const;
  // Suppressed events of `kind` since construction (never reset).
  uint64_t total_suppressed(std::string_view kind) const;

 private:
  struct Bucket {
    Rate rate;
    double tokens = 0;
    Clock::time_point last;
    uint64_t pending = 0;  // suppressed since take_suppressed()
    uint64_t total = 0;
  };
  Bucket& bucket(std::string_view kind);  // mu_ held

  Rate default_;
  std::function<Clock::time_point()> now_;
  mutable std::mutex mu_;
  std::map<std::string, Bucket, std::less<>> buckets_;
};

}  // namespace airlock::engine

#include "engine/audit/limiter.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "common/error.h"

namespace airlock::engine {
namespace {

using namespace std::chrono_literals;

// A steady clock the test moves by hand.
struct FakeClock {
  EventLimiter::Clock::time_point t{};
  std::function<EventLimiter::Clock::time_point()> fn() {
    return [this] { return t; };
  }
};

int admitted(EventLimiter& lim, const std::string& kind, int n) {
  int ok = 0;
  for (int i = 0; i < n; ++i) ok += lim.admit(kind) ? 1 : 0;
  return ok;
}

TEST(EventLimiter, AdmitsTheBurstThenTheRate) {
  FakeClock clock;
  // Binary-exact figures: 8/s, so 125 ms is one token.
  EventLimiter lim({.per_second = 8, .burst = 4}, clock.fn());
  EXPECT_EQ(admitted(lim, "net_dns", 100), 4);  // the burst, back to back
  clock.t += 1s;
  EXPECT_EQ(admitted(lim, "net_dns", 100), 4);  // 8 tokens, capped at the burst
  clock.t += 250ms;
  EXPECT_EQ(admitted(lim, "net_dns", 100), 2);
  clock.t += 62500us;  // half a token
  EXPECT_EQ(admitted(lim, "net_dns", 1), 0);
  clock.t += 62500us;  // the other half
  EXPECT_EQ(admitted(lim, "net_dns", 1), 1);
  EXPECT_EQ(lim.total_suppressed("net_dns"), 96u + 96u + 98u + 1u);
}

TEST(EventLimiter, KindsHaveTheirOwnBucketsAndRates) {
  FakeClock clock;
  EventLimiter lim({.per_second = 1, .burst = 2}, clock.fn());
  lim.set_rate("net_flow", {.per_second = 0, .burst = 4});
  EXPECT_EQ(admitted(lim, "net_dns", 10), 2);
  EXPECT_EQ(admitted(lim, "net_flow", 10), 4);  // a flood of one kind leaves others alone
  clock.t += 1h;
  EXPECT_EQ(admitted(lim, "net_flow", 10), 0);  // rate 0: the burst was all
  EXPECT_EQ(admitted(lim, "net_dns", 10), 2);
}

TEST(EventLimiter, TakeSuppressedReturnsCountsOnceAndResets) {
  FakeClock clock;
  EventLimiter lim({.per_second = 1, .burst = 1}, clock.fn());
  EXPECT_FALSE(lim.has_suppressed());
  admitted(lim, "net_dns", 4);
  admitted(lim, "net_flow", 2);
  admitted(lim, "exec_event", 1);  // admitted: not in the summary
  EXPECT_TRUE(lim.has_suppressed());
  auto s = lim.take_suppressed();
  EXPECT_EQ(s, (std::map<std::string, uint64_t>{{"net_dns", 3}, {"net_flow", 1}}));
  EXPECT_FALSE(lim.has_suppressed());
  EXPECT_TRUE(lim.take_suppressed().empty());
  admitted(lim, "net_dns", 2);
  EXPECT_EQ(lim.take_suppressed(), (std::map<std::string, uint64_t>{{"net_dns", 2}}));
  EXPECT_EQ(lim.total_suppressed("net_dns"), 5u);  // the running total is never reset
}

TEST(EventLimiter, ClockGoingBackwardsAddsNoTokens) {
  FakeClock clock;
  clock.t += 1h;
  EventLimiter lim({.per_second = 1, .burst = 1}, clock.fn());
  EXPECT_EQ(admitted(lim, "k", 3), 1);
  clock.t -= 30min;
  EXPECT_EQ(admitted(lim, "k", 3), 0);
  clock.t += 30min + 1s;  // time since the last refill counts from its instant
  EXPECT_EQ(admitted(lim, "k", 3), 1);
}

TEST(EventLimiter, UnknownKindsBeyondTheCapShareOneBucket) {
  FakeClock clock;
  EventLimiter lim({.per_second = 0, .burst = 1}, clock.fn());
  for (size_t i = 0; i < EventLimiter::kMaxKinds; ++i)
    EXPECT_TRUE(lim.admit("kind" + std::to_string(i)));
  // Guest-chosen names past the cap: one bucket, one burst between them.
  EXPECT_EQ(admitted(lim, "guest-a", 1) + admitted(lim, "guest-b", 1) + admitted(lim, "guest-c", 1),
            1);
  auto s = lim.take_suppressed();
  EXPECT_EQ(s.size(), 1u);
  EXPECT_EQ(s["other"], 2u);
}

TEST(EventLimiter, RejectsBadRates) {
  for (EventLimiter::Rate bad :
       {EventLimiter::Rate{-1, 5}, EventLimiter::Rate{1, 0}, EventLimiter::Rate{1, 0.5}}) {
    try {
      EventLimiter lim(bad);
      FAIL() << bad.per_second << "/" << bad.burst;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_argument);
      EXPECT_EQ(e.field(), "rate");
    }
  }
  EventLimiter lim;
  EXPECT_THROW(lim.set_rate("x", {1, 0}), Error);
}

TEST(EventLimiter, ConcurrentAdmitsNeverExceedTheBurst) {
  FakeClock clock;  // frozen: only the burst is available
  EventLimiter lim({.per_second = 1000, .burst = 500}, clock.fn());
  std::atomic<int> ok{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) ts.emplace_back([&] { ok += admitted(lim, "net_dns", 1000); });
  for (auto& t : ts) t.join();
  EXPECT_EQ(ok.load(), 500);
  EXPECT_EQ(lim.total_suppressed("net_dns"), 3500u);
}

}  // namespace
}  // namespace airlock::engine

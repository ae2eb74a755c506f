#include "engine/net/pinning.h"

#include <gtest/gtest.h>

using namespace airlock::net;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

struct FakeClock {
  std::chrono::steady_clock::time_point now{};
  Clock fn() {
    return [this] { return now; };
  }
};

IpAddr ip(const char* s) { return *IpAddr::parse(s); }

}  // namespace

TEST(PinTable, PinsUntilTtlThenExpires) {
  FakeClock clk;
  PinTable pins(clk.fn());
  pins.add("a.com", ip("203.0.113.1"), 60);
  EXPECT_EQ(pins.names_for(ip("203.0.113.1")), std::vector<std::string>{"a.com"});
  EXPECT_TRUE(pins.names_for(ip("203.0.113.2")).empty());
  clk.now += 59s;
  EXPECT_EQ(pins.names_for(ip("203.0.113.1")).size(), 1u);
  clk.now += 1s;
  EXPECT_TRUE(pins.names_for(ip("203.0.113.1")).empty());
  EXPECT_EQ(pins.expire(), 1u);
  EXPECT_EQ(pins.size(), 0u);
}

TEST(PinTable, ClampsTtlAndBoundsSize) {
  FakeClock clk;
  PinTable pins(clk.fn(), 3, 10, 100);
  pins.add("zero.com", ip("203.0.113.1"), 0);
  clk.now += 9s;
  EXPECT_EQ(pins.names_for(ip("203.0.113.1")).size(), 1u);  // min 10 s
  pins.add("long.com", ip("203.0.113.2"), 1000000);
  clk.now += 101s;
  EXPECT_TRUE(pins.names_for(ip("203.0.113.2")).empty());  // max 100 s
  for (int i = 0; i < 10; ++i) pins.add("n" + std::to_string(i) + ".com", IpAddr::v4(i + 1), 50);
  EXPECT_LE(pins.size(), 3u);
}

TEST(Pinning, DomainRuleAllowsOnlyResolvedIps) {
  FakeClock clk;
  PinTable pins(clk.fn());
  auto policy = NetworkPolicy::parse(
      json::parse(R"({"mode":"allowlist","allow":["*.example.com","198.51.100.0/28"]})"), {});
  auto r = pin_answers(policy, pins, "www.example.com",
                       {{ip("203.0.113.10"), 30}, {ip("127.0.0.1"), 30}, {ip("10.0.0.5"), 30}});
  ASSERT_EQ(r.kept.size(), 1u);
  EXPECT_EQ(r.kept[0].ip, ip("203.0.113.10"));
  ASSERT_EQ(r.dropped.size(), 2u);  // rebinding answers
  EXPECT_EQ(r.dropped[0].second.rule, "always-deny 127.0.0.0/8");

  std::string name;
  auto d = decide_pinned(policy, pins, ip("203.0.113.10"), 443, Proto::tcp, &name);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.rule, "allow *.example.com (pinned)");
  EXPECT_EQ(name, "www.example.com");
  // A neighbour the resolver never returned.
  d = decide_pinned(policy, pins, ip("203.0.113.11"), 443, Proto::tcp, &name);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.rule, "default deny");
  // The dropped rebinding address was never pinned.
  EXPECT_FALSE(decide_pinned(policy, pins, ip("127.0.0.1"), 80, Proto::tcp, &name).allowed);
  // Address rules still work without a name.
  d = decide_pinned(policy, pins, ip("198.51.100.3"), 80, Proto::udp, &name);
  EXPECT_EQ(d.rule, "allow 198.51.100.0/28");
  EXPECT_EQ(name, "");
  // After the TTL the pin is gone.
  clk.now += 31s;
  EXPECT_FALSE(decide_pinned(policy, pins, ip("203.0.113.10"), 443, Proto::tcp, &name).allowed);
}

TEST(Pinning, DenyNameRuleBeatsAllowCidr) {
  PinTable pins;
  auto policy =
      NetworkPolicy::parse(json::parse(R"({"mode":"open","deny":["tracker.example.com"]})"), {});
  pins.add("tracker.example.com", ip("203.0.113.50"), 60);
  std::string name;
  auto d = decide_pinned(policy, pins, ip("203.0.113.50"), 443, Proto::tcp, &name);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.rule, "deny tracker.example.com");
  EXPECT_TRUE(decide_pinned(policy, pins, ip("203.0.113.51"), 443, Proto::tcp, &name).allowed);
}

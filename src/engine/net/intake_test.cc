#include "engine/net/intake.h"

#include <gtest/gtest.h>

#include <random>

using namespace airlock::net;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

struct Rig {
  std::chrono::steady_clock::time_point now{};
  EventIntake intake;
  explicit Rig(IntakeConfig cfg = {}) : intake(cfg, [this] { return now; }) {}
  std::vector<EventIntake::Record> feed(const json& j) { return intake.feed(j.dump() + "\n"); }
};

json dns(const std::string& name, bool allowed = true) {
  return {{"event", "net_dns"},
          {"name", name},
          {"qtype", "A"},
          {"allowed", allowed},
          {"rule", "open"},
          {"rcode", allowed ? "NOERROR" : "NXDOMAIN"},
          {"answers", allowed ? json::array({"203.0.113.7"}) : json::array()}};
}

json flow(bool allowed = true) {
  return {{"event", "net_flow"}, {"proto", "tcp"}, {"dst", "203.0.113.7"}, {"src_port", 40000},
          {"port", 443},         {"name", ""},     {"rule", "open"},       {"allowed", allowed}};
}

}  // namespace

TEST(EventIntake, AcceptsTheHelpersEventsAsRecords) {
  Rig r;
  auto out = r.feed(dns("a.example"));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].event, "net_dns");
  EXPECT_EQ(out[0].fields["answers"][0], "203.0.113.7");
  EXPECT_FALSE(out[0].fields.contains("event"));
  json end = flow();
  end.erase("allowed");
  end["event"] = "net_flow_end";
  end.update({{"bytes_out", 10}, {"bytes_in", 20}, {"duration_ms", 5}, {"reason", "fin"}});
  // Split anywhere: lines are reassembled.
  std::string two = flow().dump() + "\n" + end.dump() + "\n";
  std::vector<EventIntake::Record> got;
  for (size_t i = 0; i < two.size(); i += 7)
    for (auto& rec : r.intake.feed(std::string_view(two).substr(i, 7))) got.push_back(rec);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[1].event, "net_flow_end");
  EXPECT_EQ(got[1].fields["bytes_in"], 20);
  EXPECT_EQ(r.intake.invalid(), 0u);
}

// Issue 9: a helper that a guest took over must not be able to forge
// records: other events, its own ts/sandbox, wrong types, junk.
TEST(EventIntake, ForgedReportsAreDroppedAndCounted) {
  Rig r;
  json with_ts = dns("a.example");
  with_ts["ts"] = "2000-01-01T00:00:00.000Z";
  json with_sandbox = dns("a.example");
  with_sandbox["sandbox"] = "sb-000000000000";
  json bad_type = flow();
  bad_type["allowed"] = "yes";
  json bad_ip = flow();
  bad_ip["dst"] = "not an address";
  json big_port = flow();
  big_port["port"] = 70000;
  json extra = flow();
  extra["exit_code"] = 0;
  json long_name = dns(std::string(1301, 'a'));
  json many = dns("a.example");
  many["answers"] = json::array();
  for (int i = 0; i < 33; ++i) many["answers"].push_back("203.0.113.1");
  json reason = flow();
  reason.erase("allowed");
  reason.update({{"event", "net_flow_end"},
                 {"bytes_out", 1},
                 {"bytes_in", 1},
                 {"duration_ms", 1},
                 {"reason", "deleted"}});
  std::vector<json> forged = {{{"event", "exec"}, {"argv", {"rm", "-rf", "/"}}, {"exit_code", 0}},
                              {{"event", "deleted"}, {"reason", "user"}},
                              {{"event", "network_changed"}, {"policy", {{"mode", "open"}}}},
                              {{"event", "net_policy"}, {"policy", {{"mode", "open"}}}},
                              with_ts,
                              with_sandbox,
                              bad_type,
                              bad_ip,
                              big_port,
                              extra,
                              long_name,
                              many,
                              reason,
                              json::array({1, 2}),
                              "net_dns",
                              42};
  for (auto& f : forged) EXPECT_TRUE(r.feed(f).empty()) << f.dump();
  EXPECT_TRUE(r.intake.feed("{not json\n").empty());
  EXPECT_TRUE(r.intake.feed(std::string(10000, 'x') + "\n").empty());
  EXPECT_TRUE(r.intake.feed("[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]\n")
                  .empty());
  // An over-long line without a newline yet: dropped up to its newline,
  // what follows is read normally.
  EXPECT_TRUE(r.intake.feed(std::string(9000, '{')).empty());
  EXPECT_TRUE(r.intake.feed(std::string(9000, '{')).empty());
  auto after = r.intake.feed("\n" + dns("ok.example").dump() + "\n");
  ASSERT_EQ(after.size(), 1u);
  EXPECT_EQ(after[0].fields["name"], "ok.example");
  size_t n = forged.size() + 4;
  EXPECT_EQ(r.intake.invalid(), n);
  auto sum = r.intake.flush();
  ASSERT_EQ(sum.size(), 1u);
  EXPECT_EQ(sum[0].event, "net_suppressed");
  EXPECT_EQ(sum[0].fields["invalid"], n);
  EXPECT_EQ(sum[0].fields["count"], 0);
  EXPECT_TRUE(r.intake.flush().empty()) << "counted once";
}

// Issue 9: a flood of DNS lookups yields a bounded number of records and an
// exact count of the rest, per kind; other kinds keep their own budget.
TEST(EventIntake, FloodIsBoundedPerKindAndCountedExactly) {
  IntakeConfig cfg;
  cfg.burst = 50;
  cfg.per_second = 5;
  cfg.summary_every = 10s;
  Rig r(cfg);
  const int kFlood = 20000;
  size_t records = 0, suppressed = 0, summaries = 0;
  auto take = [&](std::vector<EventIntake::Record> out) {
    for (auto& rec : out) {
      if (rec.event == "net_suppressed") {
        ++summaries;
        suppressed += rec.fields["counts"].value("net_dns", 0);
        EXPECT_EQ(rec.fields["count"], rec.fields["counts"].value("net_dns", 0));
      } else {
        EXPECT_EQ(rec.event, "net_dns");
        ++records;
      }
    }
  };
  // 20 000 lookups over 20 simulated seconds (1000/s).
  for (int i = 0; i < kFlood; ++i) {
    if (i % 1000 == 0) {
      r.now += 1s;
      take(r.intake.tick());
    }
    take(r.feed(dns("x" + std::to_string(i) + ".example")));
  }
  // A denied flow and an allowed flow still get through: their own buckets.
  EXPECT_EQ(r.feed(flow(true)).size(), 1u);
  EXPECT_EQ(r.feed(flow(false)).size(), 1u);
  take(r.intake.flush());
  EXPECT_LE(records, 50u + 20 * 5 + 5);
  EXPECT_GE(records, 50u + 19 * 5);
  EXPECT_EQ(records + suppressed, static_cast<size_t>(kFlood));
  EXPECT_GE(summaries, 2u);
  EXPECT_LE(summaries, 3u) << "summaries are periodic, not per event";
  // Denied answers are a kind of their own: they do not use up allowed ones'.
  Rig d(cfg);
  for (int i = 0; i < 1000; ++i) d.feed(dns("deny.example", false));
  EXPECT_EQ(d.feed(dns("ok.example")).size(), 1u);
  auto s = d.intake.flush();
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].fields["counts"]["net_dns_denied"], 1000 - 50);
}

TEST(EventIntake, HelperCountsAreReportedApart) {
  Rig r;
  EXPECT_TRUE(
      r.feed({{"event", "net_suppressed"}, {"count", 7}, {"counts", {{"net_flow_denied", 7}}}})
          .empty());
  EXPECT_TRUE(r.feed({{"event", "net_suppressed"}, {"counts", {{"exec", 7}}}}).empty());
  auto s = r.intake.flush();
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].fields["helper_counts"]["net_flow_denied"], 7);
  EXPECT_EQ(s[0].fields["count"], 7);
  EXPECT_EQ(s[0].fields["invalid"], 1);
}

TEST(EventIntake, SurvivesRandomBytes) {
  Rig r;
  std::mt19937 rng(3);
  std::string base = dns("a.example").dump() + "\n" + flow().dump() + "\n";
  for (int i = 0; i < 5000; ++i) {
    std::string s = base;
    for (int k = 1 + rng() % 5; k > 0; --k) s[rng() % s.size()] = static_cast<char>(rng());
    for (auto& rec : r.intake.feed(s)) EXPECT_TRUE(rec.fields.is_object());
  }
}

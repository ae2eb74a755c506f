#include "common/metrics/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <thread>

namespace airlock::metrics {
namespace {

TEST(Metrics, EscapesLabelValuesAndHelp) {
  EXPECT_EQ(escape_label_value(R"(a\b"c)"
                               "\nd"),
            R"(a\\b\"c\nd)");
  EXPECT_EQ(escape_label_value("ünïcode ok"), "ünïcode ok");
  EXPECT_EQ(escape_help("line1\nback\\slash \"quotes\" stay"),
            "line1\\nback\\\\slash \"quotes\" stay");
}

TEST(Metrics, FormatsValues) {
  EXPECT_EQ(format_value(0), "0");
  EXPECT_EQ(format_value(42), "42");
  EXPECT_EQ(format_value(1e15), "1000000000000000");
  EXPECT_EQ(format_value(0.005), "0.005");
  EXPECT_EQ(format_value(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(format_value(INFINITY), "+Inf");
  EXPECT_EQ(format_value(-INFINITY), "-Inf");
  EXPECT_EQ(format_value(NAN), "NaN");
}

TEST(Metrics, WritesCountersAndGaugesWithLabels) {
  CounterVec c;
  c.inc({{"route", "/v1/x"}, {"status", "200"}});
  c.inc({{"route", "/v1/x"}, {"status", "200"}}, 2);
  c.inc({{"route", "say \"hi\""}, {"status", "404"}});
  Writer w;
  w.counter("airlock_requests_total", "Requests\nby route", c.values());
  w.gauge("airlock_up", "Up", 1);
  EXPECT_EQ(w.text(),
            "# HELP airlock_requests_total Requests\\nby route\n"
            "# TYPE airlock_requests_total counter\n"
            "airlock_requests_total{route=\"/v1/x\",status=\"200\"} 3\n"
            "airlock_requests_total{route=\"say \\\"hi\\\"\",status=\"404\"} 1\n"
            "# HELP airlock_up Up\n"
            "# TYPE airlock_up gauge\n"
            "airlock_up 1\n");
}

TEST(Metrics, HistogramBucketsAreCumulativeWithInfSumAndCount) {
  HistogramVec h({0.1, 1});
  h.observe({{"op", "a"}}, 0.05);
  h.observe({{"op", "a"}}, 0.1);  // le is inclusive
  h.observe({{"op", "a"}}, 0.5);
  h.observe({{"op", "a"}}, 7);
  Writer w;
  w.histogram("airlock_x_seconds", "X", h.values());
  EXPECT_EQ(w.text(),
            "# HELP airlock_x_seconds X\n"
            "# TYPE airlock_x_seconds histogram\n"
            "airlock_x_seconds_bucket{op=\"a\",le=\"0.1\"} 2\n"
            "airlock_x_seconds_bucket{op=\"a\",le=\"1\"} 3\n"
            "airlock_x_seconds_bucket{op=\"a\",le=\"+Inf\"} 4\n"
            "airlock_x_seconds_sum{op=\"a\"} 7.65\n"
            "airlock_x_seconds_count{op=\"a\"} 4\n");
}

TEST(Metrics, RefusesBadNamesAndMisuse) {
  Writer w;
  EXPECT_THROW(w.gauge("1bad", "h", 1), std::invalid_argument);
  EXPECT_THROW(w.gauge("bad-name", "h", 1), std::invalid_argument);
  EXPECT_THROW(w.counter("airlock_no_suffix", "h", {}), std::invalid_argument);
  EXPECT_THROW(w.gauge("airlock_g", "h", {{Labels{{"bad-label", "v"}}, 1}}), std::invalid_argument);
  EXPECT_THROW(w.gauge("airlock_g2", "h", {{Labels{{"__reserved", "v"}}, 1}}),
               std::invalid_argument);
  w.gauge("airlock_once", "h", 1);
  EXPECT_THROW(w.gauge("airlock_once", "h", 2), std::invalid_argument);
  HistogramVec h({1});
  h.observe({{"le", "x"}}, 1);
  EXPECT_THROW(w.histogram("airlock_h_seconds", "h", h.values()), std::invalid_argument);
  EXPECT_THROW(HistogramVec({1, 0.5}), std::invalid_argument);
  CounterVec c;
  EXPECT_THROW(c.inc({}, -1), std::invalid_argument);
}

TEST(Metrics, CountsFromManyThreads) {
  CounterVec c;
  HistogramVec h(latency_buckets());
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        c.inc({{"k", "v"}});
        h.observe({}, 0.02);
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(c.values().at({{"k", "v"}}), 4000);
  EXPECT_EQ(h.values().at({}).count, 4000u);
}

}  // namespace
}  // namespace airlock::metrics

// The Prometheus text exposition format (version 0.0.4), small and in one
// place: Debian has no prometheus-cpp, and airlockd needs only counters,
// gauges and histograms with labels.
//
//   metrics::CounterVec creates;                // thread-safe
//   creates.inc({{"start", "boot"}, {"outcome", "ok"}});
//   metrics::Writer w;
//   w.counter("airlock_creates_total", "Creates by start path and outcome", creates.values());
//   std::string body = w.text();                // served with kContentType
//
// Names are checked (a bad one is a programming error: std::invalid_argument);
// label values and HELP texts are escaped as the format requires.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace airlock::metrics {

inline constexpr const char* kContentType = "text/plain; version=0.0.4; charset=utf-8";

// Label pairs in the order they are printed.
using Labels = std::vector<std::pair<std::string, std::string>>;

// A label value as the format quotes it: backslash, double quote and
// newline escaped (\\, \", \n); every other byte as is (UTF-8 passes).
std::string escape_label_value(std::string_view value);
// A HELP text: backslash and newline escaped.
std::string escape_help(std::string_view help);
// A sample value: integers without a fraction, +Inf, -Inf, NaN.
std::string format_value(double value);

// Counters by label set; only ever go up.
class CounterVec {
 public:
  void inc(const Labels& labels, double by = 1);
  std::map<Labels, double> values() const;

 private:
  mutable std::mutex mu_;
  std::map<Labels, double> values_;
};

struct HistogramData {
  std::vector<double> bounds;    // upper bounds, ascending, without +Inf
  std::vector<uint64_t> counts;  // per bucket (not cumulative); bounds.size() + 1 (the +Inf one)
  double sum = 0;
  uint64_t count = 0;
};

// Histograms by label set, all with the same bucket bounds.
class HistogramVec {
 public:
  explicit HistogramVec(std::vector<double> bounds);  // ascending, finite
  void observe(const Labels& labels, double value);
  std::map<Labels, HistogramData> values() const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::map<Labels, HistogramData> values_;
};

// Latency buckets in seconds, 5 ms .. 120 s (a boot under TCG takes seconds).
std::vector<double> latency_buckets();

// Builds one exposition. Each family is written once, with its HELP and
// TYPE lines first; a name written twice is std::invalid_argument.
class Writer {
 public:
  void counter(const std::string& name, std::string_view help,
               const std::map<Labels, double>& samples);
  void gauge(const std::string& name, std::string_view help,
             const std::map<Labels, double>& samples);
  // One unlabelled gauge sample.
  void gauge(const std::string& name, std::string_view help, double value);
  void histogram(const std::string& name, std::string_view help,
                 const std::map<Labels, HistogramData>& samples);
  const std::string& text() const { return out_; }

 private:
  void family(const std::string& name, std::string_view help, const char* type);
  void sample(const std::string& name, const Labels& labels, double value);
  std::string out_;
  std::vector<std::string> names_;
};

}  // namespace airlock::metrics

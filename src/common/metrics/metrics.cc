#include "common/metrics/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace airlock::metrics {
namespace {

bool valid_name(std::string_view name, bool colon_ok) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
              (colon_ok && c == ':') || (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  // Label names starting with __ are reserved for Prometheus itself.
  return colon_ok || name.substr(0, 2) != "__";
}

void check_labels(const Labels& labels) {
  for (const auto& [k, v] : labels)
    if (!valid_name(k, false)) throw std::invalid_argument("bad metric label name: " + k);
}

}  // namespace

std::string escape_label_value(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string escape_help(std::string_view help) {
  std::string out;
  for (char c : help) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string format_value(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[64];
  // Exact integers (counts, bytes) print as integers up to 2^53.
  if (value == std::floor(value) && std::fabs(value) < 9007199254740992.0)
    std::snprintf(buf, sizeof buf, "%.0f", value);
  else {
    // The shortest of %.15g / %.17g that reads back as the same double
    // (0.005, not 0.0050000000000000001).
    std::snprintf(buf, sizeof buf, "%.15g", value);
    if (std::strtod(buf, nullptr) != value) std::snprintf(buf, sizeof buf, "%.17g", value);
  }
  return buf;
}

void CounterVec::inc(const Labels& labels, double by) {
  if (!(by >= 0)) throw std::invalid_argument("a counter only goes up");
  std::lock_guard lock(mu_);
  values_[labels] += by;
}

std::map<Labels, double> CounterVec::values() const {
  std::lock_guard lock(mu_);
  return values_;
}

HistogramVec::HistogramVec(std::vector<double> bounds) : bounds_(std::move(bounds)) {
  for (size_t i = 0; i < bounds_.size(); ++i)
    if (!std::isfinite(bounds_[i]) || (i > 0 && bounds_[i] <= bounds_[i - 1]))
      throw std::invalid_argument("histogram bounds must be finite and ascending");
}

void HistogramVec::observe(const Labels& labels, double value) {
  std::lock_guard lock(mu_);
  auto& h = values_[labels];
  if (h.counts.empty()) {
    h.bounds = bounds_;
    h.counts.assign(bounds_.size() + 1, 0);
  }
  // The first bucket whose bound is >= value ("le"); past the last: +Inf.
  size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  ++h.counts[i];
  h.sum += value;
  ++h.count;
}

std::map<Labels, HistogramData> HistogramVec::values() const {
  std::lock_guard lock(mu_);
  return values_;
}

std::vector<double> latency_buckets() {
  return {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
}

void Writer::family(const std::string& name, std::string_view help, const char* type) {
  if (!valid_name(name, true)) throw std::invalid_argument("bad metric name: " + name);
  if (std::find(names_.begin(), names_.end(), name) != names_.end())
    throw std::invalid_argument("metric family written twice: " + name);
  names_.push_back(name);
  out_ += "# HELP " + name + " " + escape_help(help) + "\n";
  out_ += "# TYPE " + name + " " + type + "\n";
}

void Writer::sample(const std::string& name, const Labels& labels, double value) {
  check_labels(labels);
  out_ += name;
  if (!labels.empty()) {
    out_ += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      if (i) out_ += ',';
      out_ += labels[i].first + "=\"" + escape_label_value(labels[i].second) + '"';
    }
    out_ += '}';
  }
  out_ += ' ' + format_value(value) + '\n';
}

void Writer::counter(const std::string& name, std::string_view help,
                     const std::map<Labels, double>& samples) {
  // promtool (and the OpenMetrics convention) want counters named *_total.
  if (name.size() < 6 || name.substr(name.size() - 6) != "_total")
    throw std::invalid_argument("a counter's name ends in _total: " + name);
  family(name, help, "counter");
  for (const auto& [labels, v] : samples) sample(name, labels, v);
}

void Writer::gauge(const std::string& name, std::string_view help,
                   const std::map<Labels, double>& samples) {
  family(name, help, "gauge");
  for (const auto& [labels, v] : samples) sample(name, labels, v);
}

void Writer::gauge(const std::string& name, std::string_view help, double value) {
  gauge(name, help, std::map<Labels, double>{{Labels{}, value}});
}

void Writer::histogram(const std::string& name, std::string_view help,
                       const std::map<Labels, HistogramData>& samples) {
  family(name, help, "histogram");
  for (const auto& [labels, h] : samples) {
    for (const auto& [k, v] : labels)
      if (k == "le") throw std::invalid_argument("a histogram label may not be named le");
    uint64_t cumulative = 0;
    for (size_t i = 0; i <= h.bounds.size(); ++i) {
      cumulative += i < h.counts.size() ? h.counts[i] : 0;
      Labels with = labels;
      with.emplace_back("le", i < h.bounds.size() ? format_value(h.bounds[i]) : "+Inf");
      sample(name + "_bucket", with, static_cast<double>(cumulative));
    }
    sample(name + "_sum", labels, h.sum);
    sample(name + "_count", labels, static_cast<double>(h.count));
  }
}

}  // namespace airlock::metrics

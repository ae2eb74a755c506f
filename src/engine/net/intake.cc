#include "engine/net/intake.h"

#include <algorithm>
#include <optional>

#include "engine/net/policy.h"

namespace airlock::net {

namespace {

using nlohmann::json;

enum class T { str, boolean, port, count, ip, ips, dropped, one_of, counts };

struct Field {
  const char* name;
  T type;
  bool required;
  size_t max = 0;                           // str: bytes; ips/dropped: entries
  std::vector<std::string_view> choices{};  // one_of
};

const std::vector<std::string_view> kRcodes = {"NOERROR",  "FORMERR", "SERVFAIL",
                                               "NXDOMAIN", "NOTIMP",  "REFUSED"};
const std::vector<std::string_view> kReasons = {"fin",    "rst",         "idle",
                                                "policy", "helper exit", "port closed"};
const std::vector<std::string_view> kKinds = {"net_dns", "net_dns_denied", "net_flow",
                                              "net_flow_denied", "net_flow_end"};

std::vector<Field> flow_fields(bool end) {
  std::vector<Field> f = {{"proto", T::one_of, true, 0, {"tcp", "udp", "icmp"}},
                          {"dst", T::ip, true},
                          {"port", T::port, false},
                          {"src_port", T::port, false},
                          {"icmp_id", T::port, false},
                          {"name", T::str, true, 300},
                          {"rule", T::str, true, 400},
                          {"direction", T::one_of, false, 0, {"in"}},
                          {"host_port", T::port, false}};
  if (end) {
    f.push_back({"bytes_out", T::count, true});
    f.push_back({"bytes_in", T::count, true});
    f.push_back({"duration_ms", T::count, true});
    f.push_back({"reason", T::one_of, true, 0, kReasons});
  } else {
    f.push_back({"allowed", T::boolean, true});
  }
  return f;
}

const std::map<std::string, std::vector<Field>, std::less<>>& schema() {
  static const std::map<std::string, std::vector<Field>, std::less<>> s = {
      {"net_dns",
       {{"name", T::str, true, 1300},  // up to 300 guest bytes, each possibly escaped as \xNN
        {"qtype", T::str, false, 16},
        {"allowed", T::boolean, true},
        {"rule", T::str, true, 400},
        {"rcode", T::one_of, true, 0, kRcodes},
        {"answers", T::ips, false, 32},
        {"dropped", T::dropped, false, 32},
        {"error", T::str, false, 300}}},
      {"net_flow", flow_fields(false)},
      {"net_flow_end", flow_fields(true)},
      {"net_suppressed", {{"count", T::count, false}, {"counts", T::counts, false}}},
  };
  return s;
}

// Nesting of the line's JSON (outside strings), without parsing it: a deep
// line is refused before the parser builds it.
size_t nesting(std::string_view s) {
  size_t depth = 0, max = 0;
  bool in_str = false, esc = false;
  for (char c : s) {
    if (in_str) {
      if (esc) {
        esc = false;
      } else if (c == '\\') {
        esc = true;
      } else if (c == '"') {
        in_str = false;
      }
      continue;
    }
    if (c == '"') in_str = true;
    if (c == '{' || c == '[') max = std::max(max, ++depth);
    if ((c == '}' || c == ']') && depth) --depth;
  }
  return max;
}

bool is_ip(const json& v) {
  return v.is_string() && v.get_ref<const std::string&>().size() <= 64 &&
         IpAddr::parse(v.get_ref<const std::string&>()).has_value();
}

bool is_count(const json& v) { return v.is_number_unsigned() || (v.is_number_integer() && v >= 0); }

bool valid(const Field& f, const json& v) {
  switch (f.type) {
    case T::str:
      return v.is_string() && v.get_ref<const std::string&>().size() <= f.max;
    case T::boolean:
      return v.is_boolean();
    case T::port:
      return is_count(v) && v.get<uint64_t>() <= 65535;
    case T::count:
      return is_count(v);
    case T::ip:
      return is_ip(v);
    case T::ips:
      return v.is_array() && v.size() <= f.max && std::all_of(v.begin(), v.end(), is_ip);
    case T::dropped:
      return v.is_array() && v.size() <= f.max && std::all_of(v.begin(), v.end(), [](auto& d) {
               return d.is_object() && d.size() == 2 && d.contains("ip") && is_ip(d["ip"]) &&
                      d.contains("rule") && d["rule"].is_string() &&
                      d["rule"].template get_ref<const std::string&>().size() <= 400;
             });
    case T::one_of:
      return v.is_string() && std::find(f.choices.begin(), f.choices.end(),
                                        v.get_ref<const std::string&>()) != f.choices.end();
    case T::counts:
      if (!v.is_object()) return false;
      for (auto& [k, n] : v.items())
        if (std::find(kKinds.begin(), kKinds.end(), k) == kKinds.end() || !is_count(n))
          return false;
      return true;
  }
  return false;
}

// The report as a record's fields if it fits its event's schema.
std::optional<json> check(const json& j, std::string* event) {
  if (!j.is_object()) return std::nullopt;
  auto ev = j.find("event");
  if (ev == j.end() || !ev->is_string()) return std::nullopt;
  auto s = schema().find(ev->get_ref<const std::string&>());
  if (s == schema().end()) return std::nullopt;
  const auto& fields = s->second;
  json out = json::object();
  for (auto& [k, v] : j.items()) {
    if (k == "event") continue;
    auto f =
        std::find_if(fields.begin(), fields.end(), [&](const Field& f) { return k == f.name; });
    if (f == fields.end() || !valid(*f, v)) return std::nullopt;  // incl. ts, sandbox
    out[k] = v;
  }
  for (const auto& f : fields)
    if (f.required && !out.contains(f.name)) return std::nullopt;
  *event = s->first;
  return out;
}

}  // namespace

EventIntake::EventIntake(IntakeConfig config, Clock clock)
    : config_(config),
      clock_(std::move(clock)),
      limiter_({.per_second = config.per_second, .burst = config.burst}, clock_),
      last_summary_(clock_()) {}

std::vector<EventIntake::Record> EventIntake::feed(std::string_view bytes) {
  std::vector<Record> out;
  while (!bytes.empty()) {
    size_t nl = bytes.find('\n');
    std::string_view piece = bytes.substr(0, nl);
    bytes = nl == std::string_view::npos ? std::string_view() : bytes.substr(nl + 1);
    if (skipping_) {
      if (nl != std::string_view::npos) skipping_ = false;
      continue;
    }
    if (partial_.size() + piece.size() > config_.max_line) {
      ++invalid_;
      ++invalid_total_;
      partial_.clear();
      skipping_ = nl == std::string_view::npos;
      continue;
    }
    if (nl == std::string_view::npos) {
      partial_.append(piece);
      break;
    }
    if (partial_.empty()) {
      line(piece, out);
    } else {
      partial_.append(piece);
      line(partial_, out);
      partial_.clear();
    }
  }
  return out;
}

void EventIntake::line(std::string_view text, std::vector<Record>& out) {
  if (text.find_first_not_of(" \t\r") == std::string_view::npos) return;
  std::optional<json> fields;
  std::string event;
  if (nesting(text) <= 4) {
    try {
      fields = check(json::parse(text), &event);
    } catch (const json::exception&) {
    }
  }
  if (!fields) {
    ++invalid_;
    ++invalid_total_;
    return;
  }
  if (event == "net_suppressed") {  // the helper's own count of what it held back
    if (auto c = fields->find("counts"); c != fields->end())
      for (auto& [k, n] : c->items()) helper_suppressed_[k] += n.get<uint64_t>();
    return;
  }
  std::string kind = event;
  if (event != "net_flow_end" && !(*fields)["allowed"].get<bool>()) kind += "_denied";
  if (!limiter_.admit(kind)) return;  // counted by the limiter
  ++accepted_;
  out.push_back({std::move(event), std::move(*fields)});
}

std::vector<EventIntake::Record> EventIntake::summary() {
  if (!limiter_.has_suppressed() && helper_suppressed_.empty() && invalid_ == 0) return {};
  uint64_t total = 0;
  json counts = json::object(), helper = json::object();
  for (auto& [k, n] : limiter_.take_suppressed()) {
    counts[k] = n;
    total += n;
  }
  for (auto& [k, n] : helper_suppressed_) {
    helper[k] = n;
    total += n;
  }
  json fields{{"count", total}, {"counts", counts}, {"invalid", invalid_}};
  if (!helper.empty()) fields["helper_counts"] = helper;
  helper_suppressed_.clear();
  invalid_ = 0;
  last_summary_ = clock_();
  return {{"net_suppressed", std::move(fields)}};
}

std::vector<EventIntake::Record> EventIntake::tick() {
  if (clock_() - last_summary_ < config_.summary_every) return {};
  auto out = summary();
  last_summary_ = clock_();
  return out;
}

std::vector<EventIntake::Record> EventIntake::flush() { return summary(); }

}  // namespace airlock::net

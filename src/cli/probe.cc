// `airlock probe`: bookkeeping and formatting (ProbeReport, SandboxTracker,
// helpers). The battery itself is in probe_battery.cc.
#include "cli/probe.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <sstream>

namespace airlock::cli {

using nlohmann::json;

const char* to_string(ProbeStatus s) {
  switch (s) {
    case ProbeStatus::pass:
      return "PASS";
    case ProbeStatus::fail:
      return "FAIL";
    case ProbeStatus::skip:
      return "SKIP";
  }
  return "FAIL";
}

void ProbeReport::add(ProbeCheck c) {
  if (c.status == ProbeStatus::skip && c.observed.empty()) {
    c.status = ProbeStatus::fail;
    c.observed = "skipped without a reason";
  }
  checks_.push_back(std::move(c));
}

void ProbeReport::expect(const std::string& section, const std::string& name,
                         const std::string& expectation, bool ok, const std::string& observed,
                         int64_t ms) {
  add({section, name, expectation, observed, ok ? ProbeStatus::pass : ProbeStatus::fail, ms});
}

size_t ProbeReport::count(ProbeStatus s) const {
  return size_t(std::count_if(checks_.begin(), checks_.end(),
                              [s](const ProbeCheck& c) { return c.status == s; }));
}

bool ProbeReport::passed() const {
  return !checks_.empty() && count(ProbeStatus::fail) == 0 &&
         count(ProbeStatus::pass) + count(ProbeStatus::skip) == checks_.size();
}

json ProbeReport::to_json(const json& context) const {
  json j = context.is_object() ? context : json::object();
  j["passed"] = passed();
  j["counts"] = {{"pass", count(ProbeStatus::pass)},
                 {"fail", count(ProbeStatus::fail)},
                 {"skip", count(ProbeStatus::skip)}};
  j["checks"] = json::array();
  for (const auto& c : checks_)
    j["checks"].push_back({{"section", c.section},
                           {"check", c.name},
                           {"expectation", c.expectation},
                           {"observed", c.observed},
                           {"status", to_string(c.status)},
                           {"ms", c.ms}});
  return j;
}

std::vector<OutsideResult> parse_outside_lines(const std::string& out) {
  std::vector<OutsideResult> r;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    OutsideResult x;
    std::string extra;
    if (!(ls >> x.what >> x.host >> x.status) || (ls >> extra)) continue;
    if (x.what != "apt" && x.what != "pip") continue;
    if (x.status != "ok" && x.status != "unresolved" && x.status != "unreachable" &&
        x.status != "no-source")
      continue;
    r.push_back(std::move(x));
  }
  return r;
}

std::string outside_missing(const std::vector<OutsideResult>& results, const std::string& what) {
  const std::string source = what == "apt" ? "the image's apt source" : "pip's configured index";
  for (const auto& x : results) {
    if (x.what != what) continue;
    if (x.status == "ok") return "";
    if (x.status == "no-source")
      return what == "apt" ? "the image has no apt source" : "pip has no configured index";
    return "no outside network: " + source + " " + x.host +
           (x.status == "unresolved" ? " does not resolve" : " does not accept a connection") +
           " (5 s)";
  }
  return "the outside-network check for " + what + " did not report";
}

std::string no_outside_network(const std::vector<OutsideResult>& results) {
  std::string why;
  for (const auto& x : results) {
    if (x.status == "ok") return "";
    if (why.empty() && (x.status == "unresolved" || x.status == "unreachable"))
      why = outside_missing(results, x.what);
  }
  return why;
}

namespace {

// Display width of UTF-8 text: code points, not bytes (observed text may
// carry "→" or "…").
size_t width(const std::string& s) {
  size_t n = 0;
  for (unsigned char ch : s)
    if ((ch & 0xC0) != 0x80) ++n;
  return n;
}

// Cuts `s` to `max` code points, ending in "…" if cut; newlines become spaces.
std::string fit(std::string s, size_t max) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  std::replace(s.begin(), s.end(), '\t', ' ');
  if (width(s) <= max) return s;
  size_t n = 0, i = 0;
  for (; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) {
      if (n == max - 1) break;
      ++n;
    }
  }
  return s.substr(0, i) + "…";
}

std::string pad(const std::string& s, size_t w) {
  size_t have = width(s);
  return have >= w ? s : s + std::string(w - have, ' ');
}

}  // namespace

std::string ProbeReport::format_table(size_t observed_width) const {
  std::vector<std::array<std::string, 4>> rows;
  rows.push_back({"CHECK", "EXPECTATION", "OBSERVED", "RESULT"});
  for (const auto& c : checks_)
    rows.push_back({fit(c.section + " · " + c.name, 48), fit(c.expectation, 44),
                    fit(c.observed, std::max<size_t>(observed_width, 8)), to_string(c.status)});
  std::array<size_t, 3> w{};
  for (const auto& r : rows)
    for (size_t i = 0; i < 3; ++i) w[i] = std::max(w[i], width(r[i]));
  std::string out;
  for (const auto& r : rows)
    out += pad(r[0], w[0]) + "  " + pad(r[1], w[1]) + "  " + pad(r[2], w[2]) + "  " + r[3] + "\n";
  out += std::to_string(count(ProbeStatus::pass)) + " passed, " +
         std::to_string(count(ProbeStatus::fail)) + " failed, " +
         std::to_string(count(ProbeStatus::skip)) + " skipped: " + (passed() ? "PASS" : "FAIL") +
         "\n";
  return out;
}

void SandboxTracker::add(const std::string& id) {
  std::lock_guard lock(mu_);
  ids_.insert(id);
}

void SandboxTracker::forget(const std::string& id) {
  std::lock_guard lock(mu_);
  ids_.erase(id);
}

std::vector<std::string> SandboxTracker::ids() const {
  std::lock_guard lock(mu_);
  return {ids_.begin(), ids_.end()};
}

void SandboxTracker::interrupt() {
  std::lock_guard lock(mu_);
  interrupted_ = true;
}

bool SandboxTracker::interrupted() const {
  std::lock_guard lock(mu_);
  return interrupted_;
}

double median_ms(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::vector<ReachResult> parse_reach_lines(const std::string& out) {
  std::vector<ReachResult> res;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    ReachResult r;
    std::string rc, extra;
    if (!(ls >> r.target >> rc) || (ls >> extra)) continue;
    if (rc.empty() || rc.find_first_not_of("0123456789") != std::string::npos || rc.size() > 3)
      continue;
    r.rc = std::stoi(rc);
    res.push_back(r);
  }
  return res;
}

std::vector<std::string> host_addresses() {
  std::vector<std::string> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr || (a->ifa_flags & IFF_LOOPBACK)) continue;
    char buf[INET6_ADDRSTRLEN] = {};
    if (a->ifa_addr->sa_family == AF_INET) {
      auto* sin = reinterpret_cast<sockaddr_in*>(a->ifa_addr);
      inet_ntop(AF_INET, &sin->sin_addr, buf, sizeof buf);
    } else if (a->ifa_addr->sa_family == AF_INET6) {
      auto* sin6 = reinterpret_cast<sockaddr_in6*>(a->ifa_addr);
      if (IN6_IS_ADDR_LINKLOCAL(&sin6->sin6_addr) || IN6_IS_ADDR_LOOPBACK(&sin6->sin6_addr))
        continue;
      inet_ntop(AF_INET6, &sin6->sin6_addr, buf, sizeof buf);
    } else {
      continue;
    }
    std::string s = buf;
    if (!s.empty() && std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  }
  freeifaddrs(list);
  return out;
}

}  // namespace airlock::cli

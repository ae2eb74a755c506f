#include "engine/vmm/jail_ids.h"

#include <atomic>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/vmm/vm.h"

namespace airlock::vmm {

namespace {

std::atomic<uint64_t> g_range{(static_cast<uint64_t>(kDefaultJailIdBase) << 32) |
                              kDefaultJailIdCount};

std::vector<std::string> split(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream ss(line);
  std::string f;
  while (std::getline(ss, f, ':')) out.push_back(f);
  return out;
}

std::optional<uint64_t> number(const std::string& s) {
  if (s.empty() || s.size() > 10 || s.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  return std::stoull(s);
}

// [lo, hi) intervals overlap.
bool overlaps(uint64_t lo1, uint64_t hi1, uint64_t lo2, uint64_t hi2) {
  return lo1 < hi2 && lo2 < hi1;
}

std::string span(uint64_t lo, uint64_t hi) {
  return std::to_string(lo) + ".." + std::to_string(hi - 1);
}

// Throws if a line of `file` claims an id in [lo, hi). `kind`: "sub" lines
// are name:start:count; otherwise the numeric fields `fields` are ids.
void check_file(const std::filesystem::path& file, bool sub, std::vector<size_t> fields,
                uint64_t lo, uint64_t hi, const std::string& what) {
  std::ifstream in(file);
  if (!in) return;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty() || line[0] == '#') continue;
    auto f = split(line);
    std::optional<std::pair<uint64_t, uint64_t>> claim;
    if (sub) {
      if (f.size() < 3) continue;
      auto start = number(f[1]), count = number(f[2]);
      if (!start || !count || *count == 0) continue;
      claim = {{*start, *start + *count}};
      if (overlaps(claim->first, claim->second, lo, hi))
        throw Error(Errc::invalid_argument,
                    "jail ids: " + what + " " + span(lo, hi) + " overlaps " + file.string() +
                        " line " + std::to_string(n) + " (" + f[0] + ": " +
                        span(claim->first, claim->second) +
                        "): that user could become a sandbox's QEMU; choose another range "
                        "(airlockd --jail-ids BASE:COUNT)",
                    "jail_ids");
      continue;
    }
    for (size_t i : fields) {
      if (i >= f.size()) continue;
      auto id = number(f[i]);
      if (id && *id >= lo && *id < hi)
        throw Error(Errc::invalid_argument,
                    "jail ids: " + what + " " + span(lo, hi) + " contains id " +
                        std::to_string(*id) + " of " + file.string() + " line " +
                        std::to_string(n) + " (" + f[0] +
                        "); choose another range (airlockd --jail-ids BASE:COUNT)",
                    "jail_ids");
    }
  }
}

}  // namespace

void check_jail_ids(const JailIdRange& r, const IdSources& s) {
  if (r.count < 1 || r.count > (1u << 20))
    throw Error(Errc::invalid_argument,
                "jail ids: count must be 1 .. 1048576, got " + std::to_string(r.count), "jail_ids");
  const uint64_t lo = r.base, hi = static_cast<uint64_t>(r.base) + r.count;
  // Below 1000: system accounts; past 2^31-1 some tools misread ids as negative.
  if (lo < 1000 || hi > 0x7fffffffull)
    throw Error(Errc::invalid_argument,
                "jail ids: range " + span(lo, hi) + " must lie within 1000 .. 2147483646",
                "jail_ids");
  const uint64_t tpl = kTemplateRamGid;
  if (tpl >= lo && tpl < hi)
    throw Error(Errc::invalid_argument,
                "jail ids: range " + span(lo, hi) + " contains the template RAM group " +
                    std::to_string(tpl),
                "jail_ids");
  for (auto [lo2, hi2, what] : {std::tuple{lo, hi, std::string("range")},
                                std::tuple{tpl, tpl + 1, std::string("template RAM group")}}) {
    check_file(s.subuid, true, {}, lo2, hi2, what);
    check_file(s.subgid, true, {}, lo2, hi2, what);
    check_file(s.passwd, false, {2, 3}, lo2, hi2, what);  // name:x:uid:gid:...
    check_file(s.group, false, {2}, lo2, hi2, what);      // name:x:gid:members
  }
}

void set_jail_ids(const JailIdRange& r, const IdSources& s) {
  check_jail_ids(r, s);
  g_range = (static_cast<uint64_t>(r.base) << 32) | r.count;
}

JailIdRange jail_ids() {
  uint64_t v = g_range;
  return {static_cast<uint32_t>(v >> 32), static_cast<uint32_t>(v & 0xffffffffu)};
}

}  // namespace airlock::vmm

#include "engine/channel/file_entry.h"

#include <set>
#include <string>

#include "common/error.h"
#include "engine/channel/guest_client.h"

namespace airlock::channel {
namespace {

using nlohmann::json;
constexpr size_t kMaxPath = 4096, kMaxName = 256;

[[noreturn]] void bad(const std::string& field, const std::string& why) {
  throw GuestReplyError("guest file entry: " + field + " " + why);
}

std::string text(const json& e, const char* field, size_t max, bool absolute) {
  const json& v = e.at(field);
  if (!v.is_string()) bad(field, "is not a string");
  std::string s = v.get<std::string>();
  if (s.size() > max) bad(field, "is too long");
  if (s.find('\0') != std::string::npos) bad(field, "contains NUL");
  if (absolute && (s.empty() || s[0] != '/')) bad(field, "is not an absolute path");
  return s;
}

uint64_t number(const json& e, const char* field, uint64_t max) {
  const json& v = e.at(field);
  bool non_negative = v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
  if (!non_negative || v.get<uint64_t>() > max) bad(field, "is out of range");
  return v.get<uint64_t>();
}

std::string kind(const json& e, const char* field) {
  static const std::set<std::string> kinds = {"file", "dir", "symlink", "other"};
  std::string t = text(e, field, 16, false);
  if (!kinds.count(t)) bad(field, "is not file, dir, symlink or other");
  return t;
}

}  // namespace

json file_entry_from_guest(const json& e) {
  if (!e.is_object()) bad("entry", "is not an object");
  for (const char* f : {"name", "type", "size", "mode", "mtime"})
    if (!e.contains(f)) bad(f, "is missing");
  json out = {{"name", text(e, "name", kMaxName, false)},
              {"type", kind(e, "type")},
              {"size", number(e, "size", uint64_t(1) << 62)},
              {"mode", number(e, "mode", 07777)}};
  if (!e["mtime"].is_number() || !(e["mtime"].get<double>() >= 0)) bad("mtime", "is not a time");
  out["mtime"] = e["mtime"].get<double>();
  if (e.contains("path")) out["path"] = text(e, "path", kMaxPath, true);
  for (const char* f : {"uid", "gid"})
    if (e.contains(f)) out[f] = number(e, f, UINT32_MAX);
  for (const char* f : {"owner", "group"})
    if (e.contains(f)) out[f] = text(e, f, kMaxName, false);
  if (out["type"] == "symlink" && e.contains("target")) {
    out["target"] = text(e, "target", kMaxPath, true);
    if (e.contains("target_type")) out["target_type"] = kind(e, "target_type");
    if (e.contains("target_mode")) out["target_mode"] = number(e, "target_mode", 07777);
  }
  return out;
}

}  // namespace airlock::channel

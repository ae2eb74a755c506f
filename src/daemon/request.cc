#include "daemon/request.h"

#include <cctype>
#include <cmath>
#include <limits>

#include "common/error.h"
#include "daemon/base64.h"
#include "engine/api/limits.h"

namespace airlock::daemon {
namespace L = engine::limits;
namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& message, const std::string& field) {
  throw Error(Errc::invalid_argument, message, field);
}

// Rejects any key of `obj` that is not in `known`.
void reject_unknown(const json& obj, std::initializer_list<std::string_view> known) {
  for (const auto& [key, value] : obj.items()) {
    bool ok = false;
    for (auto k : known) ok = ok || key == k;
    if (!ok) bad("unknown field '" + key + "'", key);
  }
}

int64_t get_int(const json& v, const std::string& field, int64_t min, int64_t max) {
  // JSON numbers like 2.0 are refused too: sizes are counts, not measurements.
  if (!v.is_number_integer()) bad(field + " must be an integer", field);
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    bad(field + " must be at most " + std::to_string(max), field);
  int64_t n = v.get<int64_t>();
  if (n < min) bad(field + " must be at least " + std::to_string(min), field);
  if (n > max) bad(field + " must be at most " + std::to_string(max), field);
  return n;
}

// An integer within one of the API's ranges (engine/api/limits.h), named as
// validation names it.
int64_t get_int(const json& v, const std::string& field, engine::limits::Range r) {
  if (!v.is_number_integer()) bad(field + " must be an integer", field);
  bool big =
      v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max());
  if (big || !r.contains(v.get<int64_t>()))
    bad(field + " must be between " + std::to_string(r.min) + " and " + std::to_string(r.max) +
            ", got " + v.dump(),
        field);
  return v.get<int64_t>();
}

std::string get_string(const json& v, const std::string& field) {
  if (!v.is_string()) bad(field + " must be a string", field);
  return v.get<std::string>();
}

bool get_bool(const json& v, const std::string& field) {
  if (!v.is_boolean()) bad(field + " must be a boolean", field);
  return v.get<bool>();
}

// A string->string map with bounded size; keys checked by `key_rule`.
std::map<std::string, std::string> get_string_map(const json& v, const std::string& field,
                                                  bool env_keys) {
  if (!v.is_object()) bad(field + " must be an object of strings", field);
  if (v.size() > 256) bad(field + " has more than 256 entries", field);
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : v.items()) {
    std::string name = field + "." + key;
    if (key.empty()) bad(field + " keys must not be empty", field);
    if (key.size() > 256) bad(field + " key '" + key.substr(0, 32) + "...' is too long", field);
    if (!value.is_string()) bad(name + " must be a string", name);
    std::string s = value.get<std::string>();
    if (s.size() > 65536) bad(name + " is longer than 65536 bytes", name);
    if (key.find('\0') != std::string::npos || s.find('\0') != std::string::npos)
      bad(name + " must not contain NUL bytes", name);
    if (env_keys && key.find('=') != std::string::npos)
      bad(field + " key '" + key + "' must not contain '='", field);
    out[key] = std::move(s);
  }
  return out;
}

int hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string percent_decode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out += ' ';
    } else if (s[i] == '%') {
      int hi = i + 1 < s.size() ? hex(s[i + 1]) : -1;
      int lo = i + 2 < s.size() ? hex(s[i + 2]) : -1;
      if (hi < 0 || lo < 0) bad("bad %-escape in query", "query");
      out += static_cast<char>(hi * 16 + lo);
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

json parse_object(std::string_view body) {
  if (body.find_first_not_of(" \t\r\n") == std::string_view::npos) return json::object();
  json j;
  try {
    j = json::parse(body);
  } catch (const json::parse_error& e) {
    // e.what() is "[json.exception.parse_error.101] parse error at line 1, column 5: ..."
    std::string what = e.what();
    auto pos = what.find("] ");
    if (pos != std::string::npos) what = what.substr(pos + 2);
    bad("malformed JSON at byte " + std::to_string(e.byte) + ": " + what, "body");
  }
  if (!j.is_object()) bad("request body must be a JSON object", "body");
  return j;
}

engine::SandboxSpec parse_create(std::string_view body) {
  json j = parse_object(body);
  reject_unknown(j, {"image", "cpus", "memory_mb", "disk_mb", "timeout", "idle_timeout", "env",
                     "metadata", "network", "from", "on_idle"});
  engine::SandboxSpec spec;
  if (j.contains("image")) {
    spec.image = get_string(j["image"], "image");
    if (spec.image.empty() || spec.image.size() > 64)
      bad("image must be 1..64 characters", "image");
    for (char c : spec.image)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'))
        bad("image name may contain only letters, digits, '-', '_' and '.'", "image");
  }
  if (j.contains("cpus")) spec.cpus = int(get_int(j["cpus"], "cpus", L::kCpus));
  if (j.contains("memory_mb"))
    spec.memory_mb = int(get_int(j["memory_mb"], "memory_mb", L::kMemoryMb));
  if (j.contains("disk_mb")) spec.disk_mb = int(get_int(j["disk_mb"], "disk_mb", L::kDiskMb));
  if (j.contains("timeout")) spec.timeout_s = int(get_int(j["timeout"], "timeout", L::kTimeoutS));
  // 0 = no idle timeout (the default).
  if (j.contains("idle_timeout"))
    spec.idle_timeout_s = int(get_int(j["idle_timeout"], "idle_timeout", L::kIdleTimeoutS));
  if (j.contains("env")) spec.env = get_string_map(j["env"], "env", true);
  if (j.contains("metadata")) {
    spec.metadata = get_string_map(j["metadata"], "metadata", false);
    // "e2b." keys are the E2B surface's own facts (its template name, whether
    // envd wants an access token: src/e2b/model.h): a native create must not
    // forge them.
    for (const auto& [key, value] : spec.metadata)
      if (key.rfind("e2b.", 0) == 0)
        throw Error(Errc::invalid_argument,
                    "metadata key '" + key +
                        "' is reserved: keys starting with 'e2b.' belong to "
                        "the E2B-compatible API",
                    "metadata." + key);
  }
  if (j.contains("network")) spec.network = parse_network(j["network"]);
  // A snapshot to start from (checked by the engine: name, existence).
  if (j.contains("from")) spec.from = get_string(j["from"], "from");
  if (j.contains("on_idle")) spec.on_idle = get_string(j["on_idle"], "on_idle");
  return spec;
}

json parse_network(const json& v) {
  if (!v.is_object()) bad("network must be an object with a mode", "network");
  for (const auto& [key, value] : v.items())
    if (key != "mode" && key != "allow" && key != "deny")
      bad("unknown field 'network." + key + "' (expected mode, allow, deny)", "network." + key);
  if (!v.contains("mode")) bad("network.mode is required", "network.mode");
  std::string mode = get_string(v["mode"], "network.mode");
  if (mode != "none" && mode != "allowlist" && mode != "open")
    bad("network.mode must be none, allowlist or open", "network.mode");
  json out = {{"mode", mode}};
  for (const char* key : {"allow", "deny"}) {
    if (!v.contains(key)) continue;
    std::string field = std::string("network.") + key;
    const json& list = v[key];
    if (!list.is_array()) bad(field + " must be an array of strings", field);
    // Same bound as the engine's policy: a policy is a list of rules, not a blocklist dump.
    if (list.size() > 1024) bad(field + " has more than 1024 entries", field);
    json entries = json::array();
    for (size_t i = 0; i < list.size(); ++i) {
      std::string f = field + "[" + std::to_string(i) + "]";
      std::string s = get_string(list[i], f);
      if (s.empty()) bad(f + " must not be empty", f);
      if (s.size() > 255) bad(f + " is longer than 255 bytes", f);
      entries.push_back(std::move(s));
    }
    out[key] = std::move(entries);
  }
  return out;
}

json parse_network_patch(std::string_view body) {
  json j = parse_object(body);
  // An empty body would silently mean "no change" or "mode none"; neither is
  // what a caller who forgot the body wants.
  if (j.empty()) bad("the body must be a network policy {\"mode\": ...}", "body");
  return parse_network(j);
}

int parse_timeout(std::string_view body) {
  json j = parse_object(body);
  reject_unknown(j, {"timeout"});
  if (!j.contains("timeout")) bad("timeout is required (seconds from now)", "timeout");
  return int(get_int(j["timeout"], "timeout", L::kTimeoutS));
}

PoolRequest parse_pool(std::string_view body) {
  json j = parse_object(body);
  reject_unknown(j, {"image", "size", "cpus", "memory_mb", "disk_mb", "network"});
  PoolRequest r;
  if (!j.contains("image") || !j["image"].is_string() || j["image"].get<std::string>().empty())
    bad("image must be a non-empty string", "image");
  r.image = j["image"].get<std::string>();
  if (!j.contains("size") || !j["size"].is_number_integer())
    bad("size must be an integer (0 disables the pool)", "size");
  r.size = j["size"].get<int>();
  for (const char* k : {"cpus", "memory_mb", "disk_mb"}) {
    if (!j.contains(k)) continue;
    if (!j[k].is_number_integer()) bad(std::string(k) + " must be an integer", k);
    r.shape[k] = j[k];
  }
  // Members with a NIC under deny-everything, serving networked creates.
  if (j.contains("network")) {
    if (!j["network"].is_boolean()) bad("network must be true or false", "network");
    r.shape["network"] = j["network"];
  }
  return r;
}

engine::ExecRequest parse_exec(std::string_view body) {
  json j = parse_object(body);
  reject_unknown(j, {"argv", "cmd", "env", "cwd", "user", "stdin", "stdin_b64", "timeout", "limits",
                     "output_limit_bytes", "background", "stdin_stream"});
  engine::ExecRequest req;
  if (j.contains("argv") && j.contains("cmd")) bad("give either argv or cmd, not both", "argv");
  if (j.contains("argv")) {
    const json& a = j["argv"];
    if (!a.is_array()) bad("argv must be an array of strings", "argv");
    if (a.empty()) bad("argv must not be empty", "argv");
    if (a.size() > 4096) bad("argv has more than 4096 elements", "argv");
    for (const auto& v : a) {
      if (!v.is_string()) bad("argv must be an array of strings", "argv");
      std::string s = v.get<std::string>();
      if (s.find('\0') != std::string::npos) bad("argv must not contain NUL bytes", "argv");
      req.argv.push_back(std::move(s));
    }
    if (req.argv[0].empty()) bad("argv[0] must not be empty", "argv");
  } else if (j.contains("cmd")) {
    req.cmd = get_string(j["cmd"], "cmd");
    if (req.cmd.empty()) bad("cmd must not be empty", "cmd");
    if (req.cmd.find('\0') != std::string::npos) bad("cmd must not contain NUL bytes", "cmd");
  }  // neither: the image's Entrypoint + Cmd (the engine refuses if it has none)
  if (j.contains("env")) req.env = get_string_map(j["env"], "env", true);
  if (j.contains("cwd")) {
    req.cwd = get_string(j["cwd"], "cwd");
    check_guest_path(req.cwd, "cwd");
  }
  if (j.contains("user")) {
    const json& u = j["user"];
    if (u.is_number_integer()) {
      req.user = std::to_string(get_int(u, "user", 0, 4294967294));
    } else if (u.is_string()) {
      req.user = u.get<std::string>();
      if (req.user.empty() || req.user.size() > 64) bad("user must be 1..64 characters", "user");
      for (char c : req.user)
        if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'))
          bad("user must be a user name or a numeric uid", "user");
    } else {
      bad("user must be a string (name) or an integer (uid)", "user");
    }
  }
  if (j.contains("stdin") && j.contains("stdin_b64"))
    bad("give either stdin or stdin_b64, not both", "stdin");
  if (j.contains("stdin")) req.stdin_data = get_string(j["stdin"], "stdin");
  if (j.contains("stdin_b64")) {
    auto raw = base64_decode(get_string(j["stdin_b64"], "stdin_b64"));
    if (!raw) bad("stdin_b64 is not valid base64", "stdin_b64");
    req.stdin_data = std::move(*raw);
  }
  if (j.contains("timeout")) {
    const json& t = j["timeout"];
    if (!t.is_number()) bad("timeout must be a number of seconds", "timeout");
    double s = t.get<double>();
    if (!std::isfinite(s) || s < 0) bad("timeout must be at least 0", "timeout");
    if (s > L::kExecTimeoutS.max)
      bad("timeout must be between 0 (none) and " + std::to_string(L::kExecTimeoutS.max) +
              " seconds",
          "timeout");
    req.timeout_s = s;
  }
  if (j.contains("limits") && !j["limits"].is_null()) {
    const json& l = j["limits"];
    if (!l.is_object()) bad("limits must be an object {pids, memory_mb, cpu_seconds}", "limits");
    reject_unknown(l, {"pids", "memory_mb", "cpu_seconds"});
    if (l.contains("pids") && !l["pids"].is_null())
      req.limits.pids = static_cast<int>(get_int(l["pids"], "limits.pids", L::kExecPids));
    if (l.contains("memory_mb") && !l["memory_mb"].is_null())
      req.limits.memory_mb =
          static_cast<int>(get_int(l["memory_mb"], "limits.memory_mb", L::kExecMemoryMb));
    if (l.contains("cpu_seconds") && !l["cpu_seconds"].is_null()) {
      const json& c = l["cpu_seconds"];
      if (!c.is_number())
        bad("limits.cpu_seconds must be a number of seconds", "limits.cpu_seconds");
      double s = c.get<double>();
      if (!std::isfinite(s) || s < 0.01 || s > 31536000)
        bad("limits.cpu_seconds must be between 0.01 and 31536000", "limits.cpu_seconds");
      req.limits.cpu_seconds = s;
    }
  }
  if (j.contains("output_limit_bytes"))
    req.output_limit_bytes = static_cast<uint64_t>(
        get_int(j["output_limit_bytes"], "output_limit_bytes", 0, int64_t{1} << 40));
  if (j.contains("background")) req.background = get_bool(j["background"], "background");
  if (req.background && req.stdin_data) bad("a background exec takes no stdin", "stdin");
  if (j.contains("stdin_stream")) req.stdin_stream = get_bool(j["stdin_stream"], "stdin_stream");
  if (req.stdin_stream && req.stdin_data)
    bad("give either stdin (or stdin_b64) or stdin_stream, not both", "stdin_stream");
  return req;
}

MkdirRequest parse_mkdir(std::string_view body) {
  json j = parse_object(body);
  reject_unknown(j, {"path", "parents"});
  MkdirRequest req;
  if (!j.contains("path")) bad("path is required", "path");
  req.path = get_string(j["path"], "path");
  check_guest_path(req.path, "path");
  if (j.contains("parents")) req.parents = get_bool(j["parents"], "parents");
  return req;
}

MoveRequest parse_move(std::string_view body) {
  json j = parse_object(body);
  reject_unknown(j, {"from", "to"});
  MoveRequest req;
  for (const char* f : {"from", "to"}) {
    if (!j.contains(f)) bad(std::string(f) + " is required", f);
    check_guest_path(get_string(j[f], f), f);
  }
  req.from = j["from"];
  req.to = j["to"];
  return req;
}

Query parse_query(std::string_view query) {
  Query out;
  while (!query.empty()) {
    auto amp = query.find('&');
    std::string_view part = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
    if (part.empty()) continue;
    auto eq = part.find('=');
    std::string key = percent_decode(part.substr(0, eq));
    std::string value = eq == std::string_view::npos ? "" : percent_decode(part.substr(eq + 1));
    out[key] = std::move(value);
  }
  return out;
}

void check_query_keys(const Query& query, const std::set<std::string>& allowed) {
  for (const auto& [key, value] : query) {
    bool ok = allowed.count(key) > 0 && key.back() != '.';
    for (const auto& a : allowed)
      if (!a.empty() && a.back() == '.' && key.size() > a.size() && key.rfind(a, 0) == 0) ok = true;
    if (!ok) bad("unknown query parameter '" + key + "'", key);
  }
}

std::map<std::string, std::string> metadata_filter(const Query& query) {
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : query)
    if (key.rfind("metadata.", 0) == 0 && key.size() > 9) out[key.substr(9)] = value;
  return out;
}

bool query_bool(const Query& query, const std::string& key, bool fallback) {
  auto it = query.find(key);
  if (it == query.end()) return fallback;
  if (it->second == "true" || it->second == "1" || it->second.empty()) return true;
  if (it->second == "false" || it->second == "0") return false;
  bad(key + " must be true or false", key);
}

void check_guest_path(const std::string& path, const char* field) {
  std::string f = field;
  if (path.empty() || path[0] != '/') bad(f + " must be an absolute path", f);
  if (path.size() > 4096) bad(f + " is longer than 4096 bytes", f);
  if (path.find('\0') != std::string::npos) bad(f + " must not contain NUL bytes", f);
}

std::string query_path(const Query& query) {
  auto it = query.find("path");
  if (it == query.end()) bad("path is required", "path");
  check_guest_path(it->second, "path");
  return it->second;
}

uint32_t query_mode(const Query& query, uint32_t fallback) {
  auto it = query.find("mode");
  if (it == query.end()) return fallback;
  const std::string& s = it->second;
  if (s.empty() || s.size() > 6) bad("mode must be an octal number such as 0644", "mode");
  uint32_t mode = 0;
  for (char c : s) {
    if (c < '0' || c > '7') bad("mode must be an octal number such as 0644", "mode");
    mode = mode * 8 + uint32_t(c - '0');
  }
  if (mode > 07777) bad("mode must be at most 07777", "mode");
  return mode;
}

int query_signal(const Query& query, int fallback) {
  auto it = query.find("signal");
  if (it == query.end()) return fallback;
  const std::string& s = it->second;
  if (s.empty() || s.size() > 2 || s.find_first_not_of("0123456789") != std::string::npos)
    bad("signal must be a number from 1 to 64", "signal");
  int n = std::stoi(s);
  if (n < 1 || n > 64) bad("signal must be a number from 1 to 64", "signal");
  return n;
}

void check_id(std::string_view id, const char* field) {
  bool ok = !id.empty() && id.size() <= 64;
  for (char c : id)
    ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_');
  if (!ok)
    bad(std::string(field) + " must be 1..64 characters of letters, digits, '-' and '_'", field);
}

}  // namespace airlock::daemon

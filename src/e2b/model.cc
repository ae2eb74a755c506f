#include "e2b/model.h"

#include <algorithm>
#include <ctime>
#include <set>

#include "common/error.h"
#include "daemon/request.h"
#include "e2b/version.h"
#include "engine/api/limits.h"
#include "engine/net/policy.h"

namespace airlock::e2b {
namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& message, const std::string& field) {
  throw Error(Errc::invalid_argument, message, field);
}

// A body's "timeout": whole seconds within the API's bounds (engine/api/limits.h).
int timeout_of(const json& j) {
  const auto& t = j["timeout"];
  if (!t.is_number_integer() || !engine::limits::kTimeoutS.contains(t.get<int64_t>()))
    bad("timeout must be whole seconds, " + std::to_string(engine::limits::kTimeoutS.min) + ".." +
            std::to_string(engine::limits::kTimeoutS.max),
        "timeout");
  return t.get<int>();
}

// An object of strings within the API's bounds (engine/api/limits.h):
// `max_value` is the table's for what the map becomes (env or metadata).
std::map<std::string, std::string> string_map(const json& v, const std::string& field,
                                              size_t max_value) {
  namespace L = engine::limits;
  if (v.is_null()) return {};
  if (!v.is_object()) bad(field + " must be an object of strings", field);
  if (v.size() > L::kMaxMapEntries)
    bad(field + " has more than " + std::to_string(L::kMaxMapEntries) + " entries", field);
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : v.items()) {
    if (key.empty() || key.size() > L::kMaxKeyBytes || key.find('\0') != std::string::npos)
      bad(field + " keys must be 1.." + std::to_string(L::kMaxKeyBytes) + " bytes without NUL",
          field);
    if (!value.is_string()) bad(field + "." + key + " must be a string", field + "." + key);
    const auto& s = value.get_ref<const std::string&>();
    if (s.size() > max_value || s.find('\0') != std::string::npos)
      bad(field + "." + key + " must be at most " + std::to_string(max_value) +
              " bytes without NUL",
          field + "." + key);
    out[key] = s;
  }
  return out;
}

std::vector<std::string> string_list(const json& v, const std::string& field) {
  if (v.is_null()) return {};
  if (!v.is_array()) bad(field + " must be an array of strings", field);
  if (v.size() > 1024) bad(field + " has more than 1024 entries", field);
  std::vector<std::string> out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string())
      bad(field + "[" + std::to_string(i) + "] must be a string",
          field + "[" + std::to_string(i) + "]");
    out.push_back(v[i].get<std::string>());
  }
  return out;
}

// Present and not null (the SDK sends `undefined` as an absent key, some
// clients send null for "not set").
bool has(const json& j, const char* key) { return j.contains(key) && !j[key].is_null(); }

bool is_everything(const std::string& cidr) { return cidr == "0.0.0.0/0" || cidr == "::/0"; }

std::string state_name(engine::State s) {
  return s == engine::State::paused ? "paused" : "running";
}

std::map<std::string, std::string> user_metadata(const std::map<std::string, std::string>& m) {
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : m)
    if (k.rfind(kMetaPrefix, 0) != 0) out[k] = v;
  return out;
}

std::string template_of(const engine::SandboxInfo& info) {
  auto it = info.spec.metadata.find(kMetaTemplate);
  return it != info.spec.metadata.end() ? it->second : info.spec.image;
}

json common_json(const engine::SandboxInfo& info) {
  return {{"sandboxID", info.id},
          {"templateID", template_of(info)},
          {"alias", template_of(info)},
          {"clientID", "airlock"},
          {"envdVersion", kEnvdVersion}};
}

}  // namespace

std::string image_for_template(const std::string& template_id) {
  return template_id == "base" ? "debian" : template_id;
}

json egress_policy(const json& body) {
  bool internet = true;
  if (has(body, "allow_internet_access")) {
    if (!body["allow_internet_access"].is_boolean())
      bad("allow_internet_access must be a boolean", "allow_internet_access");
    internet = body["allow_internet_access"].get<bool>();
  }
  std::vector<std::string> allow, deny;
  if (has(body, "network")) {
    const json& n = body["network"];
    if (!n.is_object()) bad("network must be an object", "network");
    for (const char* unsupported : {"rules", "egressProxy"})
      if (has(n, unsupported))
        bad(std::string("network.") + unsupported + " is not supported by airlock",
            std::string("network.") + unsupported);
    allow = string_list(n.value("allowOut", json()), "network.allowOut");
    deny = string_list(n.value("denyOut", json()), "network.denyOut");
  }
  bool deny_all = !internet || std::any_of(deny.begin(), deny.end(), is_everything);
  std::erase_if(deny, is_everything);
  // allowOut wins over denyOut in E2B; in airlock deny wins, so an entry in
  // both is dropped from deny.
  std::erase_if(deny, [&](const std::string& d) {
    return std::find(allow.begin(), allow.end(), d) != allow.end();
  });
  json policy;
  if (deny_all && allow.empty()) {
    policy = {{"mode", "none"}};
  } else if (deny_all) {
    policy = {{"mode", "allowlist"}, {"allow", allow}};
    if (!deny.empty()) policy["deny"] = deny;
  } else {
    policy = {{"mode", "open"}};  // allowOut adds nothing to "everything"
    if (!deny.empty()) policy["deny"] = deny;
  }
  try {
    net::NetworkPolicy::parse(policy);  // every entry checked, as a native create is
  } catch (const Error& e) {
    bad(std::string("network (allowOut/denyOut): ") + e.what(), "network");
  }
  return policy;
}

CreateRequest parse_create(std::string_view body, bool v2, bool allow_insecure) {
  json j = daemon::parse_object(body);
  CreateRequest out;
  if (!has(j, "templateID") || !j["templateID"].is_string() ||
      j["templateID"].get_ref<const std::string&>().empty())
    bad("templateID is required (a template name, e.g. \"base\")", "templateID");
  std::string templ = j["templateID"].get<std::string>();
  out.spec.image = image_for_template(templ);
  out.spec.timeout_s = kDefaultTimeoutS;
  if (has(j, "timeout")) {
    out.spec.timeout_s = timeout_of(j);
  }
  for (const char* unsupported : {"mcp", "volumeMounts", "iam", "autoResume"})
    if (has(j, unsupported))
      bad(std::string(unsupported) + " is not supported by airlock", unsupported);
  if (has(j, "autoPause") && j["autoPause"] == true)
    bad("autoPause is not supported by airlock yet (no pause): the sandbox would be killed at "
        "its timeout, not paused",
        "autoPause");
  out.spec.env =
      string_map(j.value("envVars", json()), "envVars", engine::limits::kMaxEnvValueBytes);
  for (const auto& [key, value] : out.spec.env)
    if (key.find('=') != std::string::npos)
      bad("envVars key '" + key + "' must not contain '='", "envVars");
  out.spec.metadata =
      string_map(j.value("metadata", json()), "metadata", engine::limits::kMaxMetadataValueBytes);
  for (const auto& [key, value] : out.spec.metadata)
    if (key.rfind(kMetaPrefix, 0) == 0)
      bad("metadata key '" + key + "' is reserved (prefix e2b.)", "metadata." + key);
  out.spec.metadata[kMetaTemplate] = templ;
  if (has(j, "secure")) {
    if (!j["secure"].is_boolean()) bad("secure must be a boolean", "secure");
    if (!v2 && !j["secure"].get<bool>()) {
      if (!allow_insecure)
        bad("secure: false is off on this daemon: every sandbox's envd wants its access token "
            "(the operator allows insecure sandboxes with airlockd --e2b-allow-insecure)",
            "secure");
      out.secure = false;
    }
  }
  if (out.secure) out.spec.metadata[kMetaSecure] = "true";
  out.spec.network = egress_policy(j);
  return out;
}

std::optional<int> parse_timeout(std::string_view body, bool optional) {
  json j = body.empty() && optional ? json::object() : daemon::parse_object(body);
  if (!has(j, "timeout")) {
    if (optional) return std::nullopt;
    bad("timeout is required (seconds)", "timeout");
  }
  return timeout_of(j);
}

std::map<std::string, std::string> parse_metadata_query(std::string_view encoded) {
  std::map<std::string, std::string> out;
  // The SDK encodes each key and value, then the "k=v&..." string as a
  // query (URLSearchParams), then the whole as one parameter: after the
  // parameter's own decoding, two levels remain.
  for (const auto& [k, v] : daemon::parse_query(encoded)) {
    std::string key = daemon::percent_decode(k);
    if (key.empty()) bad("metadata filter keys must not be empty", "metadata");
    out[key] = daemon::percent_decode(v);
  }
  return out;
}

std::string rfc3339(int64_t ms) {
  std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  ::gmtime_r(&secs, &tm);
  char buf[40];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  char out[48];
  std::snprintf(out, sizeof out, "%s.%03dZ", buf, static_cast<int>(ms % 1000));
  return out;
}

json sandbox_json(const engine::SandboxInfo& info, const std::string& access_token) {
  json j = common_json(info);
  j["domain"] = nullptr;
  if (!access_token.empty()) j["envdAccessToken"] = access_token;
  return j;
}

json listed_json(const engine::SandboxInfo& info) {
  json j = common_json(info);
  j["startedAt"] = rfc3339(info.created_at_ms);
  j["endAt"] = rfc3339(info.expires_at_ms);
  j["cpuCount"] = info.spec.cpus;
  j["memoryMB"] = info.spec.memory_mb;
  j["diskSizeMB"] = info.spec.disk_mb;
  j["metadata"] = user_metadata(info.spec.metadata);
  j["state"] = state_name(info.state);
  return j;
}

json detail_json(const engine::SandboxInfo& info) {
  json j = listed_json(info);
  j["domain"] = nullptr;
  const json& net = info.spec.network;
  std::string mode = net.value("mode", "none");
  j["allowInternetAccess"] = mode == "open";
  json network = json::object();
  if (mode == "allowlist") {
    network["allowOut"] = net.value("allow", json::array());
    network["denyOut"] = json::array({"0.0.0.0/0"});
  } else if (mode == "open" && net.contains("deny")) {
    network["denyOut"] = net["deny"];
  }
  if (!network.empty()) j["network"] = network;
  return j;
}

json error_json(int status, std::string_view message) {
  return {{"code", status}, {"message", message}};
}

int status_for(const Error& error) { return http_status(error.code()); }

}  // namespace airlock::e2b

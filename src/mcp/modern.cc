#include "mcp/modern.h"

#include "mcp/protocol.h"

namespace airlock::mcp {

using nlohmann::json;

std::optional<json> requested_modern_version(const json& params) {
  if (!params.is_object()) return std::nullopt;
  auto meta = params.find("_meta");
  if (meta == params.end() || !meta->is_object()) return std::nullopt;
  auto v = meta->find(kMetaProtocolVersion);
  if (v == meta->end()) return std::nullopt;
  return *v;
}

json all_supported_versions() {
  json out = json::array();
  for (auto v : kModernVersions) out.push_back(v);
  for (auto v : kProtocolVersions) out.push_back(v);
  return out;
}

std::string check_envelope(const json& params) {
  const json& meta = params["_meta"];
  const json& v = meta[kMetaProtocolVersion];
  bool known = false;
  if (v.is_string())
    for (auto m : kModernVersions) known = known || m == v.get<std::string>();
  if (!known) {
    // The handshake revisions are supported too, but not per request: a
    // client asking for one of them in _meta must initialize instead.
    std::string shown = v.is_string() ? v.get<std::string>() : v.dump();
    throw RpcFailure{kUnsupportedProtocolVersion,
                     "Unsupported protocol version: " + shown + " (per-request _meta[\"" +
                         kMetaProtocolVersion + "\"] supports " +
                         std::string(kModernVersions.front()) +
                         "; earlier revisions start with initialize)",
                     {{"supported", all_supported_versions()}, {"requested", v}}};
  }
  auto caps = meta.find(kMetaClientCapabilities);
  if (caps == meta.end() || !caps->is_object())
    throw RpcFailure{kInvalidParams, std::string("params._meta[\"") + kMetaClientCapabilities +
                                         "\"] must be an object (required by " +
                                         v.get<std::string>() + ")"};
  auto info = meta.find(kMetaClientInfo);
  if (info != meta.end() &&
      !(info->is_object() && info->contains("name") && (*info)["name"].is_string()))
    throw RpcFailure{kInvalidParams, std::string("params._meta[\"") + kMetaClientInfo +
                                         "\"] must be an object with a string name"};
  return v.get<std::string>();
}

json server_info() {
  return {{"name", "airlock"}, {"title", "airlock sandboxes"}, {"version", AIRLOCK_VERSION}};
}

json discover_result(const char* instructions) {
  json versions = json::array();
  for (auto v : kModernVersions) versions.push_back(v);
  // The answer depends on nothing but this binary, yet a client has no way
  // to tell when the binary was replaced: do not let it be cached.
  return {{"supportedVersions", versions},
          {"capabilities", {{"tools", {{"listChanged", false}}}}},
          {"serverInfo", server_info()},
          {"instructions", instructions},
          {"ttlMs", 0},
          {"cacheScope", "private"}};
}

json stamp_result(json result) {
  result["resultType"] = "complete";
  result["_meta"][kMetaServerInfo] = server_info();
  return result;
}

}  // namespace airlock::mcp

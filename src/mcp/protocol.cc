#include "mcp/protocol.h"

#include "mcp/modern.h"
#include "mcp/tool_defs.h"

namespace airlock::mcp {

using nlohmann::json;

namespace {

const char* kInstructions =
    "airlock runs commands in disposable microVM sandboxes on this machine. Create one with "
    "sandbox_create, run commands with sandbox_exec, move files with sandbox_write_file and "
    "sandbox_read_file. Sandboxes this session creates are destroyed when it ends unless "
    "created with keep: true.";

}  // namespace

std::string negotiate_version(const std::string& requested) {
  for (auto v : kProtocolVersions)
    if (v == requested) return requested;
  return std::string(kProtocolVersions.front());
}

json rpc_error(const json& id, int code, const std::string& message, const json& data) {
  json reply = {{"jsonrpc", "2.0"}, {"id", id}, {"error", {{"code", code}, {"message", message}}}};
  if (!data.is_null()) reply["error"]["data"] = data;
  return reply;
}

std::string Protocol::version() const {
  std::lock_guard lock(mu_);
  return version_;
}

std::optional<json> Protocol::handle_line(std::string_view line) {
  json message = json::parse(line, nullptr, false);
  if (message.is_discarded()) return rpc_error(nullptr, kParseError, "parse error: not JSON");
  if (message.is_array()) {
    if (message.empty()) return rpc_error(nullptr, kInvalidRequest, "empty batch");
    json replies = json::array();
    for (const auto& m : message)
      if (auto r = handle(m)) replies.push_back(std::move(*r));
    if (replies.empty()) return std::nullopt;
    return replies;
  }
  return handle(message);
}

std::optional<json> Protocol::handle(const json& message) {
  if (!message.is_object())
    return rpc_error(nullptr, kInvalidRequest, "a message must be an object");
  bool has_id = message.contains("id");
  json id = has_id ? message["id"] : json(nullptr);
  if (has_id && !id.is_string() && !id.is_number_integer())
    return rpc_error(nullptr, kInvalidRequest, "id must be a string or an integer");
  if (message.value("jsonrpc", "") != "2.0")
    return rpc_error(id, kInvalidRequest, "jsonrpc must be \"2.0\"");
  if (!message.contains("method")) {
    // A response to a request of ours: the server sends none, so ignore it.
    if (message.contains("result") || message.contains("error")) return std::nullopt;
    return rpc_error(id, kInvalidRequest, "method is missing");
  }
  if (!message["method"].is_string())
    return rpc_error(id, kInvalidRequest, "method must be a string");
  std::string method = message["method"];
  json params = message.contains("params") ? message["params"] : json::object();
  if (!has_id) {  // a notification: never a reply
    notification(method, params);
    return std::nullopt;
  }
  if (!params.is_object() && !params.is_array())
    return rpc_error(id, kInvalidParams, "params must be an object");
  std::string key = id.dump();
  {
    std::lock_guard lock(mu_);
    in_flight_.insert(key);
  }
  json reply;
  try {
    // initialize belongs to the handshake revisions whatever its _meta says
    // (its protocolVersion param is what negotiates); any other request
    // naming a revision in _meta is stateless and judged on its own.
    auto modern = method == "initialize" ? std::nullopt : requested_modern_version(params);
    json result = modern ? dispatch_modern(method, params, key) : dispatch(method, params, key);
    reply = json{{"jsonrpc", "2.0"}, {"id", id}, {"result", std::move(result)}};
  } catch (const RpcFailure& f) {
    reply = rpc_error(id, f.code, f.message, f.data);
  }
  std::lock_guard lock(mu_);
  in_flight_.erase(key);
  // The spec: no response to a request the client cancelled.
  if (cancelled_.erase(key)) return std::nullopt;
  return reply;
}

void Protocol::notification(const std::string& method, const json& params) {
  // notifications/initialized needs nothing; others are ignored as the spec
  // allows. A cancelled tools/call has its command killed.
  if (method != "notifications/cancelled" || !params.is_object() || !params.contains("requestId"))
    return;
  std::string key = params["requestId"].dump();
  {
    // Marked before the kill: the killed call may return at once, and its
    // reply must already know it is not to be sent.
    std::lock_guard lock(mu_);
    if (!in_flight_.count(key)) return;  // its reply is already out
    cancelled_.insert(key);
  }
  session_.cancel(key);
}

json Protocol::dispatch(const std::string& method, const json& params,
                        const std::string& call_key) {
  if (method == "ping") return json::object();
  if (method == "initialize") {
    if (!params.is_object() || !params.contains("protocolVersion") ||
        !params["protocolVersion"].is_string())
      throw RpcFailure{kInvalidParams, "initialize needs params.protocolVersion (a string)"};
    std::string v = negotiate_version(params["protocolVersion"]);
    {
      std::lock_guard lock(mu_);
      version_ = v;
    }
    return {{"protocolVersion", v},
            {"capabilities", {{"tools", {{"listChanged", false}}}}},
            {"serverInfo", server_info()},
            {"instructions", kInstructions}};
  }
  bool legacy = version() == "2025-03-26";  // before title and structured output
  if (method == "tools/list") {
    json tools = tool_definitions();
    if (legacy)
      for (auto& t : tools) {
        t.erase("outputSchema");
        t.erase("title");
      }
    return {{"tools", tools}};  // all of them: no pagination, no nextCursor
  }
  if (method == "tools/call") return call_tool(params, !legacy, call_key);
  throw RpcFailure{kMethodNotFound, "Method not found: " + method};
}

json Protocol::dispatch_modern(const std::string& method, const json& params,
                               const std::string& call_key) {
  check_envelope(params);  // before anything runs: a rejected request has no effect
  // 2026-07-28 removed ping (and initialize, handled by the caller), and
  // structured output is always on. Nothing here reads or writes version_:
  // the revision is the request's own.
  if (method == "server/discover") return stamp_result(discover_result(kInstructions));
  if (method == "tools/list") {
    json result = {{"tools", tool_definitions()}, {"ttlMs", 0}, {"cacheScope", "private"}};
    return stamp_result(std::move(result));
  }
  if (method == "tools/call") return stamp_result(call_tool(params, true, call_key));
  throw RpcFailure{kMethodNotFound,
                   "Method not found in " + std::string(kModernVersions.front()) + ": " + method};
}

json Protocol::call_tool(const json& params, bool structured, const std::string& call_key) {
  if (!params.is_object() || !params.contains("name") || !params["name"].is_string())
    throw RpcFailure{kInvalidParams, "tools/call needs params.name (a string)"};
  std::string name = params["name"];
  if (!find_tool(name)) throw RpcFailure{kInvalidParams, "Unknown tool: " + name};
  json args = params.contains("arguments") ? params["arguments"] : json::object();
  if (!args.is_object() && !args.is_null())
    throw RpcFailure{kInvalidParams, "params.arguments must be an object"};
  return session_.call(name, args, structured, call_key);
}

}  // namespace airlock::mcp

// MCP revision 2026-07-28, the stateless one: no initialize handshake and no
// session. Every request names its revision and the client's capabilities
// in reserved keys of params._meta, the server checks each request on its
// own, `server/discover` tells a client what the server speaks, and every
// result carries resultType (and the server's identity in its _meta).
//
//   if (auto v = requested_modern_version(params)) {  // a 2026-era request
//     check_envelope(params);                        // throws RpcFailure
//     ...
//     return stamp_result(result);
//   }
#pragma once

#include <array>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace airlock::mcp {

// The stateless revisions this server speaks, newest first.
inline constexpr std::array<std::string_view, 1> kModernVersions = {"2026-07-28"};

// The reserved _meta keys of a 2026-era request and result.
inline constexpr const char* kMetaProtocolVersion = "io.modelcontextprotocol/protocolVersion";
inline constexpr const char* kMetaClientCapabilities = "io.modelcontextprotocol/clientCapabilities";
inline constexpr const char* kMetaClientInfo = "io.modelcontextprotocol/clientInfo";
inline constexpr const char* kMetaServerInfo = "io.modelcontextprotocol/serverInfo";

// JSON-RPC error codes the 2026-07-28 revision adds.
inline constexpr int kUnsupportedProtocolVersion = -32022;

// A failure of the request itself (not of a tool): becomes a JSON-RPC error.
struct RpcFailure {
  int code;
  std::string message;
  nlohmann::json data = nullptr;  // the error's data member, when not null
};

// Whether a request is of the stateless era: params._meta names a protocol
// version (the handshake revisions define no such key). Returns the raw
// value (any JSON type; check_envelope() judges it), nullopt otherwise.
std::optional<nlohmann::json> requested_modern_version(const nlohmann::json& params);

// Checks a 2026-era request's envelope and returns the revision it asks
// for. An unsupported or ill-typed revision is UnsupportedProtocolVersion
// (-32022) with data {supported, requested}; a missing or ill-typed
// clientCapabilities or clientInfo is Invalid params (-32602).
std::string check_envelope(const nlohmann::json& params);

// Every revision the server speaks (stateless ones first, then those with
// the initialize handshake): what an UnsupportedProtocolVersion error lists
// so that a client can fall back to the handshake.
nlohmann::json all_supported_versions();

// The server's identity, as initialize's serverInfo and the 2026 _meta key.
nlohmann::json server_info();

// server/discover's result (before stamp_result).
nlohmann::json discover_result(const char* instructions);

// Adds what every 2026-era result carries: resultType "complete" and the
// server's identity in _meta.
nlohmann::json stamp_result(nlohmann::json result);

}  // namespace airlock::mcp

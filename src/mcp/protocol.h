// MCP's JSON-RPC 2.0 layer, free of I/O: one parsed message in, the reply
// (if any) out. Two eras: the handshake revisions (kProtocolVersions)
// negotiate once in initialize (the server answers with the client's
// protocolVersion if it supports it, else with the latest one it supports);
// the stateless revision 2026-07-28 (mcp/modern.h) names itself in each
// request's _meta and needs no initialize. Both work on one connection.
//
//   Protocol p(session);
//   std::optional<json> reply = p.handle(json::parse(line));
//   if (reply) write_line(reply->dump());
#pragma once

#include <array>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "mcp/session.h"

namespace airlock::mcp {

// Newest first.
inline constexpr std::array<std::string_view, 3> kProtocolVersions = {"2025-11-25", "2025-06-18",
                                                                      "2025-03-26"};

// JSON-RPC error codes.
inline constexpr int kParseError = -32700;
inline constexpr int kInvalidRequest = -32600;
inline constexpr int kMethodNotFound = -32601;
inline constexpr int kInvalidParams = -32602;

// The version the server speaks to a client asking for `requested`.
std::string negotiate_version(const std::string& requested);

class Protocol {
 public:
  explicit Protocol(Session& session) : session_(session) {}

  // One line of input: a JSON-RPC message, or a batch (an array; 2025-03-26
  // allows them). Returns the reply to write, nullopt for notifications and
  // for responses the client sends.
  std::optional<nlohmann::json> handle_line(std::string_view line);
  std::optional<nlohmann::json> handle(const nlohmann::json& message);

  // The version initialize negotiated ("" before it; 2026-era requests
  // leave it alone).
  std::string version() const;

 private:
  nlohmann::json dispatch(const std::string& method, const nlohmann::json& params,
                          const std::string& call_key);
  nlohmann::json dispatch_modern(const std::string& method, const nlohmann::json& params,
                                 const std::string& call_key);
  nlohmann::json call_tool(const nlohmann::json& params, bool structured,
                           const std::string& call_key);
  void notification(const std::string& method, const nlohmann::json& params);

  Session& session_;
  mutable std::mutex mu_;
  std::string version_;  // guarded by mu_
  // Request ids (dumped) the client cancelled: their replies are dropped.
  std::set<std::string> cancelled_;  // guarded by mu_
  std::set<std::string> in_flight_;  // guarded by mu_: requests being handled
};

// A JSON-RPC error reply.
nlohmann::json rpc_error(const nlohmann::json& id, int code, const std::string& message,
                         const nlohmann::json& data = nullptr);

}  // namespace airlock::mcp

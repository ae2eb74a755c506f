// JSON message helpers shared by the host (src/engine/channel) and the guest
// agent (src/guest). The operations and their fields are specified in
// api/guest-protocol.md; this header only gives both sides one way to build
// and read them.
//
//   auto req = protocol::json_frame(Type::request, 7, {{"op", "stat"}, {"path", "/etc"}});
//   ...
//   nlohmann::json j = protocol::parse_json(frame);      // object or Error(protocol_error)
//   protocol::throw_if_error(j);                          // host: {"error":...} -> airlock::Error
//   std::string path = protocol::require_string(j, "path");  // guest: Error(invalid_argument,
//   field)
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "common/error.h"
#include "protocol/frame.h"

namespace airlock::protocol {

inline constexpr const char* kAgentVersion = "0.1.0";

// Error codes the guest puts in {"error":{"code":...}} (api/guest-protocol.md §2).
namespace code {
inline constexpr const char* invalid_argument = "invalid_argument";
inline constexpr const char* not_found = "not_found";
inline constexpr const char* permission_denied = "permission_denied";
inline constexpr const char* exists = "exists";
inline constexpr const char* not_a_directory = "not_a_directory";
inline constexpr const char* is_a_directory = "is_a_directory";
inline constexpr const char* not_empty = "not_empty";
inline constexpr const char* no_space = "no_space";
inline constexpr const char* io_error = "io_error";
inline constexpr const char* protocol_error = "protocol_error";
inline constexpr const char* unsupported_version = "unsupported_version";
inline constexpr const char* internal = "internal";
}  // namespace code

// The guest error code for an errno value (ENOENT -> "not_found", ...).
const char* code_for_errno(int err);
// How the host reports a guest error code: its Errc (unknown codes -> guest_error).
Errc errc_from_guest_code(std::string_view code);

// {"error": {"code": code, "message": message}}
nlohmann::json error_json(std::string_view code, std::string_view message);
bool is_error(const nlohmann::json& response);
// Host side: throws airlock::Error(errc_from_guest_code(code), "guest: " + message)
// if `response` is an error object; does nothing otherwise.
void throw_if_error(const nlohmann::json& response);

// How deep a JSON message on the channel may nest (arrays and objects). The
// protocol's own messages nest at most 4 levels (a jobs list's argv); the
// limit exists because nlohmann's dump, copy and comparison recurse, so a
// hostile guest's [[[[...]]]] would otherwise reach them (stack overflow).
inline constexpr int kMaxJsonDepth = 32;

// True if `text` has arrays/objects nested deeper than `max_depth`. A linear
// structural scan that skips string contents (exact for valid JSON; for
// invalid JSON the parser rejects it anyway); it stops at the first level
// too deep, so it never recurses and never allocates.
bool json_too_deep(std::string_view text, int max_depth = kMaxJsonDepth);

// A frame whose payload is `body` serialised. Throws Error(protocol_error) if
// the serialisation exceeds kMaxPayload.
Frame json_frame(Type type, uint32_t stream, const nlohmann::json& body);
// The payload of `frame` as a JSON object. Throws Error(protocol_error) naming
// the frame type and stream if it is larger than kMaxPayload, nests deeper
// than kMaxJsonDepth, is not valid JSON, or is not an object. Everything
// either side decodes from the other goes through here.
nlohmann::json parse_json(const Frame& frame);

// Field access for requests. Every accessor throws
// Error(invalid_argument, "<field> must be ...", field) on a wrong type; the
// optional ones return the default if the field is absent or null.
std::string require_string(const nlohmann::json& j, const char* field);
std::optional<std::string> optional_string(const nlohmann::json& j, const char* field);
bool optional_bool(const nlohmann::json& j, const char* field, bool fallback);
// Integers must be whole JSON numbers in [min, max].
int64_t optional_int(const nlohmann::json& j, const char* field, int64_t fallback,
                     int64_t min = INT64_MIN, int64_t max = INT64_MAX);

// Hex helpers for the hello's "entropy" (lower- or upper-case accepted).
std::string to_hex(std::string_view bytes);
// Throws Error(invalid_argument) on odd length or a non-hex digit.
std::string from_hex(std::string_view hex);

}  // namespace airlock::protocol

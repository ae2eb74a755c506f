// Parsing and validation of airlockd's HTTP requests: JSON bodies and query
// strings, turned into engine types or an airlock::Error(invalid_argument)
// naming the offending field. Pure functions (no engine, no sockets), so
// every rule is unit-tested without a VM.
//
// Rules shared by every JSON endpoint:
//   * the body must be a JSON object; malformed JSON names the byte position;
//   * unknown fields are rejected ("unknown field 'foo'", field "foo");
//   * each field has one JSON type ("cpus must be an integer");
//   * sizes and durations are range-checked here where the type makes it
//     natural; the engine re-checks everything it relies on.
//
//   SandboxSpec spec = parse_create(R"({"image":"minimal","cpus":2})");
//   Query q = parse_query("path=%2Ftmp%2Fx&recursive=true");
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>

#include "engine/api/service.h"

namespace airlock::daemon {

// Bodies of JSON endpoints larger than this are refused with 413.
constexpr uint64_t kMaxJsonBody = 16ull << 20;
// Upload (PUT files) bodies larger than this are refused with 413.
constexpr uint64_t kMaxUploadBody = 4ull << 30;

// Parses `body` as a JSON object. Throws Error(invalid_argument) naming the
// parse position for malformed JSON, or "request body must be a JSON object".
// An empty body is an empty object.
nlohmann::json parse_object(std::string_view body);

// POST /v1/sandboxes {image, cpus, memory_mb, disk_mb, timeout, env, metadata, network}
engine::SandboxSpec parse_create(std::string_view body);

// The shape of a network policy {"mode", "allow", "deny"} (the `network`
// field of a create, the body of PATCH .../network): an object with only
// those keys ("network.bogus" names an unknown one), mode one of
// none/allowlist/open, allow/deny arrays of at most 1024 non-empty strings
// ("network.allow[2] must be a string"). Returns the policy with absent
// lists left out. What the entries mean (CIDRs, names, the always-deny set)
// is checked by airlock::net::NetworkPolicy::parse, which the handlers call.
nlohmann::json parse_network(const nlohmann::json& value);

// PATCH /v1/sandboxes/{id}/network: the body is the policy itself.
nlohmann::json parse_network_patch(std::string_view body);
// POST .../timeout: {"timeout": seconds from now, 1 .. 604800}.
int parse_timeout(std::string_view body);

// PUT /v1/pool: {"image": "minimal", "size": 2, "cpus"?, "memory_mb"?, "disk_mb"?}.
struct PoolRequest {
  std::string image;
  int size = 0;
  nlohmann::json shape = nlohmann::json::object();  // cpus / memory_mb / disk_mb given
};
PoolRequest parse_pool(std::string_view body);

// POST /v1/sandboxes/{id}/exec {argv | cmd, env, cwd, user, stdin | stdin_b64 |
// stdin_stream, timeout}
engine::ExecRequest parse_exec(std::string_view body);

// POST /v1/sandboxes/{id}/files/mkdir {path, parents}
struct MkdirRequest {
  std::string path;
  bool parents = false;
};
MkdirRequest parse_mkdir(std::string_view body);

// POST /v1/sandboxes/{id}/files/move {from, to}
struct MoveRequest {
  std::string from, to;
};
MoveRequest parse_move(std::string_view body);

// Decoded query parameters (the last of repeated keys wins).
using Query = std::map<std::string, std::string>;
// Splits and percent-decodes a query string ("a=1&b=%2F"); '+' is a space.
// Throws Error(invalid_argument) for a bad %-escape.
Query parse_query(std::string_view query);
// One level of %-escapes ('+' is a space); Error(invalid_argument, "query")
// for a bad escape.
std::string percent_decode(std::string_view s);

// Rejects parameters not in `allowed` (a trailing '.' in an allowed entry
// accepts every key with that prefix, e.g. "metadata.").
void check_query_keys(const Query& query, const std::set<std::string>& allowed);
// "metadata.K=V" parameters as a K->V filter.
std::map<std::string, std::string> metadata_filter(const Query& query);
// "true"/"1"/"false"/"0"; absent -> `fallback`; anything else is an error.
bool query_bool(const Query& query, const std::string& key, bool fallback);
// The required absolute "path" parameter (no NUL, at most 4096 bytes).
std::string query_path(const Query& query);
// File mode in octal ("0644", "755"), 0..07777; absent -> `fallback`.
uint32_t query_mode(const Query& query, uint32_t fallback);
// Signal number 1..64; absent -> `fallback`.
int query_signal(const Query& query, int fallback);

// Sandbox and exec ids: 1..64 characters of [A-Za-z0-9_-]. Throws
// Error(invalid_argument, field) otherwise, before the engine is asked.
void check_id(std::string_view id, const char* field);

// Validates an absolute guest path (shared by the query and JSON forms).
void check_guest_path(const std::string& path, const char* field);

}  // namespace airlock::daemon

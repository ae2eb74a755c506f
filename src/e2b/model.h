// The JSON of E2B's control plane (E2B's published OpenAPI spec, as its JS
// SDK sends and reads it) <-> airlock's sandbox types. Pure conversions,
// no engine: unit-tested in model_test.cc; api.cc serves them.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/error.h"
#include "engine/api/types.h"

namespace airlock::e2b {

// Metadata keys under this prefix are the E2B surface's own facts about a
// sandbox (the native API refuses them in a create, request.cc); E2B
// responses never show them.
inline constexpr std::string_view kMetaPrefix = "e2b.";
inline constexpr const char* kMetaTemplate = "e2b.template";  // templateID as asked
inline constexpr const char* kMetaSecure = "e2b.secure";      // "true": envd wants X-Access-Token

// E2B's default sandbox life when a create names none (E2B: 15 s).
inline constexpr int kDefaultTimeoutS = 15;

// The airlock image a template names: E2B's default template `base` is
// airlock's `debian` (user `user`, bash, curl, git, python3); any other
// name is an airlock image of that name.
std::string image_for_template(const std::string& template_id);

struct CreateRequest {
  engine::SandboxSpec spec;  // image, timeout, env, metadata (with e2b.*), network
  bool secure = true;
};
// POST /sandboxes (v2 = false) or POST /v2/sandboxes (v2 = true: E2B
// secures every such sandbox). Every sandbox is secure (envd wants its
// access token) unless the operator allows insecure ones (`airlockd
// --e2b-allow-insecure`) and a v1 body says `secure: false`; without that
// flag `secure: false` is refused (field "secure"), since a sandbox anyone
// who learns its id could drive is not what the caller would get from E2B's
// hosted proxy either. Fields E2B's server would act on but airlock
// cannot honour (autoPause, mcp, volumeMounts, iam, network.rules,
// egressProxy) are refused with Error(invalid_argument, field), never
// silently dropped; fields that do not change behaviour here are ignored
// as E2B's server ignores unknown ones.
CreateRequest parse_create(std::string_view body, bool v2, bool allow_insecure = false);

// allow_internet_access and network.{allowOut,denyOut} as airlock's egress
// policy JSON (src/engine/net/policy.h). E2B: internet on by default;
// denyOut "0.0.0.0/0" (or allow_internet_access false) blocks all egress
// except allowOut; allowOut wins over denyOut. airlock: "none" = no NIC,
// "allowlist", "open" minus deny; its always-deny set applies in every mode.
nlohmann::json egress_policy(const nlohmann::json& body);

// {"timeout": N} of POST /sandboxes/{id}/timeout and .../connect (N seconds,
// 1..604800); nullopt when absent and `optional`.
std::optional<int> parse_timeout(std::string_view body, bool optional);

// The `metadata` query parameter of a list: url-encoded "k=v&k2=v2".
std::map<std::string, std::string> parse_metadata_query(std::string_view encoded);

// RFC 3339 UTC with milliseconds ("2026-12-03T14:00:00.123Z").
std::string rfc3339(int64_t ms_since_epoch);

// Response shapes: `Sandbox` (create, connect: with envdAccessToken when
// given), `ListedSandbox` (list) and `SandboxDetail` (get).
nlohmann::json sandbox_json(const engine::SandboxInfo& info, const std::string& access_token);
nlohmann::json listed_json(const engine::SandboxInfo& info);
nlohmann::json detail_json(const engine::SandboxInfo& info);

// E2B's error body {"code": <HTTP status>, "message"} and the status for an
// airlock error.
nlohmann::json error_json(int status, std::string_view message);
int status_for(const Error& error);

}  // namespace airlock::e2b

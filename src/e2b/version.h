// The envd version airlock's E2B-compatible surface advertises (create and
// connect responses' "envdVersion", the envd /health and headers). E2B's SDK
// switches behaviour on it: >= 0.4.0 sends no default username (the sandbox's
// default user applies), >= 0.5.2 has CloseStdin, >= 0.5.7 uploads files as
// application/octet-stream (older SDKs send multipart, which is served too).
// Raise it only together with the behaviour of the release it names.
#pragma once

namespace airlock::e2b {

inline constexpr const char* kEnvdVersion = "0.5.7";

}  // namespace airlock::e2b

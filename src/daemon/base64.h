// Standard base64 (RFC 4648, with padding) for the NDJSON exec stream, where
// raw output bytes travel inside JSON strings, and for stdin_b64.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace airlock::daemon {

std::string base64_encode(std::string_view bytes);
// std::nullopt if `text` is not valid padded base64 (whitespace not allowed).
std::optional<std::string> base64_decode(std::string_view text);

}  // namespace airlock::daemon

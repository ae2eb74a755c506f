// Small private files of the auth component: written whole and atomically
// (a temporary file created 0600, fsync, rename), so a crash leaves the old
// or the new content, never a torn one, and never a moment of wider mode.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

namespace airlock::auth {

// Replaces `path` with `content` (mode 0600). Throws Error(internal).
void write_private(const std::filesystem::path& path, const std::string& content);
// The file's content, std::nullopt if it does not exist. Throws Error(internal).
std::optional<std::string> read_file(const std::filesystem::path& path);
// Lowercase hex SHA-256 of `data` (OpenSSL).
std::string sha256_hex(const std::string& data);
// `n` random bytes from OpenSSL's CSPRNG as lowercase hex (2n characters).
std::string random_hex(size_t n);
// Seconds since the epoch.
int64_t unix_now();

}  // namespace airlock::auth

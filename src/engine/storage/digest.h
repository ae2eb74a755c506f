// SHA-256 helpers for cache keys and integrity checks (images, templates).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace airlock::storage {

// Hex SHA-256 of the length-prefixed parts (so part boundaries count:
// {"ab","c"} and {"a","bc"} differ).
std::string sha256_hex(const std::vector<std::string>& parts);

// Hex SHA-256 of a file's bytes. Error(not_found/internal) naming the file.
std::string sha256_file(const std::filesystem::path& path);

}  // namespace airlock::storage

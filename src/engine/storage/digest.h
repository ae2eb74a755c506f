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

// SHA-256 fed piece by piece (a stream that is never a file of its own,
// e.g. a layer's decompressed tar).
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t len);
  std::string hex();  // once, at the end

 private:
  void* ctx_;  // EVP_MD_CTX
};

}  // namespace airlock::storage

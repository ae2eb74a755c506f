#include "engine/storage/layer_cache.h"

#include <sys/stat.h>

#include <mutex>

namespace airlock::storage {
namespace fs = std::filesystem;

namespace {

// Builds hold it shared for their whole run; prune_layers takes it
// exclusively, or does nothing when a build runs.
std::shared_mutex& layer_cache_mutex() {
  static std::shared_mutex m;
  return m;
}

uint64_t allocated_bytes(const fs::path& p) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

}  // namespace

fs::path layer_dir(const fs::path& image_dir) { return image_dir / "cache" / "layers"; }

LayerCacheUse::LayerCacheUse() : lock_(layer_cache_mutex()) {}

std::optional<uint64_t> prune_layers(const fs::path& image_dir, bool dry_run,
                                     std::vector<std::string>& removed) {
  std::unique_lock lock(layer_cache_mutex(), std::try_to_lock);
  if (!lock.owns_lock()) return std::nullopt;
  uint64_t freed = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(layer_dir(image_dir), ec)) {
    // Layers are airlock's own regular files; anything else is left alone.
    if (!e.is_regular_file(ec) || e.is_symlink(ec)) continue;
    freed += allocated_bytes(e.path());
    removed.push_back("build-cache:" + e.path().filename().string());
    if (!dry_run) fs::remove(e.path(), ec);
  }
  return freed;
}

}  // namespace airlock::storage

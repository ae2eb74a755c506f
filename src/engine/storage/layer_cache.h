// The recipe layer cache: <image_dir>/cache/layers/<step key>.qcow2, one
// file per built recipe step (src/recipes/builder.h). The builder writes
// it; `airlock prune` (Engine::prune) empties it. Both sides go through
// here, so they agree on where it is and never overlap: a build holds
// LayerCacheUse for its whole run and prune_layers leaves the cache alone
// meanwhile.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

namespace airlock::storage {

// Where the layers live. Under cache/: not an image name
// (ImageStore::names_on_disk skips it), and `airlock df` counts it among
// the layers.
std::filesystem::path layer_dir(const std::filesystem::path& image_dir);

// Held (shared) by a build while it reads and writes layers.
class LayerCacheUse {
 public:
  LayerCacheUse();

 private:
  std::shared_lock<std::shared_mutex> lock_;
};

// The layer cache goes whole (installed images are flattened, so none
// stands on a layer; the next build reruns its steps). Appends
// "build-cache:<file>" to `removed` and returns the bytes freed, or nullopt
// (nothing touched) while a build runs.
std::optional<uint64_t> prune_layers(const std::filesystem::path& image_dir, bool dry_run,
                                     std::vector<std::string>& removed);

}  // namespace airlock::storage

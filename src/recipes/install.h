// The last part of a recipe build: the top layer flattened to a raw ext4
// (qemu-img convert reads the whole backing chain) and installed as an image
// with the recipe's config (storage::ImageStore::install). A no-op when the
// current image of that name was made from the same inputs (its config
// label "airlock.recipe.key" equals `key`).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "common/subprocess.h"
#include "recipes/recipe.h"
#include "engine/storage/image_store.h"

namespace airlock::engine {
class SandboxService;  // engine/api/service.h
}

namespace airlock::recipes {

storage::Image install_image(engine::SandboxService& engine, const std::filesystem::path& image_dir,
                             const std::string& name, const storage::Image& base,
                             const std::filesystem::path& top, const Recipe& recipe,
                             const std::string& key, int layers, const std::string& source,
                             const std::function<void(uint64_t bytes)>& progress);

// Options of a host command (cp, qemu-img) that may take `m` minutes.
SubprocessOptions minutes_timeout(int m);

// The image as the API shows it.
nlohmann::json image_json(const storage::Image& img);

}  // namespace airlock::recipes

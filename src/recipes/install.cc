#include "recipes/install.h"

#include <unistd.h>

#include <optional>

#include "common/error.h"
#include "common/scope_guard.h"
#include "common/subprocess.h"
#include "engine/confine/confine.h"
#include "engine/api/service.h"
#include "engine/storage/disk_chain.h"
#include "engine/storage/layer_cache.h"

namespace airlock::recipes {
namespace fs = std::filesystem;
namespace confine = engine::confine;

SubprocessOptions minutes_timeout(int m) {
  SubprocessOptions o;
  o.timeout = std::chrono::minutes(m);
  return o;
}

constexpr const char* kKeyLabel = "airlock.recipe.key";

storage::Image install_image(engine::SandboxService& engine, const fs::path& image_dir,
                             const std::string& name, const storage::Image& base,
                             const fs::path& top, const Recipe& recipe, const std::string& key,
                             int layers, const std::string& source,
                             const std::function<void(uint64_t)>& progress) {
  auto& store = engine.images();
  try {
    if (auto cur = store.find(name)) {
      auto it = cur->config.labels.find(kKeyLabel);
      if (it != cur->config.labels.end() && it->second == key) return *cur;
    }
  } catch (const Error& e) {
    if (e.code() != Errc::not_found) throw;
  }
  // Flattened next to the layers (same filesystem as the image dir, so
  // install can hard-link it), removed whatever happens.
  fs::path tmp =
      storage::layer_dir(image_dir) / (".flat-" + key.substr(0, 16) + "-" + std::to_string(::getpid()));
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp);
  ScopeGuard drop([&] {
    std::error_code e2;
    fs::remove_all(tmp, e2);
  });
  fs::path raw = tmp / "rootfs.ext4";
  std::optional<confine::Scratch> scratch;  // after `drop`: gone before tmp is
  if (top == base.rootfs) {
    run_checked({"cp", "--sparse=always", top.string(), raw.string()}, minutes_timeout(10));
  } else {
    // The layers were written by the build's sandboxes: their chain is read
    // by airlock and must stay in airlock's own directories (the base and
    // the layer cache in the image directory; the template a first step's
    // sandbox was cloned from); qemu-img gets exactly those files.
    // qemu-img parses those layers' qcow2 metadata (a sandbox's QEMU wrote
    // it): confined (confine.h), given the chain's files as descriptors.
    auto chain =
        storage::disk_chain(top, engine.disk_roots(), "recipe layer " + top.filename().string());
    scratch.emplace(tmp);
    confine::Limits lim;
    lim.timeout = std::chrono::minutes(20);
    auto r = confine::run(scratch->exec({"qemu-img", "convert", "-q", "-O", "raw",
                                         scratch->give_image_opts(storage::image_opts(chain)),
                                         scratch->give_dir() + "/rootfs.ext4"},
                                        "qemu-img", lim));
    if (!r.ok()) throw Error(Errc::internal, r.describe());
    scratch->reclaim();
    raw = scratch->dir() / "rootfs.ext4";
  }
  if (progress) progress(fs::file_size(raw));
  // The base's config is inherited (an imported OCI base keeps its PATH,
  // WorkingDir, User, Entrypoint/Cmd and labels); the recipe's entries win.
  storage::ImageConfig config = base.config;
  for (const auto& [k, v] : recipe.env) config.env[k] = v;
  if (!recipe.workdir.empty()) config.workdir = recipe.workdir;
  if (!recipe.user.empty()) config.user = recipe.user;
  if (!recipe.warmup.empty()) config.warmup = recipe.warmup;
  config.base = base.name;
  config.labels[kKeyLabel] = key;
  return store.install(name, raw, config,
                       {.source = "recipe:" + (source.empty() ? std::string("recipe") : source),
                        .layers = layers,
                        .replace = true});
}

nlohmann::json image_json(const storage::Image& img) { return storage::to_json(img); }

}  // namespace airlock::recipes

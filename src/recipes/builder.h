// The recipe build runner behind POST /v1/images/build (docs/design.md,
// "Image recipes"), a client of the engine through its interface
// (engine/api/service.h), never part of it. Each step runs in a real build sandbox booted on the previous
// step's layer; the sandbox's qcow2 overlay, once the guest has synced and
// remounted its root read-only, is kept as the step's layer:
//   <image_dir>/cache/layers/<step key>.qcow2   (backing: the previous layer, or
//                                          the base image's rootfs.ext4;
//                                          storage/layer_cache.h)
// A step whose key has a layer is a cache hit and does not boot anything.
// The last layer is flattened to a raw ext4 (qemu-img convert) and installed
// as image NAME with the recipe's config (ImageStore::install).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "recipes/plan.h"

namespace airlock::engine {
class SandboxService;  // engine/api/service.h
}

namespace airlock::recipes {

struct BuildRequest {
  std::string name;         // the image to make
  std::string recipe;       // TOML text
  std::string source_name;  // for messages, e.g. "airlock.toml"
  std::map<std::string, std::string> args;
  Files files;  // what [[copy]] reads, relative to the recipe's directory
};

// Progress events, in order:
//   {"type":"plan","steps":N,"base":NAME,"key":K}
//   {"type":"step","index":i,"count":N,"kind","title","key","cached":bool}
//   {"type":"output","index":i,"data":"..."}          (a step's output)
//   {"type":"progress","index":i,"bytes":B,"elapsed_s":S}   (about every 1 s)
//   {"type":"step_done","index":i,"bytes":B,"elapsed_s":S}
//   {"type":"flatten","bytes":B}
// Called from more than one thread, never at once; false = stop the build.
using EventFn = std::function<bool(const nlohmann::json&)>;

// Builds; returns {"image": <image json>, "key", "steps", "cached", "built",
// "elapsed_s"}. Errors: invalid_argument (bad recipe, field names the key;
// a step that failed: field "run[i]"/"apt"/..., message with its output's
// tail), conflict (NAME is a built-in image), others as Engine::create.
// On any error nothing of this build remains but the layers of the steps
// that succeeded.
nlohmann::json build(engine::SandboxService& engine, const std::filesystem::path& image_dir,
                     const BuildRequest& request, const EventFn& on_event);

}  // namespace airlock::recipes

// Guest images: kernel + initramfs + read-only ext4 root filesystem.
//
// An image is built from a recipe (images/<name>.sh, installed under
// share/airlock/images) and stored read-only under
//   <image_dir>/<name>/<key>/{vmlinuz,initrd.img,rootfs.ext4,image.json}
// where <key> is a hash of every input (recipe text, kernel package version,
// guest agent binary, ...). A build whose key already exists is a no-op; a
// changed input makes a new key, so a stale image is never reused.
// Builds go to a temporary directory and are renamed into place atomically:
// a failed or interrupted build leaves nothing half-made.
//
//   ImageStore store(dirs.images, dirs.share / "images", dirs.bin / "airlock-guest");
//   Image img = store.build("minimal", [](const BuildProgress& p) { ... });
//   create_overlay(img.rootfs, sandbox_dir / "disk.qcow2", 1024);
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace airlock::storage {

struct Image {
  std::string name;
  std::string key;  // hash of the inputs
  std::filesystem::path dir;
  std::filesystem::path kernel;  // vmlinuz
  std::filesystem::path initrd;  // initramfs: loads virtio modules, switches root
  std::filesystem::path rootfs;  // raw ext4, read-only base of every overlay
  std::string kernel_release;    // e.g. "6.1.0-57-cloud-amd64"
  uint64_t rootfs_bytes = 0;     // logical size of rootfs.ext4
  std::int64_t built_at = 0;     // unix seconds
};

struct BuildProgress {
  std::string step;    // human step name, e.g. "debootstrap", "mkfs.ext4"
  uint64_t bytes = 0;  // bytes produced so far in this step (0 if unknown)
};
using ProgressFn = std::function<void(const BuildProgress&)>;

class ImageStore {
 public:
  ImageStore(std::filesystem::path image_dir, std::filesystem::path recipe_dir,
             std::filesystem::path guest_agent);

  // Names of the built-in recipes ("minimal", "debian").
  std::vector<std::string> recipes() const;

  // Builds `name` if no image with the current input key exists; returns it.
  // Throws Error(not_found) for an unknown recipe, Error(internal) naming the
  // failed step (with the tail of its output) if the build fails.
  Image build(const std::string& name, const ProgressFn& progress = {});

  // The current image for `name` (input key matches), if built.
  std::optional<Image> find(const std::string& name) const;

  // Every current image.
  std::vector<Image> list() const;

 private:
  std::filesystem::path image_dir_, recipe_dir_, guest_agent_;
};

// Creates a qcow2 overlay at `overlay` whose read-only backing file is the raw
// image `base`, with a virtual size of `size_mb` (>= the base's size).
// Throws Error naming what failed; leaves no file behind on failure.
void create_overlay(const std::filesystem::path& base, const std::filesystem::path& overlay,
                    uint64_t size_mb);

}  // namespace airlock::storage

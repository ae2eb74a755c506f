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
#include <memory>
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

struct KernelRef;  // the guest kernel package: name + Debian version

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

  // Layout (besides <image_dir>/<name>/<key>/):
  //   <image_dir>/cache/kernel/<package>_<version>/  unpacked kernel package
  //       (vmlinuz, config, release, modules/<release>/), shared by all images
  //   <image_dir>/cache/rootfs/<name>-<rootfs key>/rootfs.ext4
  // The root filesystem is keyed by the recipe alone, so a new guest agent or
  // kernel only re-packs the small initramfs; the image directory hard-links
  // vmlinuz and rootfs.ext4, so it stays complete on its own.
  // The initramfs compression, "none" (default, boots faster under TCG) or
  // "gzip", from $AIRLOCK_INITRD_COMPRESS; part of the key.
  static std::string initrd_compression();

 private:
  struct Keys {
    std::string rootfs, image;
  };
  void check_recipe(const std::string& name) const;
  KernelRef current_kernel() const;
  Keys keys_for(const std::string& name, const KernelRef& kernel) const;  // memoised
  Keys compute_keys(const std::string& name, const KernelRef& kernel) const;
  std::optional<Image> load(const std::string& name, const std::string& key) const;
  std::filesystem::path kernel_cache_dir() const;
  std::filesystem::path rootfs_cache_dir() const;
  std::filesystem::path ensure_kernel(const KernelRef& k, const ProgressFn& progress) const;
  std::filesystem::path ensure_rootfs(const std::string& name, const std::string& key,
                                      const ProgressFn& progress) const;
  void run_script(const std::string& what, const std::filesystem::path& script,
                  const std::filesystem::path& out_dir, const std::filesystem::path& work,
                  std::vector<std::pair<std::string, std::string>> env,
                  std::chrono::minutes timeout, const ProgressFn& progress) const;

  std::filesystem::path image_dir_, recipe_dir_, guest_agent_;
  // The resolved kernel package, re-asked from apt every few minutes
  // (behind a pointer so the store stays movable).
  struct KernelCache;
  std::shared_ptr<KernelCache> kernel_cache_;
};

// Creates a qcow2 overlay at `overlay` whose read-only backing file is
// `base` (a raw image, or a template's qcow2 disk with base_format "qcow2"),
// with a virtual size of `size_mb` (>= the base's size).
// Throws Error naming what failed; leaves no file behind on failure.
void create_overlay(const std::filesystem::path& base, const std::filesystem::path& overlay,
                    uint64_t size_mb, const std::string& base_format = "raw");

}  // namespace airlock::storage

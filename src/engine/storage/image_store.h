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
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace airlock::storage {

// What an image says about how its commands run, and where it came from.
// Exec defaults (env, workdir, user) apply to every exec in a sandbox of the
// image; the exec request's own values win (see guest_exec_request).
struct ImageConfig {
  std::map<std::string, std::string> env;    // e.g. {"PATH", "/usr/local/bin:/usr/bin:/bin"}
  std::string workdir;                       // absolute guest path; "" = "/"
  std::string user;                          // name or uid[:gid]; "" = root
  std::vector<std::string> entrypoint, cmd;  // recorded from OCI configs; not run at boot
  std::vector<std::string> warmup;           // shell commands templates/pool run once
  std::string base;                          // parent image name, "" = none
  std::map<std::string, std::string> labels;
};
nlohmann::json to_json(const ImageConfig& c);
// Parses and checks a config (unknown fields, relative workdir, NUL bytes
// ...): Error(invalid_argument) naming the field, prefixed with `field`.
ImageConfig image_config_from_json(const nlohmann::json& j, const std::string& field = "config");

// Where an installed image came from, recorded in its image.json.
struct InstallInfo {
  std::string source;  // e.g. "oci:sha256:ab12...", "docker-save:app.tar", "recipe:airlock.toml"
  int layers = 1;      // layers it was made of (1 for a flat rootfs)
  // Replace an existing installed image of that name (the old version stays
  // on disk, used by the sandboxes that run it, until `prune`).
  bool replace = false;
  // The tenant it belongs to ("" = global: the operator's, bootable by
  // every tenant); e.g. an image saved from a tenant's snapshot.
  std::string tenant;
};

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
  // "recipe" (built from images/<name>.sh) or "installed" (install(): OCI
  // import, image recipes).
  std::string kind = "recipe";
  ImageConfig config;  // empty for the built-in recipes
  std::string source;  // InstallInfo::source, or "recipe:<name>.sh"
  int layers = 1;
  uint64_t disk_bytes = 0;  // allocated bytes of the image directory
  std::string tenant;       // InstallInfo::tenant ("" = global)
};
nlohmann::json to_json(const Image& img);

// Allocated bytes of the files under `dir` (images are sparse); 0 if it is
// missing. For df and prune.
uint64_t allocated_bytes(const std::filesystem::path& dir);

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

  // Every current image (built recipes, then installed images by name).
  std::vector<Image> list() const;

  // Installs `rootfs` as image `name`, complete on its own: the root
  // filesystem (an ext4 file, or a directory tree that is packed with
  // mkfs.ext4 -d), the current guest kernel (vmlinuz) and an initramfs with
  // the kernel's virtio modules and the airlock-guest agent (both injected
  // at boot: /init loads the modules and copies the agent to /run/airlock,
  // exactly as for the built-in recipes, so nothing in the rootfs needs to
  // know airlock), plus image.json with `config` and the metadata (size,
  // layers, created, source).
  //   ImageConfig c;  c.env["PATH"] = "/usr/bin:/bin";  c.workdir = "/app";
  //   Image img = store.install("myapp", tree_dir, c, {.source = "oci:sha256:..", .layers = 3});
  // A directory is used in place and gets the mount points the initramfs
  // needs (/proc /sys /dev /run /tmp) added; file owners are kept when the
  // caller is root (mkfs.ext4 copies them), else they become the caller's.
  // Atomic: everything is staged in <image_dir>/<name>/.tmp-* and renamed
  // into place; then <name>/current is switched (a symlink renamed over the
  // old one). On failure nothing of it remains.
  // Errors: invalid_argument (bad name, bad config, rootfs neither ext4 nor
  // a directory), conflict (a built-in recipe's name, or the name exists and
  // !info.replace), unavailable (no guest agent or kernel), internal (a
  // failed step, named, with the tail of its output).
  Image install(const std::string& name, const std::filesystem::path& rootfs,
                const ImageConfig& config, const InstallInfo& info,
                const ProgressFn& progress = {});

  // Every version on disk of `name` (current or not), for prune and df.
  std::vector<std::filesystem::path> versions(const std::string& name) const;
  // Removes image `name` entirely (all versions; for a recipe, its built
  // images, so the next use rebuilds). The caller checks that nothing uses
  // it (Engine::remove_image). Error(not_found) if there is nothing to remove.
  void remove(const std::string& name);
  // Removes version directories of `name` that are not current and whose
  // paths are not in `in_use`; returns the bytes freed (or that would be,
  // with dry_run) and the removed paths in `removed`.
  uint64_t prune_versions(const std::string& name, const std::vector<std::filesystem::path>& in_use,
                          bool dry_run, std::vector<std::filesystem::path>* removed);
  // Names of every image directory on disk (recipes and installed).
  std::vector<std::string> names_on_disk() const;
  const std::filesystem::path& dir() const { return image_dir_; }

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
  // load's reading of image.json and the directory, without the memo.
  std::optional<Image> read_image(const std::string& name, const std::string& key,
                                  const std::filesystem::path& dir) const;
  std::optional<Image> find_installed(const std::string& name) const;
  bool is_recipe(const std::string& name) const;
  std::filesystem::path kernel_cache_dir() const;
  std::filesystem::path rootfs_cache_dir() const;
  std::filesystem::path ensure_kernel(const KernelRef& k, const ProgressFn& progress) const;
  std::filesystem::path ensure_rootfs(const std::string& name, const std::string& key,
                                      const ProgressFn& progress) const;
  void run_script(const std::string& what, const std::filesystem::path& script,
                  const std::filesystem::path& out_dir, const std::filesystem::path& work,
                  std::vector<std::pair<std::string, std::string>> env,
                  std::chrono::minutes timeout, const ProgressFn& progress) const;
  // initramfs.sh into `dir` (the kernel's virtio modules from `kdir` and the
  // guest agent): the same for built recipes and installed images.
  void pack_initramfs(const std::string& name, const std::filesystem::path& dir,
                      const std::filesystem::path& kdir, const ProgressFn& progress) const;

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

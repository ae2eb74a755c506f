// VM templates on disk: what a clone is made from (docs/design.md,
// "Templates and clones").
//
// A template is one guest booted to a ready agent and frozen:
//   <root>/<key>/disk.qcow2      its disk (overlay over the image's rootfs),
//                                read-only backing of every clone's overlay
//   <root>/<key>/clone.qcow2     an empty overlay over disk.qcow2, copied
//                                for each clone (no qemu-img run per clone)
//   <root>/<key>/state.bin       device state (x-ignore-shared migration)
//   <root>/<key>/template.json   what it was made from + integrity record
//   <ram_dir>/<key>.ram          guest RAM (ram_dir belongs on tmpfs); clones
//                                map it privately (copy-on-write)
// The key hashes everything that makes a saved guest unusable elsewhere:
// the image's key (kernel, initramfs, agent, rootfs), the QEMU binary's
// version and identity, the accelerator and the VM shape. A change gives a
// new key, so a template is never reused across a change; old ones are
// pruned.
//
// find() checks a template before it is used: files present, RAM file of
// the right size and unchanged since it was saved (mtime and ctime, which
// no one can set back), state file's SHA-256, disk unchanged. A template
// failing any check is removed and the reason returned, so the caller can
// log it and rebuild.
//
//   TemplateStore store(data / "templates", "/dev/shm/airlock-xyz");
//   std::string key = TemplateStore::key_for(img.key, shape, "tcg", qemu_id);
//   std::string why;
//   if (auto t = store.find(key, &why)) { ... clone from *t ... }
//   auto st = store.stage(key);  ... boot, save state into st ...
//   Template t = store.commit(st, meta);
#pragma once

#include <cstdint>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace airlock::templates {

// What must match between a template and its clones.
struct Shape {
  int cpus = 1;
  int memory_mb = 256;
  int disk_mb = 1024;
  bool nic = false;  // a virtio-net device (networked sandboxes)
  auto operator<=>(const Shape&) const = default;
};
nlohmann::json to_json(const Shape& shape);

struct Template {
  std::string key;
  std::string image;      // image name
  std::string image_key;  // the image build it was made from
  std::string accel;      // "kvm" | "tcg"
  Shape shape;
  std::filesystem::path dir;
  std::filesystem::path disk;   // dir/disk.qcow2
  std::filesystem::path clone;  // dir/clone.qcow2: copy me for a clone's overlay
  std::filesystem::path state;  // dir/state.bin
  std::filesystem::path ram;    // <ram_dir>/<key>.ram
  uint64_t state_bytes = 0;
  int64_t built_at_ms = 0;
  int64_t build_ms = 0;  // boot + save
};
nlohmann::json to_json(const Template& t);

// A template being made: a private directory and RAM file name, published
// by commit() or removed by abandon().
struct Staging {
  std::string key;
  std::filesystem::path dir;
  std::filesystem::path disk;
  std::filesystem::path state;
  std::filesystem::path ram;
};

class TemplateStore {
 public:
  // Creates both directories if needed (Error(internal) naming the one that
  // cannot be made). The RAM directory must be the daemon's own: a directory
  // (not a symlink), owned by the daemon's uid, mode 0700; it is checked here
  // and before every use (find, stage, commit, prune), Error(invalid_argument,
  // field "template_ram_dir") naming the path and what is wrong otherwise.
  // Leftovers of interrupted builds are removed.
  TemplateStore(std::filesystem::path root, std::filesystem::path ram_dir);

  // The template key for these inputs (hex, 16 digits).
  static std::string key_for(const std::string& image_key, const Shape& shape,
                             const std::string& accel, const std::string& qemu_identity);
  // `binary --version` plus the binary's size and mtime: a rebuilt QEMU with
  // the same version string still counts as a change. Cached per binary.
  static std::string qemu_identity(const std::string& binary);

  // The template `key` if present and intact. If it is present but fails a
  // check it is removed and `*why` says what was wrong (empty otherwise).
  std::optional<Template> find(const std::string& key, std::string* why);

  // A fresh staging area for `key`.
  Staging stage(const std::string& key);
  // Publishes a staged template whose disk and state are written: makes
  // clone.qcow2, records sizes, times and the state's SHA-256, makes the
  // files read-only and renames the directory into place (replacing an older
  // copy). `meta` supplies image, image_key, accel, shape, build_ms.
  Template commit(const Staging& staging, const Template& meta);
  // Removes a staging area. Never throws.
  void abandon(const Staging& staging) noexcept;

  // Removes template `key` (its directory and RAM file). Never throws.
  void remove(const std::string& key) noexcept;
  // Every published template (unchecked), newest first.
  std::vector<Template> list();
  // Keeps the `keep` most recently used templates, removing the others;
  // returns the keys removed.
  std::vector<std::string> prune(size_t keep);
  // Records a use (for prune's order).
  void touch(const std::string& key) noexcept;

  const std::filesystem::path& root() const { return root_; }
  const std::filesystem::path& ram_dir() const { return ram_dir_; }

 private:
  std::optional<Template> load(const std::string& key, nlohmann::json* record, std::string* why);
  void check_ram_dir() const;

  std::filesystem::path root_;
  std::filesystem::path ram_dir_;
  std::mutex mu_;  // publish/remove against each other
};

}  // namespace airlock::templates

// Image management (docs/design.md, "Images: import and management"):
// list with users, inspect, import (OCI / docker save), remove (refused while
// used), disk usage, prune. Who uses an image: live sandboxes (pool members
// show as "pool:<id>"), templates and snapshots (a snapshot's layer chain
// ends on the image's root filesystem or on a template disk of it).
#include <sys/stat.h>

#include <algorithm>
#include <fstream>

#include "common/error.h"
#include "engine/engine.h"
#include "engine/engine_impl.h"
#include "engine/storage/image_name.h"
#include "engine/storage/layer_cache.h"
#include "engine/storage/oci_import.h"
#include "engine/types_json.h"

namespace airlock::engine {
namespace fs = std::filesystem;

namespace {

// Allocated bytes under `dir` (0 if it does not exist).
uint64_t du(const fs::path& dir) { return storage::allocated_bytes(dir); }

// The backing file named in a qcow2 header (offset 8: u64 offset, 16: u32
// size, big-endian), "" if none. Read by airlock from its own overlays.
std::string qcow2_backing(const fs::path& disk) {
  std::ifstream in(disk, std::ios::binary);
  unsigned char h[20] = {};
  if (!in.read(reinterpret_cast<char*>(h), sizeof h)) return "";
  if (h[0] != 'Q' || h[1] != 'F' || h[2] != 'I' || h[3] != 0xfb) return "";
  uint64_t off = 0;
  for (int i = 8; i < 16; ++i) off = (off << 8) | h[i];
  uint32_t len = (uint32_t{h[16]} << 24) | (uint32_t{h[17]} << 16) | (uint32_t{h[18]} << 8) | h[19];
  if (off == 0 || len == 0 || len > 4096) return "";
  std::string name(len, '\0');
  in.seekg(static_cast<std::streamoff>(off));
  if (!in.read(name.data(), len)) return "";
  return name;
}

}  // namespace

std::vector<std::string> Engine::image_users(const std::string& name) {
  std::vector<std::string> who;
  for (const auto& sb : list({}, true)) {
    if (is_terminal(sb.state) || sb.spec.image != name) continue;
    bool pooled = sb.spec.metadata.count(kPoolMarker) > 0;
    who.push_back((pooled ? "pool:" : "sandbox:") + sb.id);
  }
  if (auto* store = impl_->templates.store()) {
    for (const auto& t : store->list())
      if (t.image == name) who.push_back("template:" + t.key);
  }
  if (impl_->snaps) {
    for (const auto& s : impl_->snaps->store().list())
      if (s.image == name) who.push_back("snapshot:" + s.name);
  }
  return who;
}

nlohmann::json Engine::list_images() {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& img : impl_->images.list()) {
    auto j = storage::to_json(img);
    j["used_by"] = image_users(img.name);
    out.push_back(j);
  }
  return out;
}

nlohmann::json Engine::inspect_image(const std::string& name) {
  std::optional<storage::Image> img;
  try {
    img = impl_->images.find(name);
  } catch (const Error& e) {
    if (e.code() != Errc::not_found) throw;
  }
  if (!img) throw Error(Errc::not_found, "no image '" + name + "'", "name");
  auto j = storage::to_json(*img);
  j["used_by"] = image_users(name);
  j["versions"] = nlohmann::json::array();
  for (const auto& v : impl_->images.versions(name)) j["versions"].push_back(v.filename().string());
  return j;
}

nlohmann::json Engine::import_image(const std::string& name, const fs::path& archive,
                                    bool replace) {
  storage::check_image_name(name, "name");
  if (!replace) {
    std::optional<storage::Image> existing;
    try {
      existing = impl_->images.find(name);
    } catch (const Error&) {
    }
    if (existing)
      throw Error(Errc::conflict, "image '" + name + "' already exists (remove it first)", "name");
  }
  auto img = storage::import_oci(impl_->images, name, archive, {}, replace);
  auto j = storage::to_json(img);
  j["used_by"] = nlohmann::json::array();
  return j;
}

void Engine::remove_image(const std::string& name) {
  impl_->reclaimer.settle_all();  // a sandbox deleted just before is no user any more
  auto who = image_users(name);
  if (!who.empty()) {
    std::string list;
    for (const auto& w : who) list += (list.empty() ? "" : ", ") + w;
    throw Error(Errc::conflict, "image '" + name + "' is in use by " + list, "name");
  }
  impl_->images.remove(name);
}

nlohmann::json Engine::disk_usage() {
  auto& impl = *impl_;
  uint64_t images = 0;
  for (const auto& n : impl.images.names_on_disk()) images += du(impl.images.dir() / n);
  uint64_t overlays = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(impl.cfg.data_dir / "sandboxes", ec))
    overlays += du(e.path());
  fs::path tdir =
      impl.cfg.template_dir.empty() ? impl.cfg.data_dir / "templates" : impl.cfg.template_dir;
  nlohmann::json j = {
      {"images", images},
      {"layers", du(impl.images.dir() / "cache")},
      {"snapshots", du(impl.cfg.data_dir / "snapshots")},
      {"templates", du(tdir)},
      {"overlays", overlays},
      {"journals", du(impl.cfg.data_dir / "audit")},
  };
  uint64_t total = 0;
  for (const auto& [k, v] : j.items()) total += v.get<uint64_t>();
  j["total"] = total;
  return nlohmann::json{{"bytes", j}};
}

nlohmann::json Engine::prune(bool dry_run) {
  auto& impl = *impl_;
  impl.reclaimer.settle_all();  // what deleted sandboxes held is freed with them
  // Image directories whose rootfs backs a live sandbox's overlay or a
  // template's disk: kept even when they are no longer current.
  std::vector<fs::path> in_use;
  auto note = [&](const fs::path& disk) {
    std::string b = qcow2_backing(disk);
    if (!b.empty()) in_use.push_back(fs::path(b).parent_path());
  };
  for (const auto& rec : impl.registry.list(/*all=*/false)) note(rec.run_dir / "disk.qcow2");
  // A snapshot's layer is backed by its parent's layer, its own base.qcow2
  // (a clone's frozen template disk) or an image version: that version stays.
  if (impl.snaps)
    for (const auto& s : impl.snaps->store().list()) note(s.layer());
  nlohmann::json removed = nlohmann::json::array();
  uint64_t freed = 0;
  // Templates no live sandbox was cloned from (a clone's overlay is backed
  // by its template's disk) go: they are rebuilt on demand, and otherwise
  // keep their image in use for ever (image rm names them).
  if (auto* store = impl.templates.store()) {
    for (const auto& t : store->list()) {
      if (std::find(in_use.begin(), in_use.end(), t.dir) != in_use.end()) {
        note(t.disk);
        continue;
      }
      std::error_code ec;
      uint64_t ram = fs::file_size(t.ram, ec);
      freed += du(t.dir) + (ec ? 0 : ram);
      removed.push_back("template:" + t.key);
      if (!dry_run) store->remove(t.key);
    }
  }
  for (const auto& n : impl.images.names_on_disk()) {
    std::vector<fs::path> gone;
    freed += impl.images.prune_versions(n, in_use, dry_run, &gone);
    for (const auto& g : gone) removed.push_back("image:" + n + "/" + g.filename().string());
  }
  // Leftovers of interrupted imports and removals, and cached root
  // filesystems no image links to any more (hard links: nlink 1).
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(impl.images.dir(), ec)) {
    std::string f = e.path().filename().string();
    if (f.rfind(".trash-", 0) != 0 && f.rfind(".tmp-import-", 0) != 0) continue;
    freed += du(e.path());
    removed.push_back("leftover:" + f);
    if (!dry_run) fs::remove_all(e.path(), ec);
  }
  for (const auto& e : fs::directory_iterator(impl.images.dir() / "cache" / "rootfs", ec)) {
    struct stat st;
    fs::path r = e.path() / "rootfs.ext4";
    if (::lstat(r.c_str(), &st) != 0 || st.st_nlink != 1) continue;
    freed += du(e.path());
    removed.push_back("layer:" + e.path().filename().string());
    if (!dry_run) {
      ::chmod(e.path().c_str(), 0755);
      fs::remove_all(e.path(), ec);
    }
  }
  // The recipe layer cache (installed images are flattened: none needs it).
  std::vector<std::string> layers;
  std::optional<uint64_t> layer_bytes = storage::prune_layers(impl.cfg.image_dir, dry_run, layers);
  freed += layer_bytes.value_or(0);
  for (auto& l : layers) removed.push_back(std::move(l));
  nlohmann::json out = {{"dry_run", dry_run}, {"freed_bytes", freed}, {"removed", removed}};
  if (!layer_bytes) out["kept"] = "the build cache: an image build is running";
  return out;
}

}  // namespace airlock::engine

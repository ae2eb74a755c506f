// ImageStore::install and the management of installed images (versions,
// remove, prune). Layout of an installed image:
//   <image_dir>/<name>/current -> <key>   (symlink, switched atomically)
//   <image_dir>/<name>/<key>/{vmlinuz,initrd.img,rootfs.ext4,image.json}
// <key> is "i" + 15 hex digits of randomness and time: a re-install makes a
// new version beside the old one, which stays for the sandboxes that run it
// (their overlays name its rootfs.ext4 as backing file) until prune.
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>

#include "common/error.h"
#include "common/subprocess.h"
#include "engine/confine/confine.h"
#include "engine/storage/fs_util.h"
#include "engine/storage/image_name.h"
#include "engine/storage/image_store.h"

namespace airlock::storage {
namespace fs = std::filesystem;
using namespace std::chrono_literals;
using namespace detail;

namespace {

constexpr size_t kMaxConfigString = 4096;
constexpr size_t kMaxConfigItems = 1024;

void check_string(const std::string& s, const std::string& field) {
  if (s.size() > kMaxConfigString || s.find('\0') != std::string::npos)
    throw Error(
        Errc::invalid_argument,
        field + " must be at most " + std::to_string(kMaxConfigString) + " bytes without NUL",
        field);
}

std::vector<std::string> string_list(const nlohmann::json& j, const std::string& field) {
  if (j.is_null()) return {};
  if (!j.is_array() || j.size() > kMaxConfigItems)
    throw Error(Errc::invalid_argument, field + " must be a list of strings", field);
  std::vector<std::string> out;
  for (size_t i = 0; i < j.size(); ++i) {
    std::string f = field + "[" + std::to_string(i) + "]";
    if (!j[i].is_string()) throw Error(Errc::invalid_argument, f + " must be a string", f);
    out.push_back(j[i].get<std::string>());
    check_string(out.back(), f);
  }
  return out;
}

std::map<std::string, std::string> string_map(const nlohmann::json& j, const std::string& field) {
  if (j.is_null()) return {};
  if (!j.is_object() || j.size() > kMaxConfigItems)
    throw Error(Errc::invalid_argument, field + " must be an object of strings", field);
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : j.items()) {
    std::string f = field + "." + k;
    if (!v.is_string()) throw Error(Errc::invalid_argument, f + " must be a string", f);
    check_string(k, f);
    check_string(v.get<std::string>(), f);
    out[k] = v.get<std::string>();
  }
  return out;
}

// A random version key: "i" + 15 hex digits.
std::string new_key() {
  unsigned char b[8] = {};
  if (::getrandom(b, sizeof b, 0) != sizeof b) throw_errno("getrandom");
  char hex[17];
  for (int i = 0; i < 8; ++i) std::snprintf(hex + 2 * i, 3, "%02x", b[i]);
  return "i" + std::string(hex, 15);
}

// Mount points and files the initramfs and the agent rely on (see
// images/common.sh): created if missing; a symlink or file in their place
// (an image may ship /run -> /var/run) is replaced, since /init mounts on it.
void add_mount_points(const fs::path& root) {
  for (const char* d : {"proc", "sys", "dev", "run", "tmp", "etc", "root"}) {
    fs::path p = root / d;
    std::error_code ec;
    auto st = fs::symlink_status(p, ec);
    if (fs::exists(st) && !fs::is_directory(st)) fs::remove(p);
    if (!fs::exists(fs::symlink_status(p, ec))) {
      fs::create_directory(p);
      ::chmod(p.c_str(), std::string(d) == "tmp" ? 01777 : std::string(d) == "root" ? 0700 : 0755);
    }
  }
}

// Packs `dir` into a sparse ext4 image of the tree's size + 20% + 64 MiB
// headroom (rounded up to 64 MiB, at least 128 MiB) with enough inodes.
void mkfs_from_dir(const fs::path& dir, const fs::path& img) {
  uint64_t used = 0, entries = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    struct stat st;
    ++entries;
    if (::lstat(it->path().c_str(), &st) == 0 && !S_ISDIR(st.st_mode))
      used += static_cast<uint64_t>(st.st_blocks) * 512;
  }
  if (ec) throw Error(Errc::internal, "cannot walk " + dir.string() + ": " + ec.message());
  uint64_t mb = used * 12 / 10 / (1 << 20) + entries * 4096 / (1 << 20) + 64;
  mb = std::max<uint64_t>((mb + 63) / 64 * 64, 128);
  uint64_t inodes = entries + entries / 5 + 4096;
  SubprocessOptions o;
  o.timeout = 30min;
  o.env = {{"LC_ALL", "C"}};
  auto r = run_command({"mkfs.ext4", "-q", "-F", "-L", "airlock-root", "-m", "0", "-N",
                        std::to_string(inodes), "-E", "lazy_itable_init=0,lazy_journal_init=0",
                        "-d", dir.string(), img.string(), std::to_string(mb) + "M"},
                       o);
  if (!r.ok()) throw Error(Errc::internal, "mkfs.ext4 -d " + dir.string() + ": " + r.describe());
}

// e2fsck parses a filesystem someone else wrote (an upload, a guest's
// snapshot): it runs confined (confine.h), given the file read-only, with
// a scratch directory under `scratch_parent`.
void check_ext4(const fs::path& img, const fs::path& scratch_parent) {
  engine::confine::Scratch scratch(scratch_parent);
  engine::confine::Limits lim;
  lim.timeout = 10min;
  lim.file_bytes = 0;  // -n: it writes nothing
  auto r = engine::confine::run(scratch.exec({"e2fsck", "-fn", scratch.give(img)}, "e2fsck", lim));
  if (!r.ok())
    throw Error(Errc::invalid_argument,
                "rootfs " + img.string() + " is not a clean ext4 file system: " + r.describe(),
                "rootfs");
}

}  // namespace

nlohmann::json to_json(const ImageConfig& c) {
  return {{"env", c.env}, {"workdir", c.workdir}, {"user", c.user}, {"entrypoint", c.entrypoint},
          {"cmd", c.cmd}, {"warmup", c.warmup},   {"base", c.base}, {"labels", c.labels}};
}

ImageConfig image_config_from_json(const nlohmann::json& j, const std::string& field) {
  if (!j.is_object()) throw Error(Errc::invalid_argument, field + " must be an object", field);
  static const char* known[] = {"env", "workdir", "user", "entrypoint",
                                "cmd", "warmup",  "base", "labels"};
  for (const auto& [k, v] : j.items()) {
    if (std::find_if(std::begin(known), std::end(known), [&](const char* n) { return k == n; }) ==
        std::end(known))
      throw Error(Errc::invalid_argument, "unknown field " + field + "." + k, field + "." + k);
  }
  auto str = [&](const char* k) {
    if (!j.contains(k) || j.at(k).is_null()) return std::string();
    if (!j.at(k).is_string())
      throw Error(Errc::invalid_argument, field + "." + k + " must be a string", field + "." + k);
    std::string v = j.at(k).get<std::string>();
    check_string(v, field + "." + k);
    return v;
  };
  auto at = [&](const char* k) { return j.contains(k) ? j.at(k) : nlohmann::json(); };
  ImageConfig c;
  c.env = string_map(at("env"), field + ".env");
  c.workdir = str("workdir");
  if (!c.workdir.empty() && c.workdir[0] != '/')
    throw Error(Errc::invalid_argument, field + ".workdir must be an absolute path",
                field + ".workdir");
  c.user = str("user");
  if (c.user.size() > 64)
    throw Error(Errc::invalid_argument, field + ".user is longer than 64 bytes", field + ".user");
  c.entrypoint = string_list(at("entrypoint"), field + ".entrypoint");
  c.cmd = string_list(at("cmd"), field + ".cmd");
  c.warmup = string_list(at("warmup"), field + ".warmup");
  c.base = str("base");
  c.labels = string_map(at("labels"), field + ".labels");
  return c;
}

nlohmann::json to_json(const Image& img) {
  nlohmann::json j = {{"name", img.name},
                      {"kind", img.kind},
                      {"version", img.key},
                      {"source", img.source},
                      {"layers", img.layers},
                      {"size_bytes", img.disk_bytes},
                      {"rootfs_bytes", img.rootfs_bytes},
                      {"created_at", img.built_at},
                      {"kernel_release", img.kernel_release},
                      {"config", to_json(img.config)}};
  if (!img.tenant.empty()) j["tenant"] = img.tenant;
  return j;
}

bool ImageStore::is_recipe(const std::string& name) const {
  auto r = recipes();
  return std::find(r.begin(), r.end(), name) != r.end();
}

std::optional<Image> ImageStore::find_installed(const std::string& name) const {
  std::error_code ec;
  fs::path cur = image_dir_ / name / "current";
  fs::path key = fs::read_symlink(cur, ec);
  if (ec || key.has_parent_path() || !is_image_name(key.string())) return std::nullopt;
  return load(name, key.string());
}

std::vector<std::string> ImageStore::names_on_disk() const {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(image_dir_, ec)) {
    std::string n = e.path().filename().string();
    if (n != "cache" && is_image_name(n) && e.is_directory(ec) && !e.is_symlink(ec))
      out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<fs::path> ImageStore::versions(const std::string& name) const {
  std::vector<fs::path> out;
  if (!is_image_name(name)) return out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(image_dir_ / name, ec)) {
    std::string n = e.path().filename().string();
    if (n[0] != '.' && n != "current" && e.is_directory(ec) && !e.is_symlink(ec) &&
        fs::exists(e.path() / "image.json", ec))
      out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

Image ImageStore::install(const std::string& name, const fs::path& rootfs,
                          const ImageConfig& config, const InstallInfo& info,
                          const ProgressFn& progress) {
  check_image_name(name, "name");
  if (is_recipe(name))
    throw Error(Errc::conflict, "'" + name + "' is a built-in image recipe; choose another name",
                "name");
  // GET|DELETE /v1/images/build could not reach it (POST there builds).
  if (name == "build")
    throw Error(Errc::invalid_argument, "image name 'build' is reserved (the API's build route)",
                "name");
  // Round-trip through the checker: a config built in code obeys the same
  // rules as one sent over the API.
  ImageConfig cfg = image_config_from_json(to_json(config));
  std::error_code ec;
  auto st = fs::status(rootfs, ec);
  bool is_dir = fs::is_directory(st);
  if (!is_dir && !fs::is_regular_file(st))
    throw Error(Errc::invalid_argument,
                "rootfs " + rootfs.string() + " is neither an ext4 file nor a directory", "rootfs");

  fs::path name_dir = image_dir_ / name;
  fs::create_directories(name_dir);
  FileLock lock(name_dir / ".lock");
  if (!info.replace && find_installed(name))
    throw Error(Errc::conflict, "image '" + name + "' already exists (remove it first)", "name");
  for (const auto& e : fs::directory_iterator(name_dir)) {  // leftovers of killed installs
    if (e.path().filename().string().rfind(".tmp-", 0) == 0) remove_tree(e.path());
  }

  KernelRef kernel = current_kernel();
  fs::path kdir = ensure_kernel(kernel, progress);
  TempDir tmp(name_dir, "");
  if (is_dir) {
    if (progress) progress(BuildProgress{"mkfs.ext4", 0});
    add_mount_points(rootfs);
    mkfs_from_dir(rootfs, tmp.path() / "rootfs.ext4");
  } else {
    if (progress) progress(BuildProgress{"rootfs", 0});
    check_ext4(rootfs, tmp.path());
    link_or_copy(rootfs, tmp.path() / "rootfs.ext4");
  }
  pack_initramfs(name, tmp.path(), kdir, progress);
  link_or_copy(kdir / "vmlinuz", tmp.path() / "vmlinuz");
  std::string release = read_file(kdir / "release");
  std::string key = new_key();
  nlohmann::json j = {
      {"name", name},
      {"key", key},
      {"kind", "installed"},
      {"source", info.source},
      {"layers", info.layers},
      {"config", to_json(cfg)},
      {"kernel_package", kernel.package},
      {"kernel_version", kernel.version},
      {"kernel_release", release.substr(0, release.find('\n'))},
      {"initrd_compression", initrd_compression()},
      {"built_at", static_cast<std::int64_t>(std::time(nullptr))},
  };
  if (!info.tenant.empty()) j["tenant"] = info.tenant;
  write_file(tmp.path() / "image.json", j.dump(2) + "\n");
  if (progress) progress(BuildProgress{"finish", disk_usage(tmp.path())});
  make_read_only(tmp.path());
  tmp.commit(name_dir / key);
  // Switch `current`: a new symlink renamed over the old one is atomic.
  fs::path next = name_dir / ".current.new";
  fs::remove(next, ec);
  fs::create_symlink(key, next);
  fs::rename(next, name_dir / "current");
  auto img = load(name, key);
  if (!img) throw Error(Errc::internal, "image " + name + " vanished right after it was installed");
  return *img;
}

void ImageStore::remove(const std::string& name) {
  check_image_name(name, "name");
  fs::path name_dir = image_dir_ / name;
  std::error_code ec;
  if (!fs::is_directory(name_dir, ec) || versions(name).empty())
    throw Error(Errc::not_found, "no image '" + name + "'", "name");
  {
    FileLock lock(name_dir / ".lock");
    // Out of sight first (one rename), then deleted: a crash in between
    // leaves a .trash-* directory, never a half-deleted image.
    fs::path trash = image_dir_ / (".trash-" + name + "-" + new_key());
    fs::rename(name_dir, trash);
    remove_tree(trash);
  }
}

uint64_t ImageStore::prune_versions(const std::string& name, const std::vector<fs::path>& in_use,
                                    bool dry_run, std::vector<fs::path>* removed) {
  uint64_t freed = 0;
  std::string current;
  if (auto cur = find(name)) current = cur->key;
  for (const auto& v : versions(name)) {
    if (v.filename() == current) continue;
    if (std::find(in_use.begin(), in_use.end(), v) != in_use.end()) continue;
    freed += disk_usage(v);
    if (removed) removed->push_back(v);
    if (!dry_run) remove_tree(v);
  }
  return freed;
}

}  // namespace airlock::storage

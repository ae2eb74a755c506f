#include "engine/storage/image_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <ctime>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.h"
#include "common/subprocess.h"
#include "engine/storage/digest.h"
#include "engine/storage/fs_util.h"
#include "engine/storage/image_name.h"

namespace airlock::storage {
namespace fs = std::filesystem;
using namespace std::chrono_literals;
using namespace detail;

namespace {

// Bump when the layout or the meaning of the inputs changes: every image key
// changes with it.
constexpr const char* kFormat = "airlock-image-format-1";
constexpr const char* kKernelMeta = "linux-image-cloud-amd64";
// Helper scripts in the recipe folder that are not recipes themselves.
constexpr const char* kRecipeMarker = "# airlock-recipe:";

}  // namespace

namespace {

// The kernel package the meta package currently points to, per apt's view of
// the host's package lists.
std::optional<KernelRef> resolve_kernel_from_apt(std::string* why) {
  SubprocessOptions o;
  o.timeout = 60s;
  o.env = {{"LC_ALL", "C"}};
  SubprocessResult pol;
  try {
    pol = run_command({"apt-cache", "policy", kKernelMeta}, o);
  } catch (const Error& e) {
    *why = e.what();
    return std::nullopt;
  }
  std::string candidate;
  std::istringstream in(pol.out);
  for (std::string line; std::getline(in, line);) {
    auto pos = line.find("Candidate:");
    if (pos != std::string::npos) {
      std::istringstream ls(line.substr(pos + 10));
      ls >> candidate;
      break;
    }
  }
  if (candidate.empty() || candidate == "(none)") {
    *why = "apt knows no candidate version of " + std::string(kKernelMeta) +
           " (package lists missing? run apt-get update)";
    return std::nullopt;
  }
  auto show = run_command({"apt-cache", "show", std::string(kKernelMeta) + "=" + candidate}, o);
  std::istringstream sin(show.out);
  for (std::string line; std::getline(sin, line);) {
    if (line.rfind("Depends:", 0) != 0) continue;
    // "Depends: linux-image-6.1.0-57-cloud-amd64 (= 6.1.192-3)"
    std::istringstream ls(line.substr(8));
    std::string dep;
    while (ls >> dep) {
      if (dep.back() == ',') dep.pop_back();
      if (dep.rfind("linux-image-", 0) == 0) {
        std::string rest, ver;
        std::getline(ls, rest);
        auto eq = rest.find("(=");
        if (eq != std::string::npos) {
          std::istringstream vs(rest.substr(eq + 2));
          vs >> ver;
          if (!ver.empty() && ver.back() == ')') ver.pop_back();
        }
        return KernelRef{dep, ver.empty() ? candidate : ver};
      }
    }
  }
  *why = "cannot find the kernel package " + std::string(kKernelMeta) + " " + candidate +
         " depends on in `apt-cache show`";
  return std::nullopt;
}

// Changes whenever apt's answer about the kernel package could change.
std::string apt_state_stamp() {
  std::int64_t newest = 0;
  std::uint64_t count = 0;
  std::error_code ec;
  auto note = [&](const fs::path& p) {
    struct stat st;
    if (::stat(p.c_str(), &st) != 0) return;
    newest =
        std::max<std::int64_t>(newest, st.st_mtim.tv_sec * 1'000'000'000LL + st.st_mtim.tv_nsec);
    count += static_cast<std::uint64_t>(st.st_size) + 1;
  };
  for (const char* d :
       {"/var/lib/apt/lists", "/etc/apt/sources.list.d", "/etc/apt/preferences.d"}) {
    note(d);
    for (const auto& e : fs::directory_iterator(d, ec)) note(e.path());
  }
  note("/etc/apt/sources.list");
  note("/etc/apt/preferences");
  return std::to_string(newest) + "-" + std::to_string(count);
}

}  // namespace

// Memos of what every create looks up (the image, the recipe list): each
// answer is kept with a stamp of the files it was read from, and re-read
// when a stamp changes. A pool hand-out's whole budget is ~2 ms; reading
// the recipes, image.json and walking the image directory took ~0.3 ms of
// it (0.6 ms under load).
struct ImageStore::KernelCache {
  std::mutex mu;
  std::optional<KernelRef> kernel;
  std::chrono::steady_clock::time_point checked{};
  // keys_for's answers by image name, with the stamp of their inputs
  // (keys_mu; see keys_for).
  std::mutex keys_mu;
  std::map<std::string, std::pair<std::string, Keys>> keys;
  // load's answers by image directory, and recipes' answer (memo_mu).
  std::mutex memo_mu;
  std::map<fs::path, std::pair<std::string, Image>> loaded;
  std::string recipes_stamp;
  std::vector<std::string> recipes;
};

namespace {

// Identity of a file's current contents for the memos: device, inode,
// size and mtime in ns (a rewrite or a rename over it changes one of them).
// "-" if it cannot be stat'ed (keys_for then reports what is missing).
std::string file_stamp(const fs::path& p) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return "-";
  return std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) + ":" +
         std::to_string(st.st_size) + ":" + std::to_string(st.st_mtim.tv_sec) + "." +
         std::to_string(st.st_mtim.tv_nsec);
}

}  // namespace

ImageStore::ImageStore(fs::path image_dir, fs::path recipe_dir, fs::path guest_agent)
    : image_dir_(std::move(image_dir)),
      recipe_dir_(std::move(recipe_dir)),
      guest_agent_(std::move(guest_agent)),
      kernel_cache_(std::make_shared<KernelCache>()) {}

fs::path ImageStore::kernel_cache_dir() const { return image_dir_ / "cache" / "kernel"; }
fs::path ImageStore::rootfs_cache_dir() const { return image_dir_ / "cache" / "rootfs"; }

std::vector<std::string> ImageStore::recipes() const {
  // The stamp: the directory's and every *.sh file's (a file rewritten in
  // place changes its own stamp, not the directory's).
  std::error_code ec;
  std::vector<fs::path> scripts;
  for (const auto& e : fs::directory_iterator(recipe_dir_, ec))
    if (e.path().extension() == ".sh") scripts.push_back(e.path());
  std::sort(scripts.begin(), scripts.end());
  std::string stamp = file_stamp(recipe_dir_);
  for (const auto& p : scripts) stamp += " " + p.filename().string() + "=" + file_stamp(p);
  {
    std::lock_guard lock(kernel_cache_->memo_mu);
    if (kernel_cache_->recipes_stamp == stamp) return kernel_cache_->recipes;
  }
  std::vector<std::string> names;
  for (const auto& p : scripts) {
    std::string name = p.stem().string();
    if (!is_image_name(name)) continue;
    std::ifstream in(p);
    std::string l1, l2;
    std::getline(in, l1);
    std::getline(in, l2);
    if (l2.rfind(kRecipeMarker, 0) == 0) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  std::lock_guard lock(kernel_cache_->memo_mu);
  kernel_cache_->recipes_stamp = stamp;
  kernel_cache_->recipes = names;
  return names;
}

void ImageStore::check_recipe(const std::string& name) const {
  check_image_name(name, "image");
  auto r = recipes();
  if (std::find(r.begin(), r.end(), name) == r.end()) {
    std::string known;
    for (const auto& n : r) known += (known.empty() ? "" : ", ") + n;
    throw Error(
        Errc::not_found,
        "no image recipe '" + name + "' in " + recipe_dir_.string() + " (known: " + known + ")",
        "image");
  }
}

KernelRef ImageStore::current_kernel() const {
  std::lock_guard lock(kernel_cache_->mu);
  auto now = std::chrono::steady_clock::now();
  if (kernel_cache_->kernel && now - kernel_cache_->checked < 5min) return *kernel_cache_->kernel;
  // apt-cache takes seconds here (no pkgcache.bin), so its answer is kept in
  // the cache directory together with a stamp of apt's inputs (package lists,
  // sources, pins): it is re-asked only when those change.
  std::string stamp = apt_state_stamp();
  fs::path choice = kernel_cache_dir().parent_path() / "kernel-choice";
  std::optional<KernelRef> k;
  std::string why;
  {
    std::ifstream in(choice);
    std::string st, pkg, ver;
    if (in >> st >> pkg >> ver && st == stamp) k = KernelRef{pkg, ver};
  }
  if (!k) {
    k = resolve_kernel_from_apt(&why);
    if (k) {
      std::error_code ec;
      fs::create_directories(choice.parent_path(), ec);
      fs::path tmp = choice.string() + ".tmp" + std::to_string(::getpid());
      write_file(tmp, stamp + " " + k->package + " " + k->version + "\n");
      fs::rename(tmp, choice, ec);
    }
  }
  if (!k) {
    // Offline or no package lists: keep using the newest kernel already
    // unpacked, rather than refusing to work.
    std::error_code ec;
    fs::file_time_type best{};
    for (const auto& e : fs::directory_iterator(kernel_cache_dir(), ec)) {
      std::string n = e.path().filename().string();
      auto us = n.find('_');
      if (n[0] == '.' || us == std::string::npos || !fs::exists(e.path() / "release")) continue;
      auto t = fs::last_write_time(e.path(), ec);
      if (!k || t > best) {
        k = KernelRef{n.substr(0, us), n.substr(us + 1)};
        best = t;
      }
    }
    if (!k) throw Error(Errc::unavailable, "cannot choose a guest kernel: " + why);
  }
  kernel_cache_->kernel = *k;
  kernel_cache_->checked = now;
  return *k;
}

std::string ImageStore::initrd_compression() {
  const char* c = std::getenv("AIRLOCK_INITRD_COMPRESS");
  std::string v = c ? c : "";
  if (v == "gzip" || v == "none") return v;
  return "none";  // measured: see images/README.md
}

ImageStore::Keys ImageStore::keys_for(const std::string& name, const KernelRef& kernel) const {
  // Every create looks its image up, and hashing the inputs (the guest agent
  // is megabytes) took most of a pool hand-out's time: the answer is kept
  // while no input file changed (stat only, microseconds).
  std::string stamp = kernel.package + " " + kernel.version + " " + initrd_compression();
  for (const auto& f :
       {recipe_dir_ / "common.sh", recipe_dir_ / (name + ".sh"), recipe_dir_ / "kernel.sh",
        recipe_dir_ / "initramfs.sh", recipe_dir_ / "init.sh", guest_agent_})
    stamp += " " + file_stamp(f);
  {
    std::lock_guard lock(kernel_cache_->keys_mu);
    auto it = kernel_cache_->keys.find(name);
    if (it != kernel_cache_->keys.end() && it->second.first == stamp) return it->second.second;
  }
  Keys k = compute_keys(name, kernel);
  std::lock_guard lock(kernel_cache_->keys_mu);
  kernel_cache_->keys[name] = {stamp, k};
  return k;
}

ImageStore::Keys ImageStore::compute_keys(const std::string& name, const KernelRef& kernel) const {
  Keys k;
  k.rootfs = sha256_hex({kFormat, "rootfs", name, read_file(recipe_dir_ / "common.sh"),
                         read_file(recipe_dir_ / (name + ".sh"))})
                 .substr(0, 16);
  if (!fs::is_regular_file(guest_agent_))
    throw Error(Errc::unavailable, "guest agent binary " + guest_agent_.string() +
                                       " not found (build the airlock-guest target)");
  k.image = sha256_hex({kFormat, "image", k.rootfs, kernel.package, kernel.version,
                        read_file(recipe_dir_ / "kernel.sh"),
                        read_file(recipe_dir_ / "initramfs.sh"), read_file(recipe_dir_ / "init.sh"),
                        initrd_compression(), sha256_hex({read_file(guest_agent_)})})
                .substr(0, 16);
  return k;
}

std::optional<Image> ImageStore::load(const std::string& name, const std::string& key) const {
  fs::path dir = image_dir_ / name / key;
  std::error_code ec;
  if (!fs::is_regular_file(dir / "image.json", ec)) return std::nullopt;
  // An installed version's files do not change (installs rename a whole new
  // directory into place), but a stamp of what is read keeps the memo honest.
  std::string stamp = file_stamp(dir) + " " + file_stamp(dir / "image.json") + " " +
                      file_stamp(dir / "rootfs.ext4");
  {
    std::lock_guard lock(kernel_cache_->memo_mu);
    auto it = kernel_cache_->loaded.find(dir);
    if (it != kernel_cache_->loaded.end() && it->second.first == stamp) return it->second.second;
  }
  auto img = read_image(name, key, dir);
  std::lock_guard lock(kernel_cache_->memo_mu);
  if (img)
    kernel_cache_->loaded[dir] = {stamp, *img};
  else
    kernel_cache_->loaded.erase(dir);
  return img;
}

std::optional<Image> ImageStore::read_image(const std::string& name, const std::string& key,
                                            const fs::path& dir) const {
  try {
    auto j = nlohmann::json::parse(read_file(dir / "image.json"));
    Image img;
    img.name = name;
    img.key = key;
    img.dir = dir;
    img.kernel = dir / "vmlinuz";
    img.initrd = dir / "initrd.img";
    img.rootfs = dir / "rootfs.ext4";
    img.kernel_release = j.at("kernel_release").get<std::string>();
    img.rootfs_bytes = fs::file_size(img.rootfs);
    img.built_at = j.at("built_at").get<std::int64_t>();
    img.kind = j.value("kind", "recipe");
    img.source = j.value("source", "recipe:" + name + ".sh");
    img.layers = j.value("layers", 1);
    img.tenant = j.value("tenant", "");
    if (j.contains("config")) img.config = image_config_from_json(j.at("config"));
    // The built-in recipes' declared warm-up (images/*.sh build only the
    // disk): commands templates run before they are saved and pool members
    // before they are ready, so their files sit in the page cache and their
    // code in the translation cache. Not part of the image key (the disk is
    // the same); the template key includes it (engine_templates.cc).
    if (img.kind == "recipe" && !j.contains("config") && name == "debian")
      img.config.warmup = {"python3 -c pass"};
    img.disk_bytes = disk_usage(dir);
    return img;
  } catch (const std::exception&) {
    return std::nullopt;  // half-written or foreign: not a current image
  }
}

std::optional<Image> ImageStore::find(const std::string& name) const {
  if (is_image_name(name) && !is_recipe(name)) return find_installed(name);
  check_recipe(name);
  try {
    return load(name, keys_for(name, current_kernel()).image);
  } catch (const Error& e) {
    if (e.code() == Errc::unavailable) return std::nullopt;  // no agent / no kernel yet
    throw;
  }
}

std::vector<Image> ImageStore::list() const {
  std::vector<Image> out;
  for (const auto& n : recipes()) {
    if (auto img = find(n)) out.push_back(*img);
  }
  for (const auto& n : names_on_disk()) {
    if (is_recipe(n)) continue;
    if (auto img = find_installed(n)) out.push_back(*img);
  }
  return out;
}

uint64_t allocated_bytes(const fs::path& dir) { return disk_usage(dir); }

void ImageStore::pack_initramfs(const std::string& name, const fs::path& dir, const fs::path& kdir,
                                const ProgressFn& progress) const {
  fs::path work = dir / ".work";
  fs::create_directories(work);
  run_script("initramfs for " + name, recipe_dir_ / "initramfs.sh", dir, work,
             {{"AIRLOCK_KERNEL_DIR", kdir.string()},
              {"AIRLOCK_GUEST_AGENT", guest_agent_.string()},
              {"AIRLOCK_INITRD_COMPRESS", initrd_compression()}},
             10min, progress);
  remove_tree(work);
}

void ImageStore::run_script(const std::string& what, const fs::path& script,
                            const fs::path& out_dir, const fs::path& work,
                            std::vector<std::pair<std::string, std::string>> env,
                            std::chrono::minutes timeout, const ProgressFn& progress) const {
  std::string step = what;
  std::deque<std::string> tail;
  auto report = [&] {
    // The temporary directory holding both the output and the scratch area.
    if (progress) progress(BuildProgress{step, disk_usage(work.parent_path())});
  };
  SubprocessOptions o;
  o.timeout = timeout;
  o.env = std::move(env);
  o.env.emplace_back("AIRLOCK_RECIPE_DIR", recipe_dir_.string());
  o.env.emplace_back("AIRLOCK_WORK", work.string());
  o.env.emplace_back("LC_ALL", "C");
  o.max_output = 64 * 1024;
  o.on_line = [&](OutputStream, std::string_view line) {
    if (line.rfind("@@step ", 0) == 0) {
      step = std::string(line.substr(7));
      report();
      return;
    }
    tail.emplace_back(line);
    if (tail.size() > 20) tail.pop_front();
  };
  o.on_tick = report;
  report();
  auto r = run_command({"sh", script.string(), out_dir.string()}, o);
  if (!r.ok()) {
    std::string msg = "building " + what + ": step '" + step + "' failed (" +
                      (r.timed_out ? "timed out after " + std::to_string(timeout.count()) + " min"
                       : r.term_signal ? "killed by signal " + std::to_string(r.term_signal)
                                       : "exit status " + std::to_string(r.exit_code)) +
                      ")";
    if (!tail.empty()) {
      msg += "; last output:";
      for (const auto& l : tail) msg += "\n  " + l;
    }
    throw Error(r.timed_out ? Errc::timeout : Errc::internal, msg);
  }
}

fs::path ImageStore::ensure_kernel(const KernelRef& k, const ProgressFn& progress) const {
  fs::path cache = kernel_cache_dir();
  fs::create_directories(cache);
  fs::path dir = cache / k.dir_name();
  if (fs::exists(dir / "release")) return dir;
  FileLock lock(cache / ".lock");
  if (fs::exists(dir / "release")) return dir;
  for (const auto& e : fs::directory_iterator(cache)) {  // leftovers of killed builds
    if (e.path().filename().string().rfind(".tmp-", 0) == 0) remove_tree(e.path());
  }
  TempDir tmp(cache, "kernel-");
  fs::create_directories(tmp.path() / "out");
  fs::create_directories(tmp.path() / "work");
  run_script("kernel " + k.package, recipe_dir_ / "kernel.sh", tmp.path() / "out",
             tmp.path() / "work",
             {{"AIRLOCK_KERNEL_PACKAGE", k.package}, {"AIRLOCK_KERNEL_VERSION", k.version}}, 20min,
             progress);
  fs::remove_all(tmp.path() / "work");
  fs::rename(tmp.path() / "out", dir);
  return dir;
}

fs::path ImageStore::ensure_rootfs(const std::string& name, const std::string& key,
                                   const ProgressFn& progress) const {
  fs::path cache = rootfs_cache_dir();
  fs::create_directories(cache);
  fs::path dir = cache / (name + "-" + key);
  if (fs::exists(dir / "rootfs.ext4")) return dir / "rootfs.ext4";
  // The caller holds the per-name lock: any temp dir of this name is stale.
  for (const auto& e : fs::directory_iterator(cache)) {
    if (e.path().filename().string().rfind(".tmp-" + name + "-", 0) == 0) remove_tree(e.path());
  }
  TempDir tmp(cache, name + "-");
  fs::create_directories(tmp.path() / "out");
  fs::create_directories(tmp.path() / "work");
  run_script("image " + name, recipe_dir_ / (name + ".sh"), tmp.path() / "out", tmp.path() / "work",
             {}, name == "minimal" ? 10min : 90min, progress);
  if (!fs::is_regular_file(tmp.path() / "out" / "rootfs.ext4"))
    throw Error(Errc::internal, "recipe " + name + " finished without writing rootfs.ext4");
  remove_tree(tmp.path() / "work");
  make_read_only(tmp.path() / "out");
  fs::rename(tmp.path() / "out", dir);
  // Older root filesystems of this name are no longer current; images that
  // still use one hold their own hard link to it, so removing is safe.
  for (const auto& e : fs::directory_iterator(cache)) {
    std::string n = e.path().filename().string();
    if (n.rfind(name + "-", 0) == 0 && e.path() != dir && n.size() == name.size() + 17)
      remove_tree(e.path());
  }
  return dir / "rootfs.ext4";
}

Image ImageStore::build(const std::string& name, const ProgressFn& progress) {
  check_recipe(name);
  KernelRef kernel = current_kernel();
  Keys keys = keys_for(name, kernel);
  if (auto img = load(name, keys.image)) return *img;

  fs::path name_dir = image_dir_ / name;
  fs::create_directories(name_dir);
  FileLock lock(name_dir / ".lock");
  if (auto img = load(name, keys.image)) return *img;  // built while we waited
  for (const auto& e : fs::directory_iterator(name_dir)) {
    if (e.path().filename().string().rfind(".tmp-", 0) == 0) remove_tree(e.path());
  }

  fs::path kdir = ensure_kernel(kernel, progress);
  fs::path rootfs = ensure_rootfs(name, keys.rootfs, progress);

  TempDir tmp(name_dir, "");
  pack_initramfs(name, tmp.path(), kdir, progress);
  if (progress) progress(BuildProgress{"finish", disk_usage(tmp.path())});
  link_or_copy(kdir / "vmlinuz", tmp.path() / "vmlinuz");
  link_or_copy(rootfs, tmp.path() / "rootfs.ext4");
  nlohmann::json j = {
      {"name", name},
      {"key", keys.image},
      {"rootfs_key", keys.rootfs},
      {"kernel_package", kernel.package},
      {"kernel_version", kernel.version},
      {"kernel_release",
       read_file(kdir / "release").substr(0, read_file(kdir / "release").find('\n'))},
      {"initrd_compression", initrd_compression()},
      {"built_at", static_cast<std::int64_t>(std::time(nullptr))},
      {"format", kFormat},
  };
  write_file(tmp.path() / "image.json", j.dump(2) + "\n");
  make_read_only(tmp.path());
  tmp.commit(name_dir / keys.image);
  auto img = load(name, keys.image);
  if (!img) throw Error(Errc::internal, "image " + name + " vanished right after it was built");
  return *img;
}

void create_overlay(const fs::path& base, const fs::path& overlay, uint64_t size_mb,
                    const std::string& base_format) {
  std::error_code ec;
  if (!fs::is_regular_file(base, ec))
    throw Error(Errc::not_found, "base image " + base.string() + " does not exist");
  uint64_t base_bytes = fs::file_size(base);
  uint64_t base_mb = (base_bytes + (1 << 20) - 1) >> 20;
  if (size_mb == 0 || size_mb > (uint64_t{1} << 30))
    throw Error(Errc::invalid_argument, "disk_mb " + std::to_string(size_mb) + " is out of range",
                "disk_mb");
  if (size_mb < base_mb)
    throw Error(Errc::invalid_argument,
                "disk_mb " + std::to_string(size_mb) + " is smaller than the image's " +
                    std::to_string(base_mb) + " MiB",
                "disk_mb");
  if (fs::exists(fs::symlink_status(overlay, ec)))
    throw Error(Errc::conflict, "overlay " + overlay.string() + " already exists");
  if (!fs::is_directory(overlay.parent_path(), ec))
    throw Error(Errc::not_found, "directory " + overlay.parent_path().string() + " does not exist");
  SubprocessOptions o;
  o.timeout = 60s;
  SubprocessResult r;
  try {
    // -u: the size is given, so the base is not opened (its own chain is
    // checked by whoever boots the overlay, storage/disk_chain.h).
    r = run_command({"qemu-img", "create", "-q", "-u", "-f", "qcow2", "-F", base_format, "-b",
                     fs::absolute(base).lexically_normal().string(), overlay.string(),
                     std::to_string(size_mb) + "M"},
                    o);
  } catch (...) {
    fs::remove(overlay, ec);
    throw;
  }
  if (!r.ok()) {
    fs::remove(overlay, ec);
    throw Error(Errc::internal, "creating overlay " + overlay.string() + ": " + r.describe());
  }
}

}  // namespace airlock::storage

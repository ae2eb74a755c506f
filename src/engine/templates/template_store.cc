#include "engine/templates/template_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "common/error.h"
#include "common/process.h"
#include "engine/storage/digest.h"
#include "engine/storage/image_store.h"
#include "engine/vmm/accel.h"
#include "engine/vmm/vm.h"

namespace airlock::templates {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Bumped when the layout or what a template holds changes: old ones are then
// simply never found again (and pruned).
constexpr int kFormat = 1;

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int64_t ns_of(const timespec& ts) { return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec; }

// {"size", "mtime_ns", "ctime_ns"} of `p`, or null if it cannot be stat'ed.
json file_stamp(const fs::path& p) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return nullptr;
  return {{"size", static_cast<uint64_t>(st.st_size)},
          {"mtime_ns", ns_of(st.st_mtim)},
          {"ctime_ns", ns_of(st.st_ctim)}};
}

std::string random_suffix() {
  static const char* hex = "0123456789abcdef";
  std::string s;
  unsigned char b[6];
  std::ifstream("/dev/urandom", std::ios::binary).read(reinterpret_cast<char*>(b), sizeof(b));
  for (unsigned char c : b) {
    s += hex[c >> 4];
    s += hex[c & 15];
  }
  return s;
}

void write_json_atomic(const fs::path& p, const json& j) {
  fs::path tmp = p;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << j.dump(2) << "\n";
    if (!out.flush()) throw Error(Errc::internal, "cannot write " + tmp.string());
  }
  std::error_code ec;
  fs::rename(tmp, p, ec);
  if (ec) throw Error(Errc::internal, "cannot write " + p.string() + ": " + ec.message());
}

}  // namespace

json to_json(const Shape& s) {
  return {{"cpus", s.cpus}, {"memory_mb", s.memory_mb}, {"disk_mb", s.disk_mb}, {"nic", s.nic}};
}

json to_json(const Template& t) {
  return {{"key", t.key},
          {"image", t.image},
          {"image_key", t.image_key},
          {"accel", t.accel},
          {"shape", to_json(t.shape)},
          {"state_bytes", t.state_bytes},
          {"built_at_ms", t.built_at_ms},
          {"build_ms", t.build_ms}};
}

TemplateStore::TemplateStore(fs::path root, fs::path ram_dir)
    : root_(std::move(root)), ram_dir_(std::move(ram_dir)) {
  {
    std::error_code ec;
    fs::create_directories(root_, ec);
    if (ec) throw Error(Errc::internal, "cannot create " + root_.string() + ": " + ec.message());
    ::chmod(root_.c_str(), 0700);
  }
  // The RAM directory is made by the daemon itself (mkdir 0700, so there is
  // no moment it is open to others) and never adopted as found: a directory
  // someone else owns, opens or links could let them swap a template's RAM.
  {
    std::error_code ec;
    if (ram_dir_.has_parent_path()) fs::create_directories(ram_dir_.parent_path(), ec);
    if (::mkdir(ram_dir_.c_str(), 0700) != 0 && errno != EEXIST)
      throw_errno("cannot create template RAM directory " + ram_dir_.string());
  }
  check_ram_dir();
  // Interrupted builds (a daemon killed mid-save) leave staging areas.
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root_, ec))
    if (e.path().filename().string().starts_with(".staging-")) fs::remove_all(e.path(), ec);
  for (const auto& e : fs::directory_iterator(ram_dir_, ec))
    if (e.path().filename().string().find(".staging-") != std::string::npos)
      fs::remove(e.path(), ec);
}

void TemplateStore::check_ram_dir() const {
  struct stat st {};
  const std::string p = ram_dir_.string();
  if (::lstat(p.c_str(), &st) != 0) throw_errno("template RAM directory " + p);
  if (S_ISLNK(st.st_mode))
    throw Error(Errc::invalid_argument,
                "template RAM directory " + p + " is a symbolic link; refusing to use it",
                "template_ram_dir");
  if (!S_ISDIR(st.st_mode))
    throw Error(Errc::invalid_argument, "template RAM directory " + p + " is not a directory",
                "template_ram_dir");
  if (st.st_uid != ::geteuid())
    throw Error(Errc::invalid_argument,
                "template RAM directory " + p + " is owned by uid " + std::to_string(st.st_uid) +
                    ", not by the daemon (uid " + std::to_string(::geteuid()) + ")",
                "template_ram_dir");
  if ((st.st_mode & 07777) != 0700) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    throw Error(Errc::invalid_argument,
                "template RAM directory " + p + " has mode " + mode + ", must be 0700",
                "template_ram_dir");
  }
}

std::string TemplateStore::key_for(const std::string& image_key, const Shape& shape,
                                   const std::string& accel, const std::string& qemu_identity) {
  return storage::sha256_hex({"template", std::to_string(kFormat), image_key, to_json(shape).dump(),
                              accel, qemu_identity})
      .substr(0, 16);
}

std::string TemplateStore::qemu_identity(const std::string& binary) {
  static std::mutex mu;
  static std::map<std::string, std::string> cache;
  std::string path = find_in_path(binary).value_or(binary);
  struct stat st {};
  std::string stamp = ::stat(path.c_str(), &st) == 0
                          ? std::to_string(st.st_size) + "/" + std::to_string(ns_of(st.st_mtim))
                          : "missing";
  std::lock_guard lock(mu);
  std::string& v = cache[path + "@" + stamp];
  if (v.empty()) v = vmm::qemu_version(path) + " " + path + " " + stamp;
  return v;
}

std::optional<Template> TemplateStore::load(const std::string& key, json* record,
                                            std::string* why) {
  Template t;
  t.key = key;
  t.dir = root_ / key;
  t.disk = t.dir / "disk.qcow2";
  t.clone = t.dir / "clone.qcow2";
  t.state = t.dir / "state.bin";
  t.ram = ram_dir_ / (key + ".ram");
  std::error_code ec;
  if (!fs::exists(t.dir, ec)) return std::nullopt;
  check_ram_dir();
  auto bad = [&](const std::string& what) -> std::optional<Template> {
    if (why) *why = "template " + key + ": " + what;
    return std::nullopt;
  };
  json j;
  try {
    std::ifstream in(t.dir / "template.json");
    if (!in) return bad("template.json is missing (an interrupted build)");
    j = json::parse(in);
    if (j.value("format", 0) != kFormat || j.value("key", "") != key)
      return bad("template.json is from another format or key");
    t.image = j.at("image").get<std::string>();
    t.image_key = j.at("image_key").get<std::string>();
    t.accel = j.at("accel").get<std::string>();
    const json& s = j.at("shape");
    t.shape = {s.at("cpus").get<int>(), s.at("memory_mb").get<int>(), s.at("disk_mb").get<int>(),
               s.at("nic").get<bool>()};
    t.state_bytes = j.at("state").at("size").get<uint64_t>();
    t.built_at_ms = j.value("built_at_ms", int64_t{0});
    t.build_ms = j.value("build_ms", int64_t{0});
  } catch (const std::exception& e) {
    return bad(std::string("template.json is unreadable: ") + e.what());
  }
  if (record) *record = j;
  return t;
}

std::optional<Template> TemplateStore::find(const std::string& key, std::string* why) {
  if (why) why->clear();
  json rec;
  std::string reason;
  std::optional<Template> t = load(key, &rec, &reason);
  auto reject = [&](const std::string& what) -> std::optional<Template> {
    if (reason.empty()) reason = "template " + key + ": " + what;
    if (why) *why = reason;
    remove(key);
    return std::nullopt;
  };
  if (!t) {
    if (reason.empty()) return std::nullopt;  // simply not there
    return reject(reason);
  }
  // The RAM file: right size, and not written since it was saved (a clone
  // maps it privately; a write means something opened it for writing).
  json ram = file_stamp(t->ram);
  if (ram.is_null()) return reject("RAM file " + t->ram.string() + " is missing");
  if (ram["size"].get<uint64_t>() != uint64_t(t->shape.memory_mb) << 20)
    return reject("RAM file has " + std::to_string(ram["size"].get<uint64_t>()) + " bytes, not " +
                  std::to_string(uint64_t(t->shape.memory_mb) << 20));
  if (ram != rec["ram"]) return reject("RAM file was modified after the template was saved");
  json disk = file_stamp(t->disk);
  if (disk.is_null()) return reject("disk " + t->disk.string() + " is missing");
  if (disk != rec["disk"]) return reject("disk was modified after the template was saved");
  if (file_stamp(t->clone).is_null()) return reject("clone.qcow2 is missing");
  json state = file_stamp(t->state);
  if (state.is_null()) return reject("state file is missing");
  if (state["size"] != rec["state"]["size"])
    return reject("state file has " + state["size"].dump() + " bytes, not " +
                  rec["state"]["size"].dump() + " (truncated?)");
  // The state is small (well under 1 MB): hashing it costs ~1 ms and
  // catches corruption the stamps cannot (same size, same times).
  try {
    if (storage::sha256_file(t->state) != rec["state"].value("sha256", ""))
      return reject("state file does not match its recorded SHA-256 (corrupt)");
  } catch (const Error& e) {
    return reject(e.what());
  }
  return t;
}

Staging TemplateStore::stage(const std::string& key) {
  Staging s;
  s.key = key;
  std::string tag = ".staging-" + key + "-" + random_suffix();
  s.dir = root_ / tag;
  std::error_code ec;
  fs::create_directories(s.dir, ec);
  if (ec) throw Error(Errc::internal, "cannot create " + s.dir.string() + ": " + ec.message());
  s.disk = s.dir / "disk.qcow2";
  s.state = s.dir / "state.bin";
  check_ram_dir();
  s.ram = ram_dir_ / (key + ".ram" + tag);
  return s;
}

Template TemplateStore::commit(const Staging& st, const Template& meta) {
  check_ram_dir();
  std::error_code ec;
  for (const fs::path& p : {st.disk, st.state, st.ram})
    if (!fs::is_regular_file(p, ec))
      throw Error(Errc::internal,
                  "cannot publish template " + st.key + ": " + p.string() + " was not written");
  Template t = meta;
  t.key = st.key;
  t.dir = root_ / st.key;
  t.disk = t.dir / "disk.qcow2";
  t.clone = t.dir / "clone.qcow2";
  t.state = t.dir / "state.bin";
  t.ram = ram_dir_ / (st.key + ".ram");
  t.state_bytes = fs::file_size(st.state);
  t.built_at_ms = now_ms();
  for (const fs::path& p : {st.disk, st.state}) ::chmod(p.c_str(), 0444);
  // Final owner and mode of the RAM file before its stamp is recorded: the
  // daemon's alone (the template QEMU that wrote it is gone); clones map a
  // sealed memfd copy of it (vmm/sealed_ram.h), never the file.
  if (::geteuid() == 0 && ::chown(st.ram.c_str(), 0, 0) != 0)
    throw_errno("chown " + st.ram.string());
  ::chmod(st.ram.c_str(), 0600);
  std::string sha = storage::sha256_file(st.state);
  std::lock_guard lock(mu_);
  fs::remove_all(t.dir, ec);
  fs::remove(t.ram, ec);
  fs::rename(st.ram, t.ram, ec);
  if (!ec) fs::rename(st.dir, t.dir, ec);
  if (ec) {
    fs::remove(t.ram, ec);
    throw Error(Errc::internal, "cannot publish template " + st.key + ": " + ec.message());
  }
  // Until template.json exists find() treats the directory as an interrupted
  // build. clone.qcow2 must name the disk by its final path, so it is made
  // here, after the rename.
  try {
    storage::create_overlay(t.disk, t.clone, static_cast<uint64_t>(meta.shape.disk_mb), "qcow2");
    ::chmod(t.clone.c_str(), 0444);
    json rec = to_json(t);
    rec["format"] = kFormat;
    rec["ram"] = file_stamp(t.ram);
    rec["disk"] = file_stamp(t.disk);
    rec["state"] = file_stamp(t.state);
    rec["state"]["sha256"] = sha;
    write_json_atomic(t.dir / "template.json", rec);
  } catch (...) {
    fs::remove_all(t.dir, ec);
    fs::remove(t.ram, ec);
    throw;
  }
  return t;
}

void TemplateStore::abandon(const Staging& st) noexcept {
  std::error_code ec;
  fs::remove_all(st.dir, ec);
  fs::remove(st.ram, ec);
}

void TemplateStore::remove(const std::string& key) noexcept {
  std::lock_guard lock(mu_);
  std::error_code ec;
  fs::remove_all(root_ / key, ec);
  fs::remove(ram_dir_ / (key + ".ram"), ec);
}

std::vector<Template> TemplateStore::list() {
  std::vector<std::pair<int64_t, Template>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root_, ec)) {
    std::string name = e.path().filename().string();
    if (name.starts_with(".")) continue;
    if (auto t = load(name, nullptr, nullptr)) {
      struct stat st {};
      int64_t used = ::stat((e.path() / "template.json").c_str(), &st) == 0 ? ns_of(st.st_mtim) : 0;
      found.emplace_back(used, *t);
    }
  }
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<Template> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

std::vector<std::string> TemplateStore::prune(size_t keep) {
  std::vector<std::string> removed;
  std::error_code ec;
  std::vector<std::string> valid;
  for (const Template& t : list()) valid.push_back(t.key);
  // Directories without a readable record are junk whatever `keep` says.
  for (const auto& e : fs::directory_iterator(root_, ec)) {
    std::string name = e.path().filename().string();
    if (name.starts_with(".")) continue;
    if (std::find(valid.begin(), valid.end(), name) == valid.end()) {
      remove(name);
      removed.push_back(name);
    }
  }
  for (size_t i = keep; i < valid.size(); ++i) {
    remove(valid[i]);
    removed.push_back(valid[i]);
  }
  // RAM files whose template is gone.
  check_ram_dir();
  for (const auto& e : fs::directory_iterator(ram_dir_, ec)) {
    std::string name = e.path().filename().string();
    if (!name.ends_with(".ram")) continue;
    std::string key = name.substr(0, name.size() - 4);
    if (!fs::exists(root_ / key)) fs::remove(e.path(), ec);
  }
  return removed;
}

void TemplateStore::touch(const std::string& key) noexcept {
  // The record's mtime orders prune(); the checked files are not touched.
  ::utimensat(AT_FDCWD, (root_ / key / "template.json").c_str(), nullptr, 0);
}

}  // namespace airlock::templates

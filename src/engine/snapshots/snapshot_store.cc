#include "engine/snapshots/snapshot_store.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "common/error.h"
#include "engine/storage/digest.h"
#include "engine/vmm/jail.h"

namespace airlock::snapshots {

namespace fs = std::filesystem;

namespace {

constexpr const char* kMeta = "snapshot.json";

std::string random_hex() {
  unsigned char b[6];
  if (::getrandom(b, sizeof b, 0) != static_cast<ssize_t>(sizeof b)) throw_errno("getrandom");
  static const char* d = "0123456789abcdef";
  std::string s;
  for (unsigned char c : b) {
    s += d[c >> 4];
    s += d[c & 15];
  }
  return s;
}

void fsync_path(const fs::path& p, int flags) {
  int fd = ::open(p.c_str(), flags | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) throw_errno("open " + p.string());
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) {
    errno = err;
    throw_errno("fsync " + p.string());
  }
}

Snapshot from_json(const nlohmann::json& j, const fs::path& dir) {
  Snapshot s;
  s.name = j.at("name").get<std::string>();
  s.source = j.value("source", "");
  s.parent = j.value("parent", "");
  s.image = j.value("image", "");
  s.tenant = j.value("tenant", "");
  s.memory = j.value("memory", false);
  s.internal = j.value("internal", false);
  s.cpus = j.value("cpus", 1);
  s.memory_mb = j.value("memory_mb", 256);
  s.disk_mb = j.value("disk_mb", 1024);
  s.ram_block = j.value("ram_block", "");
  s.accel = j.value("accel", "");
  s.networked = j.value("networked", false);
  s.created_at_ms = j.value("created_at_ms", int64_t{0});
  s.took_ms = j.value("took_ms", int64_t{0});
  s.paused_ms = j.value("paused_ms", int64_t{0});
  s.bytes = j.value("bytes", uint64_t{0});
  s.files = j.value("files", nlohmann::json::object());
  s.dir = dir;
  return s;
}

}  // namespace

nlohmann::json to_json(const Snapshot& s) {
  nlohmann::json j = {{"name", s.name},
                      {"source", s.source},
                      {"parent", s.parent},
                      {"image", s.image},
                      {"memory", s.memory},
                      {"internal", s.internal},
                      {"cpus", s.cpus},
                      {"memory_mb", s.memory_mb},
                      {"disk_mb", s.disk_mb},
                      {"ram_block", s.ram_block},
                      {"accel", s.accel},
                      {"networked", s.networked},
                      {"created_at_ms", s.created_at_ms},
                      {"took_ms", s.took_ms},
                      {"paused_ms", s.paused_ms},
                      {"bytes", s.bytes},
                      {"files", s.files}};
  if (!s.tenant.empty()) j["tenant"] = s.tenant;
  return j;
}

void check_name(const std::string& name, const std::string& field) {
  auto bad = [&](const std::string& why) {
    throw Error(Errc::invalid_argument, field + " " + why, field);
  };
  if (name.empty()) bad("must not be empty");
  if (name.size() > 64) bad("must be at most 64 characters");
  if (name.find('\0') != std::string::npos) bad("must not contain NUL");
  if (name.find('/') != std::string::npos) bad("must not contain '/'");
  if (name.find("..") != std::string::npos) bad("must not contain '..'");
  if (name[0] == '.' || name[0] == '-') bad("must not start with '.' or '-'");
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'))
      bad("may contain only letters, digits, '_' and '-'");
}

SnapshotStore::SnapshotStore(fs::path root) : root_(std::move(root)) {
  std::error_code ec;
  fs::create_directories(root_, ec);
  if (ec) throw Error(Errc::internal, "cannot create " + root_.string() + ": " + ec.message());
  ::chmod(root_.c_str(), 0700);
  for (auto it = fs::directory_iterator(root_, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    if (it->path().filename().string().rfind(".staging-", 0) == 0) {
      std::error_code e2;
      fs::permissions(it->path(), fs::perms::owner_all, e2);
      fs::remove_all(it->path(), e2);
    }
  }
}

Staging SnapshotStore::stage(const std::string& name) {
  check_name(name);
  std::lock_guard lock(mu_);
  std::error_code ec;
  if (fs::exists(fs::symlink_status(root_ / name, ec)))
    throw Error(Errc::conflict, "snapshot " + name + " already exists", "name");
  Staging st{name, root_ / (".staging-" + name + "-" + random_hex())};
  if (::mkdir(st.dir.c_str(), 0700) != 0) {
    int err = errno;
    throw Error(err == ENOSPC ? Errc::unavailable : Errc::internal,
                "cannot create " + st.dir.string() + ": " + std::strerror(err));
  }
  return st;
}

Snapshot SnapshotStore::commit(const Staging& st, Snapshot meta) {
  try {
    meta.name = st.name;
    meta.files = nlohmann::json::object();
    meta.bytes = 0;
    for (const auto& e : fs::directory_iterator(st.dir)) {
      if (!e.is_regular_file() || e.path().filename() == kMeta) continue;
      fsync_path(e.path(), O_RDONLY);
      uint64_t size = fs::file_size(e.path());
      meta.files[e.path().filename().string()] = {{"size", size},
                                                  {"sha256", storage::sha256_file(e.path())}};
      meta.bytes += size;
    }
    {
      std::ofstream out(st.dir / kMeta, std::ios::trunc);
      out << to_json(meta).dump(2) << "\n";
      out.close();
      if (!out)
        throw Error(Errc::unavailable,
                    "cannot write " + (st.dir / kMeta).string() + " (disk full?)");
    }
    fsync_path(st.dir / kMeta, O_RDONLY);
    for (const auto& e : fs::directory_iterator(st.dir))
      if (e.is_regular_file()) ::chmod(e.path().c_str(), 0444);  // the jailed QEMU reads layers
    fsync_path(st.dir, O_RDONLY | O_DIRECTORY);
    std::lock_guard lock(mu_);
    std::error_code ec;
    if (fs::exists(fs::symlink_status(root_ / st.name, ec)))
      throw Error(Errc::conflict, "snapshot " + st.name + " already exists", "name");
    if (::rename(st.dir.c_str(), (root_ / st.name).c_str()) != 0)
      throw_errno("rename " + st.dir.string());
    fsync_path(root_, O_RDONLY | O_DIRECTORY);
    meta.dir = root_ / st.name;
    return meta;
  } catch (...) {
    abandon(st);
    throw;
  }
}

void SnapshotStore::abandon(const Staging& st) noexcept {
  std::error_code ec;
  fs::remove_all(st.dir, ec);
}

std::optional<Snapshot> SnapshotStore::find(const std::string& name) const {
  check_name(name);
  fs::path dir = root_ / name;
  std::ifstream in(dir / kMeta);
  if (!in) return std::nullopt;
  try {
    return from_json(nlohmann::json::parse(in), dir);
  } catch (const std::exception& e) {
    throw Error(Errc::unavailable, "snapshot " + name + " is damaged: " + kMeta +
                                       " cannot be read (" + e.what() + ")");
  }
}

Snapshot SnapshotStore::get(const std::string& name) const {
  auto s = find(name);
  if (!s) throw Error(Errc::not_found, "no snapshot " + name, "name");
  return *s;
}

std::vector<Snapshot> SnapshotStore::list() const {
  std::vector<Snapshot> out;
  std::error_code ec;
  std::vector<std::string> names;
  for (auto it = fs::directory_iterator(root_, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    std::string n = it->path().filename().string();
    if (!n.empty() && n[0] != '.') names.push_back(n);
  }
  std::sort(names.begin(), names.end());
  for (const auto& n : names) {
    try {
      if (auto s = find(n)) out.push_back(*s);
    } catch (const std::exception&) {
      // listed by name only through get(), which reports the damage
    }
  }
  return out;
}

void SnapshotStore::verify(const Snapshot& s) const {
  for (Snapshot snap = s;;) {
    const Snapshot* cur = &snap;
    for (const auto& [file, rec] : cur->files.items()) {
      fs::path p = cur->dir / file;
      auto damaged = [&](const std::string& why) {
        throw Error(Errc::unavailable, "snapshot " + cur->name + " is damaged: " + file + " " +
                                           why + "; it cannot be restored");
      };
      struct stat st {};
      if (::lstat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) damaged("is missing");
      uint64_t want = rec.value("size", uint64_t{0});
      if (static_cast<uint64_t>(st.st_size) != want)
        damaged("has " + std::to_string(st.st_size) + " bytes, " + std::to_string(want) +
                " were written (truncated or altered)");
      if (storage::sha256_file(p) != rec.value("sha256", ""))
        damaged("does not match its SHA-256 (altered)");
    }
    // The layer's backing chain below this snapshot must still be there.
    std::error_code ec;
    if (fs::exists(cur->layer(), ec)) {
      try {
        for (const auto& f : vmm::qcow2_chain(cur->layer()))
          if (!fs::is_regular_file(f))
            throw Error(Errc::unavailable, "backing file " + f.string() + " is gone");
      } catch (const std::exception& e) {
        throw Error(Errc::unavailable, "snapshot " + cur->name +
                                           " cannot be restored: its disk chain is broken (" +
                                           e.what() + ")");
      }
    }
    if (cur->parent.empty()) return;
    snap = get(std::string(cur->parent));
  }
}

void SnapshotStore::remove(const std::string& name) noexcept {
  std::lock_guard lock(mu_);
  std::error_code ec;
  fs::path dir = root_ / name;
  if (name.empty() || name[0] == '.') return;
  // Only the directory's mode matters for unlinking. Never chmod the files:
  // base.qcow2 may be a hard link to a template's disk (same inode), and a
  // mode change there locked every clone of that template out of its disk.
  fs::permissions(dir, fs::perms::owner_all, ec);
  fs::remove_all(dir, ec);
}

}  // namespace airlock::snapshots

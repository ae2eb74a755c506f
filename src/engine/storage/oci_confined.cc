// The daemon's side of a confined image import (oci_import.h, import_oci):
// airlock-confine parses the archive as an unprivileged uid and writes only
// contents; what needs root (owners, set-id modes, security.capability) is
// applied here from the manifest it left, to a tree nobody can change any
// more (the helper's process group is dead), through descriptors.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <set>
#include <utility>

#include "common/error.h"
#include "common/unique_fd.h"
#include "engine/confine/confine.h"
#include "engine/storage/fs_util.h"
#include "engine/storage/oci_import.h"
#include "protocol/messages.h"

namespace airlock::storage {
namespace fs = std::filesystem;
using namespace detail;
namespace confine = engine::confine;

namespace {

constexpr size_t kMaxLine = size_t{8} << 20;
constexpr int kMaxDepth = 1024;

// A decimal or octal digit's value; -1 for anything else.
int digit(char c) { return c >= '0' && c <= '9' ? c - '0' : -1; }

// protocol::from_hex that cannot throw: false for anything malformed.
bool unhex(std::string_view h, std::string& out) {
  try {
    out = protocol::from_hex(h);
    return true;
  } catch (const Error&) {
    return false;
  }
}

[[noreturn]] void malformed(uint64_t line, const std::string& why) {
  throw Error(Errc::internal, "the import helper's manifest is malformed at line " +
                                  std::to_string(line) + ": " + why);
}

// "<hex path> <kind> <uid> <gid> <octal mode>[ <hex name>=<hex value>]..."
std::pair<std::string, EntryMeta> parse_line(std::string_view l, uint64_t n) {
  std::vector<std::string_view> f;
  for (size_t i = 0; i <= l.size();) {
    size_t j = l.find(' ', i);
    if (j == std::string_view::npos) j = l.size();
    f.push_back(l.substr(i, j - i));
    i = j + 1;
  }
  if (f.size() < 5) malformed(n, "fewer than 5 fields");
  std::pair<std::string, EntryMeta> e;
  if (f[0].empty() || !unhex(f[0], e.first) || e.first.size() > 4096 ||
      e.first.find('\0') != std::string::npos)
    malformed(n, "bad path");
  if (f[1].size() != 1 || std::string_view("fdlp").find(f[1][0]) == std::string_view::npos)
    malformed(n, "bad kind");
  e.second.kind = f[1][0];
  auto num = [&](std::string_view s, int base, uint64_t max) {
    if (s.empty() || s.size() > 11) malformed(n, "bad number");
    uint64_t v = 0;
    for (char c : s) {
      int d = digit(c);
      if (d < 0 || d >= base) malformed(n, "bad number");
      v = v * static_cast<uint64_t>(base) + static_cast<uint64_t>(d);
    }
    if (v > max) malformed(n, "number out of range");
    return static_cast<uint32_t>(v);
  };
  e.second.uid = num(f[2], 10, 0xfffffffe);
  e.second.gid = num(f[3], 10, 0xfffffffe);
  e.second.mode = num(f[4], 8, 07777);
  for (size_t i = 5; i < f.size(); ++i) {
    size_t eq = f[i].find('=');
    std::string name, value;
    if (eq == std::string_view::npos || !unhex(f[i].substr(0, eq), name) ||
        !unhex(f[i].substr(eq + 1), value) || name.empty() || name.size() > 255 ||
        value.size() > 65536 || name.find('\0') != std::string::npos)
      malformed(n, "bad xattr");
    e.second.xattrs.emplace_back(std::move(name), std::move(value));
  }
  return e;
}

class Settler {
 public:
  Settler(const Manifest& m, int64_t uid) : m_(m), uid_(uid), root_(::geteuid() == 0) {}

  // `dir` is open; `path` its path below the root ("" for the root).
  void tree(int dir, const std::string& path, int depth) {
    if (depth > kMaxDepth)
      refuse(path, "is deeper than " + std::to_string(kMaxDepth) + " directories");
    std::vector<std::string> kids;
    {
      DIR* d = ::fdopendir(::fcntl(dir, F_DUPFD_CLOEXEC, 0));
      if (!d) throw_errno("read the imported tree at '" + path + "'");
      while (auto* ent = ::readdir(d)) {
        std::string n = ent->d_name;
        if (n != "." && n != "..") kids.push_back(std::move(n));
      }
      ::closedir(d);
    }
    for (const auto& k : kids) child(dir, k, path.empty() ? k : path + "/" + k, depth);
  }

  // The manifest's entry for `path` (none: root's, its mode kept), which
  // must be of the kind that is there.
  const EntryMeta* meta(const std::string& path, char kind) {
    auto it = m_.find(path);
    const EntryMeta* m = it == m_.end() ? nullptr : &it->second;
    if (m && m->kind != kind)
      refuse(path,
             std::string("is a '") + kind + "' but its manifest entry says '" + m->kind + "'");
    return m;
  }

  void apply(int fd, const std::string& path, const struct stat& st, char kind) {
    const EntryMeta* m = meta(path, kind);
    uint32_t mode = m ? m->mode : (st.st_mode & 0777);
    uint32_t uid = m ? m->uid : 0, gid = m ? m->gid : 0;
    if (root_ && ::fchown(fd, uid, gid) != 0) throw_errno("chown '" + path + "'");
    if (::fchmod(fd, mode) != 0) throw_errno("chmod '" + path + "'");
    if (!m) return;
    for (const auto& [name, value] : m->xattrs)
      if (::fsetxattr(fd, name.c_str(), value.data(), value.size(), 0) != 0) ++dropped;
  }

  uint64_t dropped = 0;

 private:
  [[noreturn]] void refuse(const std::string& path, const std::string& why) {
    throw Error(Errc::invalid_argument, "the imported tree's '" + path.substr(0, 200) + "' " + why,
                "archive");
  }

  void child(int dir, const std::string& name, const std::string& path, int depth) {
    struct stat st {};
    if (::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
      throw_errno("stat '" + path + "'");
    bool first = seen_.insert({st.st_dev, st.st_ino}).second;
    // Every inode below the root is the helper's own, made during this
    // import: anything else (a hard link to a host file) is never touched.
    if (first && uid_ >= 0 && st.st_uid != static_cast<uid_t>(uid_))
      refuse(path, "was not made by the import (owner " + std::to_string(st.st_uid) + ")");
    if (S_ISDIR(st.st_mode)) {
      UniqueFd fd(::openat(dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (fd.fd < 0) throw_errno("open '" + path + "'");
      tree(fd.fd, path, depth + 1);
      apply(fd.fd, path, st, 'd');
    } else if (S_ISREG(st.st_mode)) {
      UniqueFd fd(::openat(dir, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
      if (fd.fd < 0) throw_errno("open '" + path + "'");
      struct stat now {};
      if (::fstat(fd.fd, &now) != 0 || now.st_ino != st.st_ino || now.st_dev != st.st_dev)
        refuse(path, "changed while it was settled");
      apply(fd.fd, path, st, 'f');
    } else if (S_ISLNK(st.st_mode) || S_ISFIFO(st.st_mode)) {
      // Neither is opened (a fifo would block, a symlink be followed): the
      // names are ops on the parent, with nothing left to swap them.
      char kind = S_ISLNK(st.st_mode) ? 'l' : 'p';
      const EntryMeta* m = meta(path, kind);
      if (root_ &&
          ::fchownat(dir, name.c_str(), m ? m->uid : 0, m ? m->gid : 0, AT_SYMLINK_NOFOLLOW) != 0)
        throw_errno("chown '" + path + "'");
      if (kind == 'p' && ::fchmodat(dir, name.c_str(), m ? m->mode : (st.st_mode & 0777), 0) != 0)
        throw_errno("chmod '" + path + "'");
    } else {
      refuse(path, "is a device node or socket, which the import never makes");
    }
  }

  const Manifest& m_;
  int64_t uid_;
  bool root_;
  std::set<std::pair<dev_t, ino_t>> seen_;
};

// What the helper printed: its ImportResult without the manifest, or the
// Error it met, rebuilt with its code (an archive's fault stays a 400).
ImportResult summary(const confine::Result& r) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(r.out);
  } catch (const nlohmann::json::exception&) {
    throw Error(Errc::internal, "the image import helper gave no result (" + r.describe() + ")");
  }
  if (!j.is_object()) throw Error(Errc::internal, "the image import helper gave no result");
  if (j.contains("error") && j["error"].is_object()) {
    std::string code = j["error"].value("code", "internal");
    std::string msg = j["error"].value("message", "the image import failed");
    if (code == "invalid_argument") throw Error(Errc::invalid_argument, msg, "archive");
    throw Error(Errc::internal, msg);
  }
  ImportResult res;
  try {
    res.config = image_config_from_json(j.at("config"));
    res.source = j.at("source").get<std::string>();
    res.layers = j.at("layers").get<int>();
    res.bytes = j.at("bytes").get<uint64_t>();
    res.entries = j.at("entries").get<uint64_t>();
    res.dropped = j.at("dropped").get<uint64_t>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(Errc::internal,
                std::string("the image import helper's result is malformed: ") + e.what());
  }
  return res;
}

}  // namespace

void write_manifest(const Manifest& m, int fd) {
  std::string buf;
  auto flush = [&](bool all) {
    if (!all && buf.size() < (1u << 20)) return;
    for (size_t off = 0; off < buf.size();) {
      ssize_t n = ::write(fd, buf.data() + off, buf.size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw_errno("write the import manifest");
      off += static_cast<size_t>(n);
    }
    buf.clear();
  };
  char num[64];
  for (const auto& [path, e] : m) {
    std::snprintf(num, sizeof num, " %c %u %u %o", e.kind, e.uid, e.gid, e.mode);
    buf += protocol::to_hex(path) + num;
    for (const auto& [name, value] : e.xattrs)
      buf += " " + protocol::to_hex(name) + "=" + protocol::to_hex(value);
    buf += '\n';
    flush(false);
  }
  flush(true);
}

Manifest read_manifest(int fd, uint64_t max_entries) {
  Manifest m;
  std::string pending;
  std::string chunk(1 << 16, '\0');
  uint64_t line = 0;
  for (;;) {
    ssize_t n = ::read(fd, chunk.data(), chunk.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno("read the import manifest");
    if (n == 0) break;
    pending.append(chunk.data(), static_cast<size_t>(n));
    size_t start = 0;
    for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1) {
      if (++line > max_entries)
        throw Error(Errc::internal, "the import helper's manifest has more than " +
                                        std::to_string(max_entries) + " entries");
      auto e = parse_line(std::string_view(pending).substr(start, nl - start), line);
      if (!m.emplace(std::move(e)).second) malformed(line, "duplicate path");
    }
    pending.erase(0, start);
    if (pending.size() > kMaxLine) malformed(line + 1, "longer than 8 MiB");
  }
  if (!pending.empty()) malformed(line + 1, "no newline at its end");
  return m;
}

uint64_t settle_import(const fs::path& root, const Manifest& m, int64_t uid) {
  UniqueFd fd(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (fd.fd < 0) throw_errno("open " + root.string());
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) throw_errno("stat " + root.string());
  Settler s(m, uid);
  s.tree(fd.fd, "", 0);
  // The root: root's, 0755, whatever the archive said of "./".
  if (::geteuid() == 0 && ::fchown(fd.fd, 0, 0) != 0) throw_errno("chown " + root.string());
  if (::fchmod(fd.fd, 0755) != 0) throw_errno("chmod " + root.string());
  return s.dropped;
}

Image import_oci(ImageStore& store, const std::string& name, const fs::path& input,
                 const ImportPolicy& policy, bool replace, const ProgressFn& progress) {
  fs::create_directories(store.dir());
  TempDir tmp(store.dir(), "import-");
  if (progress) progress(BuildProgress{"unpack", 0});
  confine::Scratch scratch(tmp.path());
  scratch.give(input);  // 3
  scratch.give_dir();   // 4
  confine::Spec spec = scratch.exec({}, "the image importer");
  spec.mode = "import";
  spec.args = {
      {"keep_owners", policy.keep_owners}, {"max_bytes", policy.max_bytes},
      {"max_entries", policy.max_entries}, {"max_archive_entries", policy.max_archive_entries},
      {"max_ratio", policy.max_ratio},     {"min_layer_budget", policy.min_layer_budget}};
  // Its manifest map is the largest thing it holds: 2 GiB is room for
  // millions of entries, not for a runaway parser.
  spec.limits.memory_bytes = uint64_t{2} << 30;
  spec.limits.cpu_seconds = 1800;
  spec.limits.timeout = std::chrono::minutes(30);
  spec.limits.file_bytes = policy.max_bytes;
  ImportResult res = summary(confine::run(spec).check());
  scratch.forget();
  // The helper is gone: its names stay as they are while root reads them.
  fs::path manifest = scratch.dir() / "manifest";
  UniqueFd mf(::open(manifest.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  struct stat st {};
  if (mf.fd < 0 || ::fstat(mf.fd, &st) != 0 || !S_ISREG(st.st_mode))
    throw Error(Errc::internal, "the image import helper left no manifest");
  Manifest m = read_manifest(mf.fd, policy.max_entries);
  fs::path root = scratch.dir() / "root";
  res.dropped += settle_import(root, m, scratch.uid());
  if (progress) progress(BuildProgress{"unpacked", res.bytes});
  remove_tree(scratch.dir() / "layout");
  return store.install(
      name, root, res.config,
      {.source = res.source, .layers = res.layers, .replace = replace, .tenant = {}}, progress);
}

}  // namespace airlock::storage

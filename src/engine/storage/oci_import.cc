#include "engine/storage/oci_import.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "common/error.h"
#include "engine/storage/digest.h"
#include "engine/storage/fs_util.h"

namespace airlock::storage {
namespace fs = std::filesystem;
using namespace detail;

namespace {

constexpr size_t kMaxPath = 4096;
constexpr size_t kMaxXattrs = 32;  // per entry; more are dropped (counted)

bool is_kept_xattr(const std::string& n) {
  return n.rfind("user.", 0) == 0 || n == "security.capability";
}

[[noreturn]] void bad(const std::string& msg) {
  throw Error(Errc::invalid_argument, msg, "archive");
}

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

using ArchivePtr = std::unique_ptr<archive, int (*)(archive*)>;

ArchivePtr open_archive(const fs::path& file, const std::string& what) {
  ArchivePtr a(archive_read_new(), archive_read_free);
  archive_read_support_filter_all(a.get());
  archive_read_support_format_tar(a.get());
  if (archive_read_open_filename(a.get(), file.c_str(), 1 << 16) != ARCHIVE_OK)
    bad("cannot read " + what + " as a tar archive: " + archive_error_string(a.get()));
  return a;
}

// An entry's path split into components. Refuses absolute paths, `..`, NUL
// and over-long names; "./a//b/" -> {"a", "b"}; the root itself -> {}.
std::vector<std::string> split_path(const std::string& raw, const std::string& what) {
  if (raw.size() > kMaxPath) bad(what + ": path is longer than 4096 bytes");
  if (!raw.empty() && raw[0] == '/') bad(what + ": absolute path");
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= raw.size()) {
    size_t j = raw.find('/', i);
    if (j == std::string::npos) j = raw.size();
    std::string c = raw.substr(i, j - i);
    if (c == "..") bad(what + ": path climbs out of the image with '..'");
    if (!c.empty() && c != ".") out.push_back(c);
    i = j + 1;
  }
  return out;
}

std::string join(const std::vector<std::string>& c, size_t n) {
  std::string s;
  for (size_t i = 0; i < n && i < c.size(); ++i) s += (i ? "/" : "") + c[i];
  return s;
}

// The directory holding the last component, opened component by component
// with O_NOFOLLOW from `root` (missing ones created 0755 when `create`).
// A symlink or non-directory on the way is refused: the archive could
// otherwise steer a write through a link it planted.
Fd open_parent(int root, const std::vector<std::string>& c, bool create, const std::string& what) {
  Fd cur(::fcntl(root, F_DUPFD_CLOEXEC, 0));
  for (size_t i = 0; i + 1 < c.size(); ++i) {
    int fd = ::openat(cur.get(), c[i].c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT && create) {
      if (::mkdirat(cur.get(), c[i].c_str(), 0755) != 0 && errno != EEXIST)
        throw_errno(what + ": mkdir " + join(c, i + 1));
      fd = ::openat(cur.get(), c[i].c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    }
    if (fd < 0) {
      if (errno == ELOOP || errno == ENOTDIR)
        bad(what + ": parent '" + join(c, i + 1) + "' is a symlink or not a directory");
      if (errno == ENOENT) bad(what + ": parent '" + join(c, i + 1) + "' does not exist");
      throw_errno(what + ": open " + join(c, i + 1));
    }
    cur = Fd(fd);
  }
  return cur;
}

// Removes `name` in `dir` whatever it is (a directory recursively), never
// following a symlink.
void remove_at(int dir, const std::string& name) {
  struct stat st;
  if (::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    int fd = ::openat(dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) throw_errno("open " + name);
    DIR* d = ::fdopendir(fd);
    if (!d) {
      ::close(fd);
      throw_errno("fdopendir " + name);
    }
    std::vector<std::string> kids;
    while (auto* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") kids.push_back(n);
    }
    for (const auto& k : kids) remove_at(::dirfd(d), k);
    ::closedir(d);
    if (::unlinkat(dir, name.c_str(), AT_REMOVEDIR) != 0) throw_errno("rmdir " + name);
  } else if (::unlinkat(dir, name.c_str(), 0) != 0) {
    throw_errno("unlink " + name);
  }
}

// Applies layers to one root, keeping the budgets of the whole image.
class Applier {
 public:
  Applier(const fs::path& root, const ImportPolicy& p) : policy_(p) {
    root_ = Fd(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (root_.get() < 0) throw_errno("open " + root.string());
    is_root_ = ::geteuid() == 0 && !p.defer;
  }

  void apply(const fs::path& blob, const std::string& label, uint64_t blob_size) {
    created_.clear();
    seen_.clear();
    uint64_t budget = std::max(policy_.min_layer_budget, policy_.max_ratio * blob_size);
    auto a = open_archive(blob, label);
    archive_entry* e = nullptr;
    std::string last = "(start)";
    for (;;) {
      int r = archive_read_next_header(a.get(), &e);
      if (r == ARCHIVE_EOF) break;
      if (r < ARCHIVE_WARN)
        bad(label + ": unreadable entry after '" + last + "': " + archive_error_string(a.get()));
      const char* pn = archive_entry_pathname(e);
      std::string name = pn ? pn : "";
      last = name.substr(0, 200);
      std::string what = label + ": entry '" + last + "'";
      if (++result.entries > policy_.max_entries)
        bad(what + ": more than " + std::to_string(policy_.max_entries) + " entries");
      if (archive_entry_size_is_set(e) && archive_entry_size(e) < 0) bad(what + ": negative size");
      uint64_t size = archive_entry_size_is_set(e) ? archive_entry_size(e) : 0;
      if (size > budget)
        bad(what + " declares " + std::to_string(size) + " bytes, more than the layer may hold (" +
            std::to_string(budget) + " for a blob of " + std::to_string(blob_size) +
            " bytes): refused as a decompression bomb");
      entry(a.get(), e, name, what);
      uint64_t expanded = static_cast<uint64_t>(archive_filter_bytes(a.get(), 0));
      if (expanded > budget)
        bad(label + " expands to more than " + std::to_string(budget) + " bytes (its blob is " +
            std::to_string(blob_size) + "): refused as a decompression bomb at entry '" + last +
            "'");
    }
    ++result.layers;
  }

  ImportResult result;

 private:
  void entry(archive* a, archive_entry* e, const std::string& raw, const std::string& what) {
    auto c = split_path(raw, what);
    if (c.empty()) return;  // "./": the root itself
    std::string path = join(c, c.size());
    if (!seen_.insert(path).second) bad(what + ": duplicate entry in one layer");
    const std::string& leaf = c.back();
    // Whiteouts: act on the lower layers, write nothing.
    if (leaf.rfind(".wh.", 0) == 0) {
      Fd dir = open_parent(root_.get(), c, false, what);
      if (leaf == ".wh..wh..opq") {
        opaque(dir.get(), join(c, c.size() - 1));
      } else if (leaf.rfind(".wh..wh.", 0) != 0) {
        std::string victim = leaf.substr(4);
        std::string vpath = join(c, c.size() - 1);
        vpath += (vpath.empty() ? "" : "/") + victim;
        if (victim.empty() || victim == "." || victim == "..") bad(what + ": bad whiteout");
        if (!created_.count(vpath)) remove(dir.get(), victim, vpath);
      }
      return;
    }
    for (size_t i = 1; i <= c.size(); ++i) created_.insert(join(c, i));
    Fd dir = open_parent(root_.get(), c, true, what);
    int d = dir.get();
    mode_t type = archive_entry_filetype(e);
    mode_t mode = archive_entry_perm(e) & 07777;
    const char* hl = archive_entry_hardlink(e);
    if (hl) {
      hardlink(d, leaf, path, hl, what);
      return;
    }
    struct stat old;
    bool exists = ::fstatat(d, leaf.c_str(), &old, AT_SYMLINK_NOFOLLOW) == 0;
    if (exists && !(type == AE_IFDIR && S_ISDIR(old.st_mode))) remove(d, leaf, path);
    switch (type) {
      case AE_IFDIR: {
        if (!exists || !S_ISDIR(old.st_mode)) {
          if (::mkdirat(d, leaf.c_str(), 0700) != 0) throw_errno(what + ": mkdir");
        }
        Fd fd(::openat(d, leaf.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (fd.get() < 0) throw_errno(what + ": open");
        finish(fd.get(), e, mode, 'd', path, what);
        break;
      }
      case AE_IFREG: {
        Fd fd(
            ::openat(d, leaf.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
        if (fd.get() < 0) throw_errno(what + ": create");
        const void* buf;
        size_t len;
        la_int64_t off;
        for (;;) {
          int r = archive_read_data_block(a, &buf, &len, &off);
          if (r == ARCHIVE_EOF) break;
          if (r < ARCHIVE_WARN) bad(what + ": " + archive_error_string(a));
          if (off < 0 ||
              static_cast<uint64_t>(off) + len > static_cast<uint64_t>(archive_entry_size(e)))
            bad(what + ": data beyond its declared size");
          result.bytes += len;
          if (result.bytes > policy_.max_bytes)
            bad(what + ": the image is larger than " + std::to_string(policy_.max_bytes) +
                " bytes");
          for (size_t done = 0; done < len;) {
            ssize_t n = ::pwrite(fd.get(), static_cast<const char*>(buf) + done, len - done,
                                 off + static_cast<off_t>(done));
            if (n < 0) throw_errno(what + ": write");
            done += static_cast<size_t>(n);
          }
        }
        if (::ftruncate(fd.get(), archive_entry_size(e)) != 0) throw_errno(what + ": truncate");
        finish(fd.get(), e, mode, 'f', path, what);
        struct timespec ts[2] = {{archive_entry_mtime(e), 0}, {archive_entry_mtime(e), 0}};
        ::futimens(fd.get(), ts);
        break;
      }
      case AE_IFLNK: {
        const char* t = archive_entry_symlink(e);
        std::string target = t ? t : "";
        check_symlink(c, target, what);
        if (::symlinkat(target.c_str(), d, leaf.c_str()) != 0) throw_errno(what + ": symlink");
        owner_at(d, leaf, e, 'l', path, 0777);
        break;
      }
      case AE_IFIFO:
        if (::mkfifoat(d, leaf.c_str(), policy_.defer ? 0600 : mode) != 0)
          throw_errno(what + ": mkfifo");
        owner_at(d, leaf, e, 'p', path, mode);
        break;
      case AE_IFCHR:
      case AE_IFBLK:
        if (!policy_.keep_devices || !is_root_) {
          ++result.dropped;
          break;
        }
        if (::mknodat(d, leaf.c_str(), (type == AE_IFCHR ? S_IFCHR : S_IFBLK) | mode,
                      archive_entry_rdev(e)) != 0)
          throw_errno(what + ": mknod");
        owner_at(d, leaf, e, 'c', path, mode);
        break;
      default:  // sockets and anything else: nothing to keep
        ++result.dropped;
    }
  }

  // Deferred: what root applies later (settle_import); the helper's own
  // copy stays owner-only (its later layers still write through it).
  EntryMeta& defer(archive_entry* e, char kind, const std::string& path, mode_t mode) {
    EntryMeta& m = result.manifest[path];
    m = EntryMeta{kind, 0, 0, static_cast<uint32_t>(mode), {}};
    if (policy_.keep_owners) {
      m.uid = static_cast<uint32_t>(archive_entry_uid(e));
      m.gid = static_cast<uint32_t>(archive_entry_gid(e));
    }
    return m;
  }

  void owner_at(int d, const std::string& leaf, archive_entry* e, char kind,
                const std::string& path, mode_t mode) {
    if (policy_.defer) {
      defer(e, kind, path, mode);
    } else if (is_root_ && policy_.keep_owners) {
      ::fchownat(d, leaf.c_str(), archive_entry_uid(e), archive_entry_gid(e), AT_SYMLINK_NOFOLLOW);
    }
  }

  // The entry's xattrs that are kept (user.*, security.capability; at most
  // kMaxXattrs of at most 64 KiB); the others are counted as dropped.
  std::vector<std::pair<std::string, std::string>> kept_xattrs(archive_entry* e) {
    std::vector<std::pair<std::string, std::string>> out;
    archive_entry_xattr_reset(e);
    const char* xname;
    const void* xval;
    size_t xlen;
    while (archive_entry_xattr_next(e, &xname, &xval, &xlen) == ARCHIVE_OK) {
      std::string n = xname ? xname : "";
      std::string v(static_cast<const char*>(xval), xlen);
      // libarchive reports a pax xattr once per header that carries it.
      auto same = std::find_if(out.begin(), out.end(), [&](const auto& x) { return x.first == n; });
      if (same != out.end())
        same->second = std::move(v);
      else if (is_kept_xattr(n) && xlen <= 65536 && out.size() < kMaxXattrs)
        out.emplace_back(n, std::move(v));
      else
        ++result.dropped;
    }
    return out;
  }

  // Owner, mode (after chown, which clears set-id bits), xattrs.
  void finish(int fd, archive_entry* e, mode_t mode, char kind, const std::string& path,
              const std::string& what) {
    if (policy_.defer) {
      defer(e, kind, path, mode).xattrs = kept_xattrs(e);
      if (::fchmod(fd, kind == 'd' ? 0700 : 0600) != 0) throw_errno(what + ": chmod");
      return;
    }
    if (is_root_ && policy_.keep_owners) {
      if (::fchown(fd, archive_entry_uid(e), archive_entry_gid(e)) != 0)
        throw_errno(what + ": chown");
    }
    if (::fchmod(fd, mode) != 0) throw_errno(what + ": chmod");
    for (const auto& [n, v] : kept_xattrs(e))
      if (::fsetxattr(fd, n.c_str(), v.data(), v.size(), 0) != 0) ++result.dropped;
  }

  // A relative target is resolved from the link's directory: it may not
  // climb above the root. Absolute targets resolve inside the guest.
  void check_symlink(const std::vector<std::string>& c, const std::string& target,
                     const std::string& what) {
    if (target.empty() || target.size() > kMaxPath) bad(what + ": bad symlink target");
    if (target[0] == '/') return;
    long depth = static_cast<long>(c.size()) - 1;
    size_t i = 0;
    while (i <= target.size()) {
      size_t j = target.find('/', i);
      if (j == std::string::npos) j = target.size();
      std::string part = target.substr(i, j - i);
      if (part == "..") {
        if (--depth < 0) bad(what + ": symlink target '" + target + "' points out of the image");
      } else if (!part.empty() && part != ".") {
        ++depth;
      }
      i = j + 1;
    }
  }

  // `name` in `dir` (`path` below the root) and what is recorded of it.
  void remove(int dir, const std::string& name, const std::string& path) {
    remove_at(dir, name);
    if (!policy_.defer) return;
    auto& m = result.manifest;
    m.erase(path);
    for (auto it = m.lower_bound(path + "/"); it != m.end() && it->first.rfind(path + "/", 0) == 0;)
      it = m.erase(it);
  }

  void hardlink(int d, const std::string& leaf, const std::string& path, const std::string& target,
                const std::string& what) {
    auto tc = split_path(target, what + " (hard link target '" + target.substr(0, 200) + "')");
    if (tc.empty()) bad(what + ": hard link to the root");
    Fd tdir = open_parent(root_.get(), tc, false, what + " (hard link target)");
    struct stat st;
    if (::fstatat(tdir.get(), tc.back().c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
      bad(what + ": hard link target '" + target + "' does not exist in the image");
    if (S_ISDIR(st.st_mode)) bad(what + ": hard link to a directory");
    remove(d, leaf, path);
    if (::linkat(tdir.get(), tc.back().c_str(), d, leaf.c_str(), 0) != 0)
      throw_errno(what + ": link");
    // One inode: the link's path carries its metadata too (either name
    // may be removed by a later layer).
    if (policy_.defer) {
      auto it = result.manifest.find(join(tc, tc.size()));
      if (it != result.manifest.end()) result.manifest[path] = it->second;
    }
  }

  // `.wh..wh..opq`: what lower layers put in this directory goes; what this
  // layer put there stays.
  void opaque(int dir, const std::string& dpath) {
    DIR* dd = ::fdopendir(::fcntl(dir, F_DUPFD_CLOEXEC, 0));
    if (!dd) throw_errno("fdopendir " + dpath);
    std::vector<std::string> kids;
    while (auto* ent = ::readdir(dd)) {
      std::string n = ent->d_name;
      if (n == "." || n == "..") continue;
      if (!created_.count(dpath.empty() ? n : dpath + "/" + n)) kids.push_back(n);
    }
    ::closedir(dd);
    for (const auto& k : kids) remove(dir, k, dpath.empty() ? k : dpath + "/" + k);
  }

  ImportPolicy policy_;
  Fd root_;
  bool is_root_ = false;
  std::set<std::string> created_, seen_;
};

// Unpacks the outer tar (docker save / OCI layout tar) into `dir`: only
// regular files and directories are written; symlinks (docker save links
// identical layers) are recorded as aliases, resolved inside the tree.
std::map<std::string, std::string> unpack_outer(const fs::path& file, const fs::path& dir,
                                                const ImportPolicy& policy) {
  std::map<std::string, std::string> alias;
  auto a = open_archive(file, "the archive");
  const uint64_t file_size = fs::file_size(file);
  const uint64_t budget = std::max(policy.min_layer_budget, policy.max_ratio * file_size);
  auto bomb = [&](const std::string& how) {
    bad("the archive " + how + ", more than " + std::to_string(policy.max_ratio) + " times its " +
        std::to_string(file_size) + " bytes (the expansion ratio limit, " + std::to_string(budget) +
        " bytes): refused as a decompression bomb");
  };
  uint64_t entries = 0;
  Fd root(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (root.get() < 0) throw_errno("open " + dir.string());
  uint64_t total = 0;
  std::set<std::string> seen;
  archive_entry* e;
  std::string last = "(start)";
  for (;;) {
    int r = archive_read_next_header(a.get(), &e);
    if (r == ARCHIVE_EOF) break;
    if (r < ARCHIVE_WARN)
      bad("the archive: unreadable entry after '" + last + "': " + archive_error_string(a.get()));
    std::string name = archive_entry_pathname(e) ? archive_entry_pathname(e) : "";
    last = name.substr(0, 200);
    std::string what = "archive entry '" + last + "'";
    if (++entries > policy.max_archive_entries)
      bad("the archive has more than " + std::to_string(policy.max_archive_entries) +
          " entries (the archive entry limit)");
    if (archive_entry_size_is_set(e) && static_cast<uint64_t>(archive_entry_size(e)) > budget)
      bomb("declares " + std::to_string(archive_entry_size(e)) + " bytes in " + what);
    if (static_cast<uint64_t>(archive_filter_bytes(a.get(), 0)) > budget)
      bomb("expands to more than " + std::to_string(budget) + " bytes");
    auto c = split_path(name, what);
    if (c.empty()) continue;
    std::string path = join(c, c.size());
    if (!seen.insert(path).second) bad(what + ": duplicate entry");
    auto type = archive_entry_filetype(e);
    if (type == AE_IFDIR) {
      Fd d = open_parent(root.get(), c, true, what);
      if (::mkdirat(d.get(), c.back().c_str(), 0755) != 0 && errno != EEXIST)
        throw_errno(what + ": mkdir");
    } else if (type == AE_IFLNK) {
      std::string t = archive_entry_symlink(e) ? archive_entry_symlink(e) : "";
      std::string parent = join(c, c.size() - 1);
      auto tc = split_path((parent.empty() ? "" : parent + "/") + t, what + " (symlink target)");
      alias[path] = join(tc, tc.size());
    } else if (type == AE_IFREG) {
      Fd d = open_parent(root.get(), c, true, what);
      Fd f(::openat(d.get(), c.back().c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                    0600));
      if (f.get() < 0) throw_errno(what + ": create");
      const void* buf;
      size_t len;
      la_int64_t off;
      for (;;) {
        int rr = archive_read_data_block(a.get(), &buf, &len, &off);
        if (rr == ARCHIVE_EOF) break;
        if (rr < ARCHIVE_WARN) bad(what + ": " + archive_error_string(a.get()));
        total += len;
        if (total > policy.max_bytes) bad(what + ": the archive is larger than allowed");
        if (total > budget) bomb("expands to more than " + std::to_string(budget) + " bytes");
        for (size_t done = 0; done < len;) {
          ssize_t n = ::pwrite(f.get(), static_cast<const char*>(buf) + done, len - done,
                               off + static_cast<off_t>(done));
          if (n < 0) throw_errno(what + ": write");
          done += static_cast<size_t>(n);
        }
      }
    }  // anything else in the outer tar is of no use: skipped
  }
  return alias;
}

// A file of the layout by its path inside it (through the outer tar's
// symlink aliases), never outside `dir`.
fs::path layout_file(const fs::path& dir, const std::map<std::string, std::string>& alias,
                     const std::string& rel, const std::string& what) {
  auto c = split_path(rel, what);
  std::string p = join(c, c.size());
  for (int hops = 0; alias.count(p); ++hops) {
    if (hops > 8) bad(what + ": too many symlinks");
    p = alias.at(p);
  }
  fs::path f = dir / p;
  std::error_code ec;
  if (p.empty() || !fs::is_regular_file(fs::symlink_status(f, ec)))
    bad(what + ": '" + rel + "' is not a file in the archive");
  return f;
}

nlohmann::json read_json(const fs::path& f, const std::string& what) {
  if (fs::file_size(f) > (16u << 20)) bad(what + " is larger than 16 MiB");
  try {
    return nlohmann::json::parse(read_file(f));
  } catch (const nlohmann::json::exception& e) {
    bad(what + " is not valid JSON: " + e.what());
  }
}

struct Blob {
  fs::path file;
  uint64_t size = 0;
  std::string digest;
};

// An OCI descriptor's blob, checked: digest syntax, size and sha256.
Blob oci_blob(const fs::path& dir, const std::map<std::string, std::string>& alias,
              const nlohmann::json& desc, const std::string& what) {
  static const std::regex re("sha256:[0-9a-f]{64}");
  std::string digest = desc.value("digest", "");
  if (!std::regex_match(digest, re)) bad(what + ": digest '" + digest + "' is not sha256:<hex>");
  Blob b{layout_file(dir, alias, "blobs/sha256/" + digest.substr(7), what), 0, digest};
  b.size = fs::file_size(b.file);
  if (desc.contains("size") && desc["size"].is_number_unsigned() &&
      desc["size"].get<uint64_t>() != b.size)
    bad(what + ": blob " + digest + " is " + std::to_string(b.size) +
        " bytes, its descriptor says " + std::to_string(desc["size"].get<uint64_t>()));
  if ("sha256:" + sha256_file(b.file) != digest)
    bad(what + ": blob " + digest + " does not match its digest");
  return b;
}

// "sha256:<hex>" of `layer`'s content after decompression (what a docker
// image config's rootfs.diff_ids name), read at most `budget` bytes.
std::string uncompressed_digest(const fs::path& layer, uint64_t budget, const std::string& what) {
  ArchivePtr a(archive_read_new(), archive_read_free);
  archive_read_support_filter_all(a.get());
  archive_read_support_format_raw(a.get());
  archive_entry* e = nullptr;
  if (archive_read_open_filename(a.get(), layer.c_str(), 1 << 16) != ARCHIVE_OK ||
      archive_read_next_header(a.get(), &e) != ARCHIVE_OK)
    bad(what + ": unreadable: " + archive_error_string(a.get()));
  Sha256 h;
  uint64_t total = 0;
  std::string buf(1 << 16, '\0');
  for (;;) {
    la_ssize_t n = archive_read_data(a.get(), buf.data(), buf.size());
    if (n == 0) break;
    if (n < 0) bad(what + ": unreadable: " + archive_error_string(a.get()));
    total += static_cast<uint64_t>(n);
    if (total > budget)
      bad(what + " expands to more than " + std::to_string(budget) +
          " bytes: refused as a decompression bomb");
    h.update(buf.data(), static_cast<size_t>(n));
  }
  return "sha256:" + h.hex();
}

// The docker save config's rootfs.diff_ids, one per layer of manifest.json,
// each a sha256 digest: what every layer is checked against.
std::vector<std::string> diff_ids(const nlohmann::json& cfg, size_t layers,
                                  const std::string& what) {
  static const std::regex re("sha256:[0-9a-f]{64}");
  const nlohmann::json* ids = nullptr;
  if (cfg.is_object() && cfg.contains("rootfs") && cfg["rootfs"].is_object() &&
      cfg["rootfs"].contains("diff_ids") && cfg["rootfs"]["diff_ids"].is_array())
    ids = &cfg["rootfs"]["diff_ids"];
  if (!ids) bad(what + " has no rootfs.diff_ids: its layers cannot be checked");
  if (ids->size() != layers)
    bad(what + " lists " + std::to_string(ids->size()) + " rootfs.diff_ids for " +
        std::to_string(layers) + " layers in manifest.json");
  std::vector<std::string> out;
  for (const auto& d : *ids) {
    if (!d.is_string() || !std::regex_match(d.get<std::string>(), re))
      bad(what + ": a rootfs.diff_ids entry is not sha256:<hex>");
    out.push_back(d.get<std::string>());
  }
  return out;
}

ImageConfig config_from_oci(const nlohmann::json& j) {
  ImageConfig c;
  if (!j.is_object() || !j.contains("config") || !j["config"].is_object()) return c;
  const auto& k = j["config"];
  auto strs = [&](const char* key) {
    std::vector<std::string> v;
    if (k.contains(key) && k[key].is_array())
      for (const auto& s : k[key])
        if (s.is_string()) v.push_back(s.get<std::string>());
    return v;
  };
  for (const auto& kv : strs("Env")) {
    auto eq = kv.find('=');
    if (eq != std::string::npos && eq > 0) c.env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  if (k.contains("WorkingDir") && k["WorkingDir"].is_string()) c.workdir = k["WorkingDir"];
  if (k.contains("User") && k["User"].is_string()) c.user = k["User"];
  c.entrypoint = strs("Entrypoint");
  c.cmd = strs("Cmd");
  if (k.contains("Labels") && k["Labels"].is_object())
    for (const auto& [key, v] : k["Labels"].items())
      if (v.is_string()) c.labels[key] = v.get<std::string>();
  return c;
}

}  // namespace

ImportResult unpack_oci(const fs::path& input, const fs::path& root, const fs::path& scratch,
                        const ImportPolicy& policy) {
  std::error_code ec;
  fs::path layout = input;
  std::map<std::string, std::string> alias;
  if (!fs::is_directory(input, ec)) {
    if (!fs::is_regular_file(input, ec)) bad("no image archive at " + input.string());
    layout = scratch / "layout";
    fs::create_directory(layout);
    alias = unpack_outer(input, layout, policy);
  }
  fs::create_directory(root);
  ::chmod(root.c_str(), 0755);
  Applier applier(root, policy);
  ImageConfig config;
  std::string source;
  auto has = [&](const char* f) {
    return alias.count(f) || fs::is_regular_file(fs::symlink_status(layout / f, ec));
  };
  if (has("index.json")) {
    auto index = read_json(layout_file(layout, alias, "index.json", "index.json"), "index.json");
    if (!index.contains("manifests") || !index["manifests"].is_array() ||
        index["manifests"].empty())
      bad("index.json lists no manifests");
    nlohmann::json desc = index["manifests"][0];
    // A nested index (multi-platform): take linux/amd64, else the first.
    for (int depth = 0; desc.value("mediaType", "").find("index") != std::string::npos; ++depth) {
      if (depth > 2) bad("index.json: image indexes nested too deep");
      auto sub = read_json(oci_blob(layout, alias, desc, "image index").file, "image index");
      if (!sub.contains("manifests") || !sub["manifests"].is_array() || sub["manifests"].empty())
        bad("image index " + desc.value("digest", "") + " lists no manifests");
      desc = sub["manifests"][0];
      for (const auto& m : sub["manifests"])
        if (m.contains("platform") && m["platform"].value("architecture", "") == "amd64" &&
            m["platform"].value("os", "") == "linux")
          desc = m;
    }
    Blob mb = oci_blob(layout, alias, desc, "manifest");
    auto manifest = read_json(mb.file, "manifest " + mb.digest);
    if (!manifest.contains("config") || !manifest.contains("layers") ||
        !manifest["layers"].is_array())
      bad("manifest " + mb.digest + " has no config or layers");
    Blob cb = oci_blob(layout, alias, manifest["config"], "image config");
    config = config_from_oci(read_json(cb.file, "image config " + cb.digest));
    int i = 0;
    for (const auto& l : manifest["layers"]) {
      std::string label = "layer " + std::to_string(++i);
      Blob lb = oci_blob(layout, alias, l, label);
      applier.apply(lb.file, label + " (" + lb.digest.substr(0, 19) + ")", lb.size);
    }
    source = "oci:" + mb.digest;
  } else if (has("manifest.json")) {
    auto m =
        read_json(layout_file(layout, alias, "manifest.json", "manifest.json"), "manifest.json");
    if (!m.is_array() || m.empty() || !m[0].is_object())
      bad("manifest.json is not a list of images");
    const auto& img = m[0];
    if (!img.contains("Config") || !img["Config"].is_string() || !img.contains("Layers") ||
        !img["Layers"].is_array())
      bad("manifest.json: the image has no Config or Layers");
    std::string cfg = img["Config"];
    fs::path cf = layout_file(layout, alias, cfg, "manifest.json Config");
    // The config is named by its own digest (<hex>.json, or
    // blobs/sha256/<hex> in newer docker saves): that name is checked too.
    std::string cfg_hex = sha256_file(cf);
    std::string id = fs::path(cfg).filename().string();
    if (id.size() == 69 && id.substr(64) == ".json") id.resize(64);
    static const std::regex hex64("[0-9a-f]{64}");
    if (std::regex_match(id, hex64) && id != cfg_hex)
      bad("image config " + cfg + " does not match its digest (sha256 " + cfg_hex + ")");
    auto cfg_json = read_json(cf, "image config " + cfg);
    config = config_from_oci(cfg_json);
    auto ids = diff_ids(cfg_json, img["Layers"].size(), "image config " + cfg);
    // Every layer is checked before any is applied.
    std::vector<std::pair<fs::path, std::string>> layers;
    for (const auto& l : img["Layers"]) {
      if (!l.is_string()) bad("manifest.json: a layer is not a path");
      size_t n = layers.size();
      std::string label = "layer " + std::to_string(n + 1) + " (" + l.get<std::string>() + ")";
      fs::path lf = layout_file(layout, alias, l.get<std::string>(), label);
      uint64_t budget = std::max(policy.min_layer_budget, policy.max_ratio * fs::file_size(lf));
      std::string got = uncompressed_digest(lf, budget, label);
      if (got != ids[n])
        bad(label + " does not match its digest: its content is " + got +
            ", the image config's rootfs.diff_ids says " + ids[n]);
      layers.emplace_back(lf, label);
    }
    for (const auto& [lf, label] : layers) applier.apply(lf, label, fs::file_size(lf));
    source = "docker-save:sha256:" + cfg_hex;
  } else {
    bad("neither an OCI image layout (index.json) nor a docker save archive (manifest.json)");
  }
  ImportResult r = applier.result;
  r.config = config;
  r.source = source;
  return r;
}

}  // namespace airlock::storage

// Filesystem helpers shared by the image store's files (image_store.cc,
// image_install.cc, oci_import.cc). Internal to airlock_storage.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"

namespace airlock::storage {

// The guest kernel package: name + Debian version.
struct KernelRef {
  std::string package;  // e.g. linux-image-6.1.0-57-cloud-amd64
  std::string version;  // Debian version, e.g. 6.1.192-3
  std::string dir_name() const { return package + "_" + version; }
};

}  // namespace airlock::storage

namespace airlock::storage::detail {
namespace fs = std::filesystem;

inline std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw Error(Errc::not_found, "cannot read " + p.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_file(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out.flush()) throw Error(Errc::internal, "cannot write " + p.string());
}

// An exclusive flock held for the object's lifetime; serialises builds of the
// same thing across threads and processes, and dies with the process.
class FileLock {
 public:
  explicit FileLock(const fs::path& path) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw_errno("open lock file " + path.string());
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno != EINTR) {
        ::close(fd_);
        throw_errno("flock " + path.string());
      }
    }
  }
  ~FileLock() { ::close(fd_); }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

// Makes a tree writable again (images are read-only) and removes it. A build
// tool may have left a filesystem mounted inside (mmdebstrap's /proc): detach
// those first and never delete through a mount point.
inline void remove_tree(const fs::path& p) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(p, ec))) return;
  std::ifstream mounts("/proc/self/mounts");
  std::vector<std::string> inside;
  std::string prefix = p.string() + "/";
  for (std::string dev, mnt, rest; mounts >> dev >> mnt && std::getline(mounts, rest);) {
    if (mnt.rfind(prefix, 0) == 0) inside.push_back(mnt);
  }
  std::sort(inside.rbegin(), inside.rend());
  for (const auto& m : inside) {
    if (::umount2(m.c_str(), MNT_DETACH) != 0)
      throw Error(Errc::internal, "cannot remove " + p.string() + ": " + m + " is still mounted");
  }
  ::chmod(p.c_str(), 0755);
  for (auto it = fs::recursive_directory_iterator(p, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_directory(ec) && !it->is_symlink(ec)) ::chmod(it->path().c_str(), 0755);
  }
  fs::remove_all(p, ec);
}

// A temporary directory `<parent>/.tmp-<tag>XXXXXX`, removed unless kept.
class TempDir {
 public:
  TempDir(const fs::path& parent, const std::string& tag) {
    std::string tmpl = (parent / (".tmp-" + tag + "XXXXXX")).string();
    if (!::mkdtemp(tmpl.data())) throw_errno("mkdtemp in " + parent.string());
    path_ = tmpl;
  }
  ~TempDir() {
    if (!path_.empty()) remove_tree(path_);
  }
  const fs::path& path() const { return path_; }
  // Renames it to `dest` (atomic on one filesystem); it is no longer removed.
  void commit(const fs::path& dest) {
    fs::rename(path_, dest);
    path_.clear();
  }

 private:
  fs::path path_;
};

// Bytes written under `dir` so far (allocated blocks: images are sparse).
inline uint64_t disk_usage(const fs::path& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (auto it =
           fs::recursive_directory_iterator(dir, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    struct stat st;
    if (::lstat(it->path().c_str(), &st) == 0 && !S_ISDIR(st.st_mode))
      total += static_cast<uint64_t>(st.st_blocks) * 512;
  }
  return total;
}

inline void make_read_only(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file()) ::chmod(e.path().c_str(), 0444);
  }
  ::chmod(dir.c_str(), 0555);
}

// Hard-links `from` to `to` (no copy of a large read-only file); copies when
// the filesystem refuses links.
inline void link_or_copy(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::create_hard_link(from, to, ec);
  if (ec) fs::copy_file(from, to);
}

}  // namespace airlock::storage::detail

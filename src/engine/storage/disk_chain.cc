#include "engine/storage/disk_chain.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/unique_fd.h"

namespace airlock::storage {
namespace fs = std::filesystem;
namespace {

constexpr int kMaxDepth = 16;
constexpr size_t kHeaderRead = 64 * 1024;  // the header and its extensions live in cluster 0
constexpr uint32_t kExtEnd = 0;
constexpr uint32_t kExtBackingFormat = 0xe2792aca;
constexpr uint32_t kExtDataFile = 0x44415441;
constexpr uint64_t kIncompatDataFile = 1u << 2;

uint64_t be(const unsigned char* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v = v << 8 | p[i];
  return v;
}

[[noreturn]] void refuse(const std::string& what, const std::string& why) {
  throw Error(Errc::unavailable, what + " is refused: " + why);
}

// One header, read from an fd opened without following a symlink.
struct Header {
  bool qcow2 = false;
  uint64_t size = 0;
  std::string backing;         // "" = none
  std::string backing_format;  // from the header extension, "" = not named
};

Header read_header(const fs::path& file, const std::string& what) {
  UniqueFd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK));
  if (fd.fd < 0) refuse(what, "cannot open " + file.string() + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0 || !S_ISREG(st.st_mode))
    refuse(what, file.string() + " is not a regular file");
  std::string buf(kHeaderRead, '\0');
  ssize_t n = ::pread(fd.fd, buf.data(), buf.size(), 0);
  Header h;
  h.size = static_cast<uint64_t>(st.st_size);
  if (n < 0) refuse(what, "cannot read " + file.string());
  buf.resize(static_cast<size_t>(n));
  auto* u = reinterpret_cast<const unsigned char*>(buf.data());
  if (buf.size() < 72 || std::memcmp(u, "QFI\xfb", 4) != 0) {
    return h;  // raw
  }
  h.qcow2 = true;
  uint64_t version = be(u + 4, 4);
  if (version != 2 && version != 3)
    refuse(what, file.string() + " has qcow2 version " + std::to_string(version));
  h.size = be(u + 24, 8);
  uint64_t off = be(u + 8, 8);
  uint64_t len = be(u + 16, 4);
  uint64_t hdr_len = 72;
  if (version == 3) {
    if (buf.size() < 104) refuse(what, file.string() + " has a short qcow2 header");
    if (be(u + 72, 8) & kIncompatDataFile)
      refuse(what, file.string() + " names an external data file");
    hdr_len = be(u + 100, 4);
  }
  // Header extensions: type, length, data padded to 8 bytes.
  for (uint64_t p = hdr_len; p + 8 <= buf.size();) {
    uint32_t type = static_cast<uint32_t>(be(u + p, 4));
    uint64_t elen = be(u + p + 4, 4);
    if (type == kExtEnd) break;
    if (p + 8 + elen > buf.size()) break;
    if (type == kExtDataFile) refuse(what, file.string() + " names an external data file");
    if (type == kExtBackingFormat) h.backing_format.assign(buf.data() + p + 8, elen);
    p += 8 + ((elen + 7) & ~uint64_t{7});
  }
  if (off != 0 && len != 0) {
    if (len > 1023)
      refuse(what, file.string() + " has a backing name of " + std::to_string(len) + " bytes");
    h.backing.assign(len, '\0');
    ssize_t got = ::pread(fd.fd, h.backing.data(), len, static_cast<off_t>(off));
    if (got != static_cast<ssize_t>(len))
      refuse(what, file.string() + " has an unreadable backing name");
  }
  return h;
}

bool has_magic(const fs::path& file) {
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return false;
  char m[4] = {};
  bool q = ::pread(fd, m, 4, 0) == 4 && std::memcmp(m, "QFI\xfb", 4) == 0;
  ::close(fd);
  return q;
}

fs::path resolved(const fs::path& p) {
  std::error_code ec;
  fs::path c = fs::weakly_canonical(p, ec);
  return ec ? p : c;
}

}  // namespace

bool path_inside(const fs::path& p, const fs::path& dir) {
  auto rel = resolved(p).lexically_relative(resolved(fs::absolute(dir).lexically_normal()));
  return !rel.empty() && *rel.begin() != ".." && *rel.begin() != ".";
}

std::vector<ChainLink> disk_chain(const fs::path& top, const std::vector<fs::path>& roots,
                                  const std::string& what) {
  std::vector<ChainLink> chain;
  fs::path cur = fs::absolute(top).lexically_normal();
  std::string format;  // of `cur`, as its parent's header named it ("" = detect)
  for (int depth = 0;; ++depth) {
    if (depth >= kMaxDepth) refuse(what, "its backing chain is deeper than 16 files");
    for (const auto& l : chain)
      if (l.path == cur) refuse(what, "its backing chain loops at " + cur.string());
    if (depth > 0) {
      bool inside = false;
      for (const auto& r : roots) inside = inside || path_inside(cur, r);
      if (!inside) {
        fs::path real = resolved(cur);
        refuse(what, "it is backed by " + cur.string() +
                         (real != cur ? " (which is " + real.string() + ")" : std::string()) +
                         ", outside airlock's own directories");
      }
      struct stat st {};
      if (::lstat(cur.c_str(), &st) != 0)
        refuse(what, "its backing file " + cur.string() + " is missing");
      if (!S_ISREG(st.st_mode))
        refuse(what, "its backing file " + cur.string() + " is not a regular file");
    }
    Header h = read_header(cur, what);
    if (format.empty()) format = h.qcow2 ? "qcow2" : "raw";
    if (format != "qcow2" && format != "raw")
      refuse(what, cur.string() + " is named with format '" + format + "'");
    if (format == "qcow2" && !h.qcow2) refuse(what, cur.string() + " is not a qcow2 file");
    chain.push_back({cur, format, h.size});
    if (format == "raw" || h.backing.empty()) return chain;
    if (h.backing.find('\0') != std::string::npos || h.backing.find(':') != std::string::npos)
      refuse(what, "its backing name '" + h.backing.substr(0, h.backing.find('\0')) +
                       "' is not a plain file name");
    fs::path next(h.backing);
    cur = (next.is_absolute() ? next : cur.parent_path() / next).lexically_normal();
    format = h.backing_format;
    if (format.empty()) format = has_magic(cur) ? "qcow2" : "raw";
  }
}

std::string image_opts(const std::vector<ChainLink>& chain, bool force_share) {
  if (chain.empty()) throw Error(Errc::internal, "empty disk chain");
  nlohmann::json node = nullptr;
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    nlohmann::json n = {{"driver", it->format},
                        {"file", {{"driver", "file"}, {"filename", it->path.string()}}}};
    if (it->format == "qcow2") n["backing"] = node;
    node = std::move(n);
  }
  if (force_share) node["force-share"] = true;
  return "json:" + node.dump();
}

}  // namespace airlock::storage

#include "engine/confine/acl.h"

#include <sys/stat.h>
#include <sys/xattr.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "common/error.h"

namespace airlock::engine::confine {
namespace {

// The kernel's posix_acl_xattr layout: version 2, then {tag, perm, id}
// sorted by tag, then id.
constexpr const char* kName = "system.posix_acl_access";
constexpr uint32_t kVersion = 2;
constexpr uint32_t kNoId = ~0u;
enum Tag : uint16_t { user_obj = 1, user = 2, group_obj = 4, group = 8, mask = 0x10, other = 0x20 };

struct Entry {
  uint16_t tag, perm;
  uint32_t id;
};

// Two jobs may grant on one file (two `changes` over clones of one
// template): each read-modify-write of an ACL is one at a time.
std::mutex& acl_mutex() {
  static std::mutex m;
  return m;
}

// The file's ACL, or the one its mode stands for.
std::vector<Entry> read_acl(int fd) {
  std::vector<Entry> out;
  char buf[4 + 8 * 64];
  ssize_t n = ::fgetxattr(fd, kName, buf, sizeof buf);
  if (n >= 4) {
    for (ssize_t off = 4; off + 8 <= n; off += 8) {
      Entry e;
      std::memcpy(&e, buf + off, 8);
      out.push_back(e);
    }
    return out;
  }
  struct stat st {};
  ::fstat(fd, &st);
  auto bits = [&](int shift) { return static_cast<uint16_t>((st.st_mode >> shift) & 7); };
  return {{user_obj, bits(6), kNoId}, {group_obj, bits(3), kNoId}, {other, bits(0), kNoId}};
}

bool has_named(const std::vector<Entry>& acl) {
  return std::any_of(acl.begin(), acl.end(),
                     [](const Entry& e) { return e.tag == user || e.tag == group; });
}

int write_acl(int fd, std::vector<Entry> acl) {
  acl.erase(std::remove_if(acl.begin(), acl.end(), [](const Entry& e) { return e.tag == mask; }),
            acl.end());
  uint16_t m = 0;
  for (const auto& e : acl)
    if (e.tag == user || e.tag == group || e.tag == group_obj) m |= e.perm;
  acl.push_back({mask, m, kNoId});
  std::sort(acl.begin(), acl.end(), [](const Entry& a, const Entry& b) {
    return a.tag != b.tag ? a.tag < b.tag : a.id < b.id;
  });
  std::string out(4, '\0');
  std::memcpy(out.data(), &kVersion, 4);
  out.append(reinterpret_cast<const char*>(acl.data()), acl.size() * sizeof(Entry));
  return ::fsetxattr(fd, kName, out.data(), out.size(), 0);
}

}  // namespace

void grant_user(int fd, uint32_t uid, uint16_t perm, const char* what) {
  std::lock_guard lock(acl_mutex());
  auto acl = read_acl(fd);
  auto it = std::find_if(acl.begin(), acl.end(),
                         [&](const Entry& e) { return e.tag == user && e.id == uid; });
  if (it != acl.end())
    it->perm |= perm;
  else
    acl.push_back({user, perm, uid});
  if (write_acl(fd, acl) != 0) throw_errno(std::string("grant the confined uid access to ") + what);
}

void revoke_user(int fd, uint32_t uid) {
  std::lock_guard lock(acl_mutex());
  auto acl = read_acl(fd);
  acl.erase(std::remove_if(acl.begin(), acl.end(),
                           [&](const Entry& e) { return e.tag == user && e.id == uid; }),
            acl.end());
  if (has_named(acl)) {
    write_acl(fd, acl);
    return;
  }
  uint16_t g = 0;
  for (const auto& e : acl)
    if (e.tag == group_obj) g = e.perm;
  struct stat st {};
  ::fstat(fd, &st);
  ::fremovexattr(fd, kName);
  ::fchmod(fd, (st.st_mode & 07707) | static_cast<mode_t>(g << 3));
}

}  // namespace airlock::engine::confine

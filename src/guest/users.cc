#include "guest/users.h"

#include <sys/stat.h>

#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>

namespace airlock::guest {
namespace {

std::vector<std::string> split(const std::string& line, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : line) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  out.push_back(cur);
  return out;
}

std::optional<unsigned long> number(const std::string& s) {
  if (s.empty() || s.size() > 10) return std::nullopt;
  for (char c : s)
    if (c < '0' || c > '9') return std::nullopt;
  return std::stoul(s);
}

// What identifies a version of a file: any write moves mtime/ctime, a
// rename-over changes the inode. A file that cannot be stat'ed has none.
using FileId = std::tuple<dev_t, ino_t, off_t, int64_t, int64_t, int64_t, int64_t>;
std::optional<FileId> file_id(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileId{st.st_dev,          st.st_ino,         st.st_size,        st.st_mtim.tv_sec,
                st.st_mtim.tv_nsec, st.st_ctim.tv_sec, st.st_ctim.tv_nsec};
}

std::optional<User> read_user(const std::string& spec, const std::string& passwd,
                              const std::string& group) {
  auto as_uid = number(spec);
  std::optional<User> found;
  std::ifstream pw(passwd);
  std::string line;
  while (std::getline(pw, line)) {
    auto f = split(line, ':');
    if (f.size() < 7) continue;
    auto uid = number(f[2]), gid = number(f[3]);
    if (!uid || !gid) continue;
    if (as_uid ? *uid != *as_uid : f[0] != spec) continue;
    found = User{static_cast<uid_t>(*uid),  static_cast<gid_t>(*gid),        f[0],
                 f[5].empty() ? "/" : f[5], f[6].empty() ? "/bin/sh" : f[6], {}};
    break;
  }
  if (!found) {
    if (!as_uid) return std::nullopt;
    found =
        User{static_cast<uid_t>(*as_uid), static_cast<gid_t>(*as_uid), spec, "/", "/bin/sh", {}};
  }
  found->groups.push_back(found->gid);
  std::ifstream gr(group);
  while (std::getline(gr, line)) {
    auto f = split(line, ':');
    if (f.size() < 4) continue;
    auto gid = number(f[2]);
    if (!gid) continue;
    for (const auto& member : split(f[3], ','))
      if (member == found->name && static_cast<gid_t>(*gid) != found->gid)
        found->groups.push_back(static_cast<gid_t>(*gid));
  }
  return found;
}

}  // namespace

std::optional<User> lookup_user(const std::string& spec, const std::string& passwd,
                                const std::string& group) {
  struct Entry {
    FileId pw, gr;
    std::optional<User> user;
  };
  static std::mutex mu;
  static std::map<std::tuple<std::string, std::string, std::string>, Entry> memo;
  auto pw = file_id(passwd), gr = file_id(group);
  auto key = std::make_tuple(spec, passwd, group);
  if (pw && gr) {
    std::lock_guard lock(mu);
    auto it = memo.find(key);
    if (it != memo.end() && it->second.pw == *pw && it->second.gr == *gr) return it->second.user;
  }
  auto user = read_user(spec, passwd, group);
  // Remembered only if neither file changed while it was read; a handful of
  // users in practice, so the memo is simply bounded.
  if (pw && gr && file_id(passwd) == pw && file_id(group) == gr) {
    std::lock_guard lock(mu);
    if (memo.size() >= 64) memo.clear();
    memo[key] = Entry{*pw, *gr, user};
  }
  return user;
}

namespace {

// Field 0 of the first line of `file` whose field 2 is `id`.
std::string name_of(unsigned long id, const std::string& file) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    auto f = split(line, ':');
    if (f.size() >= 3 && !f[0].empty() && number(f[2]) == id) return f[0];
  }
  return std::to_string(id);
}
}  // namespace

std::string user_name(uid_t uid, const std::string& passwd) { return name_of(uid, passwd); }
std::string group_name(gid_t gid, const std::string& group) { return name_of(gid, group); }

}  // namespace airlock::guest

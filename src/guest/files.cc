// File operations (api/guest-protocol.md §5): write_file/read_file stream
// content under credit; list/stat/mkdir/remove/info answer at once.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysinfo.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <map>
#include <optional>
#include <random>

#include "common/error.h"
#include "guest/ops.h"
#include "guest/users.h"
#include "protocol/messages.h"

namespace airlock::guest {
namespace {

using nlohmann::json;
using protocol::kInitialCredit;
namespace code = protocol::code;

std::string dirname_of(const std::string& p) {
  size_t slash = p.find_last_of('/');
  return slash == 0 ? "/" : p.substr(0, slash);
}
std::string basename_of(const std::string& p) { return p.substr(p.find_last_of('/') + 1); }

const char* type_name(mode_t m) {
  if (S_ISREG(m)) return "file";
  if (S_ISDIR(m)) return "dir";
  if (S_ISLNK(m)) return "symlink";
  return "other";
}

double mtime_of(const struct stat& st) {
  return static_cast<double>(st.st_mtim.tv_sec) + st.st_mtim.tv_nsec / 1e9;
}

// The optional "owner" field (a user name or uid): what a write, mkdir or
// move creates is chowned to that user and its primary group, as envd does
// for the user an E2B call runs as. not_found for an unknown name.
std::optional<User> parse_owner(const json& req) {
  auto it = req.find("owner");
  if (it == req.end() || it->is_null()) return std::nullopt;
  if (!it->is_string() || it->get<std::string>().empty() || it->get<std::string>().size() > 64)
    throw Error(Errc::invalid_argument, "owner must be a user name or uid", "owner");
  auto u = lookup_user(it->get<std::string>());
  if (!u) throw GuestError(code::not_found, "no user " + it->get<std::string>());
  return u;
}

void chown_to(const std::string& path, const std::optional<User>& owner) {
  if (owner && lchown(path.c_str(), owner->uid, owner->gid) != 0) throw_sys("chown " + path);
}

// mkdir -p; existing directories are fine. Directories it makes belong to
// `owner` if given.
void make_dirs(const std::string& path, mode_t mode, const std::optional<User>& owner = {}) {
  struct stat st {};
  if (stat(path.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) {
      errno = ENOTDIR;
      throw_sys("mkdir " + path);
    }
    return;
  }
  if (path != "/") make_dirs(dirname_of(path), 0755, owner);
  if (mkdir(path.c_str(), mode) != 0) {
    if (errno != EEXIST) throw_sys("mkdir " + path);
    return;
  }
  chown_to(path, owner);
}

// Names of uids/gids for one response (each /etc file read once per id).
class Names {
 public:
  const std::string& user(uid_t uid) {
    auto it = users_.find(uid);
    return it != users_.end() ? it->second : users_[uid] = user_name(uid);
  }
  const std::string& group(gid_t gid) {
    auto it = groups_.find(gid);
    return it != groups_.end() ? it->second : groups_[gid] = group_name(gid);
  }

 private:
  std::map<uid_t, std::string> users_;
  std::map<gid_t, std::string> groups_;
};

// One entry of list/stat/move (lstat `st` of `path`): a symlink also
// carries its fully resolved target (the link's own path if it does not
// resolve) and, when that exists, the target's type and mode.
json entry_of(const std::string& path, const struct stat& st, Names& names) {
  json j = {{"name", path == "/" ? "/" : basename_of(path)},
            {"path", path},
            {"type", type_name(st.st_mode)},
            {"size", st.st_size},
            {"mode", st.st_mode & 07777},
            {"mtime", mtime_of(st)},
            {"uid", st.st_uid},
            {"gid", st.st_gid},
            {"owner", names.user(st.st_uid)},
            {"group", names.group(st.st_gid)}};
  if (S_ISLNK(st.st_mode)) {
    char buf[PATH_MAX];
    j["target"] = realpath(path.c_str(), buf) ? std::string(buf) : path;
    struct stat ts {};
    if (stat(path.c_str(), &ts) == 0) {
      j["target_type"] = type_name(ts.st_mode);
      j["target_mode"] = ts.st_mode & 07777;
    }
  }
  return j;
}

json stat_entry(const std::string& path, const std::string& op) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) throw_sys(op + " " + path);
  Names names;
  return entry_of(path, st, names);
}

std::string join(const std::string& dir, const std::string& name) {
  return dir == "/" ? "/" + name : dir + "/" + name;
}

// Depth-first walk for list: children sorted by name, symlinks not
// followed, `depth` levels below `dir`; the first `skip` entries are
// passed over (the host pages with "offset"). Stops adding once the
// response would not fit one frame (`full`).
void walk(const std::string& dir, int depth, Names& names, json& entries, size_t& bytes, bool& full,
          uint64_t& skip) {
  DIR* d = opendir(dir.c_str());
  if (!d) return;  // unreadable or raced away below the top: skipped, like envd
  std::vector<std::pair<std::string, struct stat>> items;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    struct stat st {};
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;  // raced away
    items.emplace_back(std::move(name), st);
  }
  closedir(d);
  std::sort(items.begin(), items.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [name, st] : items) {
    if (full) return;
    const std::string path = join(dir, name);
    const bool descend = depth > 1 && S_ISDIR(st.st_mode);
    if (skip > 0) {
      --skip;
      if (descend) walk(path, depth - 1, names, entries, bytes, full, skip);
      continue;
    }
    json j = entry_of(path, st, names);
    bytes += j.dump(-1, ' ', false, json::error_handler_t::replace).size() + 1;
    if (bytes > protocol::kMaxPayload - 64) {
      full = true;
      return;
    }
    entries.push_back(std::move(j));
    if (descend) walk(path, depth - 1, names, entries, bytes, full, skip);
  }
}

mode_t parse_mode(const json& req, int64_t fallback) {
  return static_cast<mode_t>(protocol::optional_int(req, "mode", fallback, 0, 07777));
}

class WriteFile : public Stream {
 public:
  WriteFile(Server& s, uint32_t id) : Stream(s, id) {}
  ~WriteFile() override { abort(); }

  void start(const json& req) {
    path_ = require_path(req);
    if (path_ == "/") throw GuestError(code::is_a_directory, "write_file /: is a directory");
    mode_ = parse_mode(req, 0644);
    owner_ = parse_owner(req);
    const std::string dir = dirname_of(path_);
    if (protocol::optional_bool(req, "parents", false)) make_dirs(dir, 0755, owner_);
    struct stat st {};
    if (stat(path_.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
      throw GuestError(code::is_a_directory, "write_file " + path_ + ": is a directory");
    // A temp file beside the target, so the final rename is atomic.
    std::random_device rd;
    for (int attempt = 0; fd_ < 0; ++attempt) {
      tmp_ = dir + "/." + basename_of(path_).substr(0, 200) + ".airlock-" +
             std::to_string(rd() % 1000000000);
      fd_ = open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      if (fd_ < 0 && (errno != EEXIST || attempt > 10)) throw_sys("write_file " + path_);
    }
    if (owner_ && fchown(fd_, owner_->uid, owner_->gid) != 0)
      throw_sys("write_file chown " + path_);
  }

  void on_data(uint8_t ch, const std::string& bytes) override {
    if (ch != 0 || bytes.size() > window_) {
      fail(code::protocol_error, ch != 0 ? "write_file takes data only on channel 0"
                                         : "write_file data beyond the granted credit");
      return;
    }
    size_t off = 0;
    while (off < bytes.size()) {
      ssize_t n = write(fd_, bytes.data() + off, bytes.size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        int e = n < 0 ? errno : EIO;
        fail(protocol::code_for_errno(e), "write_file " + path_ + ": " + strerror(e));
        return;
      }
      off += n;
    }
    size_ += bytes.size();
    // Written to the file: the host may send that much more.
    server_.send_credit(id_, 0, bytes.size());
  }

  void on_eof(uint8_t ch) override {
    if (ch != 0) return;
    if (fchmod(fd_, mode_) != 0 || close(fd_) != 0) {
      int e = errno;
      fd_ = -1;
      fail(protocol::code_for_errno(e), "write_file " + path_ + ": " + strerror(e));
      return;
    }
    fd_ = -1;
    if (rename(tmp_.c_str(), path_.c_str()) != 0) {
      int e = errno;
      fail(protocol::code_for_errno(e), "write_file rename to " + path_ + ": " + strerror(e));
      return;
    }
    tmp_.clear();
    server_.finish(id_, {{"size", size_}});
  }

  void abort() override {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
    if (!tmp_.empty()) unlink(tmp_.c_str());
    tmp_.clear();
  }

 private:
  std::string path_, tmp_;
  mode_t mode_ = 0644;
  std::optional<User> owner_;
  int fd_ = -1;
  uint64_t size_ = 0;
  uint64_t window_ = kInitialCredit;
};

class ReadFile : public Stream {
 public:
  ReadFile(Server& s, uint32_t id) : Stream(s, id) {}
  ~ReadFile() override { abort(); }

  void start(const json& req) {
    path_ = require_path(req);
    fd_ = open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd_ < 0) throw_sys("read_file " + path_);
    struct stat st {};
    fstat(fd_, &st);
    if (S_ISDIR(st.st_mode))
      throw GuestError(code::is_a_directory, "read_file " + path_ + ": is a directory");
    if (!S_ISREG(st.st_mode))
      throw GuestError(code::invalid_argument, "read_file " + path_ + ": not a regular file (" +
                                                   type_name(st.st_mode) + ")");
  }

  bool wants_pump() const override { return fd_ >= 0 && credit_ > 0; }

  void pump() override {
    char buf[protocol::kMaxPayload];
    ssize_t n = read(fd_, buf, std::min<uint64_t>(credit_, sizeof buf));
    if (n < 0 && errno == EINTR) return;
    if (n < 0) {
      int e = errno;
      fail(protocol::code_for_errno(e), "read_file " + path_ + ": " + strerror(e));
      return;
    }
    if (n > 0) {
      server_.send_data(id_, 1, buf, n);
      credit_ -= n;
      size_ += n;
      return;
    }
    abort();
    protocol::Frame eof;
    eof.type = protocol::Type::eof;
    eof.channel = 1;
    eof.stream = id_;
    server_.send(eof);
    server_.finish(id_, {{"size", size_}});
  }

  void on_credit(uint8_t ch, uint32_t bytes) override {
    if (ch == 1) credit_ = std::min<uint64_t>(credit_ + bytes, UINT32_MAX);
  }

  void abort() override {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t credit_ = kInitialCredit;
  uint64_t size_ = 0;
};

int remove_entry(const char* p, const struct stat*, int flag, FTW*) {
  int r = flag == FTW_DP ? rmdir(p) : unlink(p);
  return r == 0 ? 0 : errno;
}

}  // namespace

void throw_sys(const std::string& what) {
  int e = errno;
  throw GuestError(protocol::code_for_errno(e), what + ": " + strerror(e));
}

std::string require_path(const json& req) {
  std::string p = protocol::require_string(req, "path");
  if (p.empty() || p[0] != '/')
    throw Error(Errc::invalid_argument, "path must be absolute, got '" + p + "'", "path");
  if (p.find('\0') != std::string::npos)
    throw Error(Errc::invalid_argument, "path contains a NUL byte", "path");
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

std::unique_ptr<Stream> start_write_file(Server& server, uint32_t id, const json& req) {
  auto s = std::make_unique<WriteFile>(server, id);
  s->start(req);
  return s;
}

std::unique_ptr<Stream> start_read_file(Server& server, uint32_t id, const json& req) {
  auto s = std::make_unique<ReadFile>(server, id);
  s->start(req);
  return s;
}

json op_list(const json& req) {
  const std::string path = require_path(req);
  const int depth = static_cast<int>(protocol::optional_int(req, "depth", 1, 1, 64));
  uint64_t skip = static_cast<uint64_t>(protocol::optional_int(req, "offset", 0, 0, 1 << 30));
  DIR* d = opendir(path.c_str());
  if (!d) throw_sys("list " + path);
  closedir(d);
  // One response must fit one frame: stop before kMaxPayload and say so.
  json entries = json::array();
  Names names;
  size_t bytes = 64;
  bool truncated = false;
  walk(path, depth, names, entries, bytes, truncated, skip);
  json r = {{"entries", std::move(entries)}};
  if (truncated) r["truncated"] = true;
  return r;
}

json op_stat(const json& req) { return stat_entry(require_path(req), "stat"); }

json op_move(const json& req) {
  const std::string from = require_path(req);
  json dest_req = {{"path", req.contains("dest") ? req["dest"] : json()}};
  if (!req.contains("dest")) throw Error(Errc::invalid_argument, "dest is required", "dest");
  std::string to;
  try {
    to = require_path(dest_req);
  } catch (const Error& e) {
    throw Error(Errc::invalid_argument, std::string(e.what()), "dest");
  }
  if (from == "/" || to == "/")
    throw Error(Errc::invalid_argument, "refusing to move / or onto /",
                from == "/" ? "path" : "dest");
  auto owner = parse_owner(req);
  struct stat st {};
  if (lstat(from.c_str(), &st) != 0) throw_sys("move " + from);
  if (protocol::optional_bool(req, "parents", false)) make_dirs(dirname_of(to), 0755, owner);
  if (rename(from.c_str(), to.c_str()) != 0) throw_sys("move " + from + " to " + to);
  return stat_entry(to, "move");
}

json op_mkdir(const json& req) {
  const std::string path = require_path(req);
  const mode_t mode = parse_mode(req, 0755);
  auto owner = parse_owner(req);
  if (protocol::optional_bool(req, "parents", false)) {
    make_dirs(path, mode, owner);
  } else if (mkdir(path.c_str(), mode) != 0) {
    throw_sys("mkdir " + path);
  } else {
    chown_to(path, owner);
  }
  return json::object();
}

json op_remove(const json& req) {
  const std::string path = require_path(req);
  if (path == "/") throw Error(Errc::invalid_argument, "refusing to remove /", "path");
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) throw_sys("remove " + path);
  if (!S_ISDIR(st.st_mode)) {
    if (unlink(path.c_str()) != 0) throw_sys("remove " + path);
  } else if (protocol::optional_bool(req, "recursive", false)) {
    // Depth-first, never following symlinks, staying on this filesystem.
    int r = nftw(path.c_str(), remove_entry, 32, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
    if (r != 0) {
      errno = r > 0 ? r : errno;
      throw_sys("remove " + path);
    }
  } else if (rmdir(path.c_str()) != 0) {
    if (errno == EEXIST) errno = ENOTEMPTY;
    throw_sys("remove " + path);
  }
  return json::object();
}

// Flushes every filesystem to its disk, so the host's read of the disk
// layers (airlock diff) sees what the guest wrote.
json op_sync(const json&) {
  ::sync();
  // sync() commits ext4's journal but leaves the metadata there until a
  // checkpoint; the host reads the disk layers without replaying it (the
  // filesystem diff, a snapshot's layer), so a file written just before
  // could still be missing from them. Freezing the root filesystem
  // checkpoints the journal; it is thawed at once (writers wait at most
  // for that). Only as the guest's init (PID 1): the agent's tests run
  // it on a development host, whose root it must never freeze.
  if (::getpid() == 1) {
    int fd = ::open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
      if (::ioctl(fd, FIFREEZE, 0) == 0) ::ioctl(fd, FITHAW, 0);
      ::close(fd);
    }
  }
  return json::object();
}

json op_info(const json&) {
  utsname u{};
  uname(&u);
  struct sysinfo si {};
  sysinfo(&si);
  struct statvfs vfs {};
  statvfs("/", &vfs);
  // MemAvailable is only in /proc/meminfo.
  uint64_t avail_kb = 0;
  if (FILE* f = fopen("/proc/meminfo", "re")) {
    char line[256];
    while (fgets(line, sizeof line, f))
      if (sscanf(line, "MemAvailable: %lu kB", &avail_kb) == 1) break;
    fclose(f);
  }
  double uptime = 0;
  if (FILE* f = fopen("/proc/uptime", "re")) {
    if (fscanf(f, "%lf", &uptime) != 1) uptime = si.uptime;
    fclose(f);
  }
  return {{"kernel", u.release},
          {"hostname", u.nodename},
          {"uptime_s", uptime},
          {"mem_total_kb", static_cast<uint64_t>(si.totalram) * si.mem_unit / 1024},
          {"mem_available_kb", avail_kb},
          {"disk_total_bytes", static_cast<uint64_t>(vfs.f_blocks) * vfs.f_frsize},
          {"disk_free_bytes", static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize},
          {"agent_version", protocol::kAgentVersion},
          {"cpus", static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN))},
          {"watch", watch_info()}};
}

}  // namespace airlock::guest

#include "engine/fsdiff/fsdiff.h"

// clang-format off
#include <ext2fs/ext2_fs.h>
#include <ext2fs/ext2fs.h>
// clang-format on
#include <et/com_err.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <vector>

#include "common/error.h"
#include "common/subprocess.h"

namespace airlock::engine::fsdiff {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;
int64_t ms_since(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

struct Node {
  char type = 'o';  // f d l o
  uint64_t size = 0;
  uint32_t mode = 0;  // permission bits (07777)
  uint32_t uid = 0, gid = 0;
  ext2_ino_t ino = 0;
  std::string target;  // symlinks: the target, as data
};

const char* type_name(char t) {
  switch (t) {
    case 'f':
      return "file";
    case 'd':
      return "dir";
    case 'l':
      return "symlink";
    default:
      return "other";
  }
}

std::string octal(uint32_t mode) {
  char buf[8];
  snprintf(buf, sizeof buf, "%04o", mode & 07777);
  return buf;
}

// One ext4 filesystem opened read-only. Every libext2fs failure becomes
// Error(unavailable) naming `what` (before/after).
class Fs {
 public:
  Fs(const fs::path& path, std::string what) : what_(std::move(what)) {
    errcode_t e = ext2fs_open(path.c_str(), EXT2_FLAG_64BITS, 0, 0, unix_io_manager, &fs_);
    if (e) {
      fs_ = nullptr;
      throw Error(Errc::unavailable,
                  "the " + what_ + " disk is not a readable ext4 filesystem: " + error_message(e));
    }
  }
  ~Fs() {
    if (fs_) ext2fs_close_free(&fs_);
  }
  Fs(const Fs&) = delete;
  Fs& operator=(const Fs&) = delete;

  // Every path under / (the root included), bounded by `lim`.
  std::map<std::string, Node> walk(const Limits& lim, uint64_t& skipped) {
    std::map<std::string, Node> out;
    struct Item {
      ext2_ino_t ino;
      std::string path;
      int depth;
    };
    std::vector<Item> stack{{EXT2_ROOT_INO, "/", 0}};
    std::set<ext2_ino_t> seen_dirs{EXT2_ROOT_INO};
    Node root;
    if (!stat(EXT2_ROOT_INO, root))
      throw Error(Errc::unavailable, "the " + what_ + " disk has no root");
    out["/"] = root;
    struct Ctx {
      Fs* self;
      const Limits* lim;
      std::map<std::string, Node>* out;
      std::vector<Item>* stack;
      std::set<ext2_ino_t>* seen;
      const Item* cur;
      uint64_t* skipped;
      bool over = false;
    };
    while (!stack.empty()) {
      Item it = std::move(stack.back());
      stack.pop_back();
      Ctx ctx{this, &lim, &out, &stack, &seen_dirs, &it, &skipped};
      auto cb = [](ext2_ino_t, int, struct ext2_dir_entry* d, int, int, char*, void* priv) -> int {
        auto& c = *static_cast<Ctx*>(priv);
        int len = ext2fs_dirent_name_len(d);
        std::string_view name(d->name, static_cast<size_t>(len));
        if (d->inode == 0 || name == "." || name == "..") return 0;
        // A name the kernel could never have made: corrupt (or hostile).
        if (name.empty() || name.find('/') != std::string_view::npos ||
            name.find('\0') != std::string_view::npos) {
          ++*c.skipped;
          return 0;
        }
        if (c.out->size() >= c.lim->max_entries) {
          c.over = true;
          return DIRENT_ABORT;
        }
        std::string path = (c.cur->path == "/" ? "" : c.cur->path) + "/" + std::string(name);
        Node n;
        if (!c.self->stat(d->inode, n)) {
          ++*c.skipped;
          return 0;
        }
        if (n.type == 'd' && c.cur->depth + 1 < c.lim->max_depth && c.seen->insert(d->inode).second)
          c.stack->push_back({d->inode, path, c.cur->depth + 1});
        (*c.out)[path] = std::move(n);
        return 0;
      };
      errcode_t e = ext2fs_dir_iterate2(fs_, it.ino, 0, nullptr, cb, &ctx);
      if (ctx.over)
        throw Error(Errc::unavailable, "the " + what_ + " disk has more than " +
                                           std::to_string(lim.max_entries) +
                                           " entries; not diffed");
      if (e) ++skipped;  // an unreadable directory: its entries are not listed
    }
    return out;
  }

  bool stat(ext2_ino_t ino, Node& n) {
    ext2_inode inode{};
    if (ino < 1 || ino > fs_->super->s_inodes_count) return false;
    if (ext2fs_read_inode(fs_, ino, &inode)) return false;
    n.ino = ino;
    n.size = EXT2_I_SIZE(&inode);
    n.mode = inode.i_mode & 07777;
    n.uid = inode_uid(inode);
    n.gid = inode_gid(inode);
    if (LINUX_S_ISREG(inode.i_mode))
      n.type = 'f';
    else if (LINUX_S_ISDIR(inode.i_mode))
      n.type = 'd';
    else if (LINUX_S_ISLNK(inode.i_mode))
      n.type = 'l';
    if (n.type == 'l') n.target = link_target(ino, inode);
    return true;
  }

  // Up to `max` bytes of a file's content; false if unreadable.
  bool read(ext2_ino_t ino, uint64_t offset, uint64_t max, std::string& out) {
    out.clear();
    ext2_file_t f;
    if (ext2fs_file_open(fs_, ino, 0, &f)) return false;
    bool ok = ext2fs_file_llseek(f, offset, EXT2_SEEK_SET, nullptr) == 0;
    char buf[65536];
    while (ok && out.size() < max) {
      unsigned int got = 0;
      auto want = static_cast<unsigned int>(std::min<uint64_t>(sizeof buf, max - out.size()));
      if (ext2fs_file_read(f, buf, want, &got)) ok = false;
      if (got == 0) break;
      out.append(buf, got);
    }
    ext2fs_file_close(f);
    return ok;
  }

 private:
  std::string link_target(ext2_ino_t ino, ext2_inode& inode) {
    constexpr size_t kMax = 4096;  // PATH_MAX: a longer one is corrupt
    if (inode.i_flags & EXT4_INLINE_DATA_FL) {
      char buf[kMax + 64];
      size_t sz = 0;
      if (ext2fs_inline_data_size(fs_, ino, &sz) || sz > kMax) return "";
      if (ext2fs_inline_data_get(fs_, ino, &inode, buf, &sz)) return "";
      return std::string(buf, std::min(sz, kMax));
    }
    if (ext2fs_is_fast_symlink(&inode)) {
      const char* p = reinterpret_cast<const char*>(inode.i_block);
      return std::string(p,
                         strnlen(p, std::min<size_t>(sizeof inode.i_block, EXT2_I_SIZE(&inode))));
    }
    std::string out;
    read(ino, 0, std::min<uint64_t>(EXT2_I_SIZE(&inode), kMax), out);
    return out;
  }

  std::string what_;
  ext2_filsys fs_ = nullptr;
};

// Byte-for-byte comparison of two files of equal size, 1 MiB at a time.
bool same_content(Fs& a, ext2_ino_t ia, Fs& b, ext2_ino_t ib, uint64_t size) {
  std::string x, y;
  for (uint64_t off = 0; off < size; off += 1 << 20) {
    uint64_t n = std::min<uint64_t>(1 << 20, size - off);
    if (!a.read(ia, off, n, x) || !b.read(ib, off, n, y)) return false;
    if (x != y) return false;
  }
  return true;
}

bool is_text(const std::string& s) { return s.find('\0') == std::string::npos; }

struct TempDir {
  fs::path path;
  explicit TempDir(const fs::path& parent) {
    std::string tmpl = (parent / "fsdiff-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw_errno("mkdtemp in " + parent.string());
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

void write_all(const fs::path& p, const std::string& data) {
  int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) throw_errno("create " + p.string());
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n <= 0) {
      ::close(fd);
      throw_errno("write " + p.string());
    }
    off += static_cast<size_t>(n);
  }
  ::close(fd);
}

// Adds "diff" (or "binary" / "diff_skipped") to change `c` of `path`.
// `old`/`neu`: the two sides (absent = /dev/null).
void add_content_diff(nlohmann::json& c, const std::string& path, const std::string* old,
                      const std::string* neu, const Limits& lim, const fs::path& tmp,
                      uint64_t& budget) {
  if ((old && !is_text(*old)) || (neu && !is_text(*neu))) {
    c["binary"] = true;
    return;
  }
  if (budget == 0) {
    c["diff_skipped"] = "total diff size cap reached";
    return;
  }
  TempDir d(tmp);
  std::vector<std::string> argv{"diff", "-u"};
  for (auto [s, label] : {std::pair{old, "a" + path}, std::pair{neu, "b" + path}}) {
    argv.push_back("--label");
    argv.push_back(s ? label : "/dev/null");
  }
  write_all(d.path / "a", old ? *old : "");
  write_all(d.path / "b", neu ? *neu : "");
  argv.push_back((d.path / "a").string());
  argv.push_back((d.path / "b").string());
  SubprocessOptions o;
  o.timeout = std::chrono::seconds(30);
  o.max_output = static_cast<size_t>(std::min(lim.max_diff_bytes, budget) + 1);
  auto r = run_command(argv, o);
  if (r.exit_code != 0 && r.exit_code != 1) {
    c["diff_skipped"] = "diff failed";
    return;
  }
  std::string text = r.out;
  if (text.size() > std::min(lim.max_diff_bytes, budget)) {
    text.resize(static_cast<size_t>(std::min(lim.max_diff_bytes, budget)));
    c["diff_truncated"] = true;
  }
  budget -= std::min<uint64_t>(budget, text.size());
  c["diff"] = text;
}

nlohmann::json describe(const std::string& path, const char* change, const Node& n) {
  nlohmann::json j{{"path", path},   {"change", change},      {"type", type_name(n.type)},
                   {"size", n.size}, {"mode", octal(n.mode)}, {"uid", n.uid},
                   {"gid", n.gid}};
  if (n.type == 'l') j["target"] = n.target;
  return j;
}

}  // namespace

nlohmann::json diff_raw(const fs::path& before, const fs::path& after, const fs::path& tmp_dir,
                        const Options& opt) {
  const Limits& lim = opt.limits;
  auto t0 = Clock::now();
  Fs a(before, "base");
  Fs b(after, "sandbox's");
  uint64_t skipped = 0;
  auto ta = a.walk(lim, skipped);
  auto tb = b.walk(lim, skipped);
  nlohmann::json changes = nlohmann::json::array();
  uint64_t added = 0, modified = 0, deleted = 0, budget = lim.max_total_diff_bytes;
  bool truncated = false;
  auto push = [&](nlohmann::json c) {
    if (changes.size() >= lim.max_changes) {
      truncated = true;
      return false;
    }
    changes.push_back(std::move(c));
    return true;
  };
  auto content_of = [&](Fs& fs, const Node& n, std::string& out) {
    return n.type == 'f' && n.size <= lim.max_content_bytes && fs.read(n.ino, 0, n.size, out);
  };
  // Both maps are sorted by path: one merge pass.
  auto ia = ta.begin();
  auto ib = tb.begin();
  while (ia != ta.end() || ib != tb.end()) {
    int cmp = ia == ta.end() ? 1 : ib == tb.end() ? -1 : ia->first.compare(ib->first);
    if (cmp < 0) {  // only before: deleted
      auto c = describe(ia->first, "deleted", ia->second);
      if (opt.content && ia->second.type == 'f') {
        std::string old;
        if (content_of(a, ia->second, old))
          add_content_diff(c, ia->first, &old, nullptr, lim, tmp_dir, budget);
        else
          c["diff_skipped"] = "too large";
      }
      ++deleted;
      if (!push(std::move(c))) break;
      ++ia;
    } else if (cmp > 0) {  // only after: added
      auto c = describe(ib->first, "added", ib->second);
      if (opt.content && ib->second.type == 'f') {
        std::string neu;
        if (content_of(b, ib->second, neu))
          add_content_diff(c, ib->first, nullptr, &neu, lim, tmp_dir, budget);
        else
          c["diff_skipped"] = "too large";
      }
      ++added;
      if (!push(std::move(c))) break;
      ++ib;
    } else {
      const Node& x = ia->second;
      const Node& y = ib->second;
      nlohmann::json what = nlohmann::json::array();
      if (x.type != y.type) what.push_back("type");
      if (x.mode != y.mode) what.push_back("mode");
      if (x.uid != y.uid || x.gid != y.gid) what.push_back("owner");
      if (x.type == y.type && x.type == 'l' && x.target != y.target) what.push_back("target");
      bool content = x.type == 'f' && y.type == 'f' &&
                     (x.size != y.size || !same_content(a, x.ino, b, y.ino, x.size));
      if (content) what.push_back("content");
      if (!what.empty()) {
        auto c = describe(ib->first, "modified", y);
        nlohmann::json before{{"type", type_name(x.type)},
                              {"size", x.size},
                              {"mode", octal(x.mode)},
                              {"uid", x.uid},
                              {"gid", x.gid}};
        if (x.type == 'l') before["target"] = x.target;
        c["before"] = before;
        c["what"] = what;
        if (opt.content && content) {
          std::string old, neu;
          if (content_of(a, x, old) && content_of(b, y, neu))
            add_content_diff(c, ib->first, &old, &neu, lim, tmp_dir, budget);
          else
            c["diff_skipped"] = "too large";
        }
        ++modified;
        if (!push(std::move(c))) break;
      }
      ++ia;
      ++ib;
    }
  }
  return {{"changes", changes},
          {"truncated", truncated},
          {"summary", {{"added", added}, {"modified", modified}, {"deleted", deleted}}},
          {"skipped_entries", skipped},
          {"timing_ms", {{"walk", ms_since(t0)}}}};
}

namespace {

// A raw view of a layer chain: the raw image itself, or a sparse raw copy
// made by qemu-img (removed with this object).
struct RawView {
  fs::path path;
  bool temp = false;
  RawView(const LayerChain& chain, const fs::path& tmp_dir, const std::string& what) {
    if (chain.format == "raw") {
      path = chain.top;
      return;
    }
    if (chain.format != "qcow2" || chain.qemu_source.empty())
      throw Error(Errc::internal, "unknown layer format '" + chain.format + "'");
    std::string tmpl = (tmp_dir / "fsdiff-XXXXXX.raw").string();
    int fd = ::mkstemps(tmpl.data(), 4);
    if (fd < 0) throw_errno("temporary file in " + tmp_dir.string());
    ::close(fd);
    path = tmpl;
    temp = true;
    SubprocessOptions o;
    o.timeout = std::chrono::minutes(10);
    auto r = run_command({"qemu-img", "convert", "-O", "raw", chain.qemu_source, path.string()}, o);
    if (!r.ok()) {
      std::error_code ec;
      fs::remove(path, ec);
      throw Error(Errc::unavailable, "cannot read the " + what + " disk layers: " + r.describe());
    }
  }
  ~RawView() {
    std::error_code ec;
    if (temp) fs::remove(path, ec);
  }
};

}  // namespace

nlohmann::json diff(const LayerChain& before, const LayerChain& after, const fs::path& tmp_dir,
                    const Options& opt) {
  auto t0 = Clock::now();
  RawView a(before, tmp_dir, "base");
  RawView b(after, tmp_dir, "sandbox's");
  int64_t materialize_ms = ms_since(t0);

  // The walk runs in a child: libext2fs parsing a hostile filesystem must
  // never take the daemon down with it (or its memory). The child gets
  // RLIMIT_AS / RLIMIT_CPU and sends its JSON back through a pipe.
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) throw_errno("pipe");
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(p[0]);
    ::close(p[1]);
    throw_errno("fork the filesystem reader");
  }
  if (pid == 0) {
    ::close(p[0]);
    // The limit is on top of what the daemon's image already maps (thread
    // stacks, libraries), which the child inherits.
    uint64_t mapped = 0;
    if (FILE* f = std::fopen("/proc/self/statm", "re")) {
      unsigned long pages = 0;
      if (std::fscanf(f, "%lu", &pages) == 1)
        mapped = static_cast<uint64_t>(pages) * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
      std::fclose(f);
    }
    rlim_t cap = static_cast<rlim_t>(mapped + opt.limits.child_memory_bytes);
    rlimit as{cap, cap};
    rlimit cpu{static_cast<rlim_t>(opt.limits.child_cpu_seconds),
               static_cast<rlim_t>(opt.limits.child_cpu_seconds)};
    ::setrlimit(RLIMIT_AS, &as);
    ::setrlimit(RLIMIT_CPU, &cpu);
    std::string out;
    try {
      out = diff_raw(a.path, b.path, tmp_dir, opt)
                .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    } catch (const Error& e) {
      out = nlohmann::json{{"error",
                            {{"code", std::string(to_string(e.code()))}, {"message", e.what()}}}}
                .dump();
    } catch (const std::exception& e) {
      out = nlohmann::json{{"error", {{"code", "internal"}, {"message", e.what()}}}}.dump();
    }
    size_t off = 0;
    while (off < out.size()) {
      ssize_t n = ::write(p[1], out.data() + off, out.size() - off);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
    ::_exit(0);
  }
  ::close(p[1]);
  std::string buf;
  char chunk[65536];
  while (true) {
    ssize_t n = ::read(p[0], chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    buf.append(chunk, static_cast<size_t>(n));
  }
  ::close(p[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw Error(Errc::unavailable,
                "the filesystem reader died" +
                    (WIFSIGNALED(status) ? " (signal " + std::to_string(WTERMSIG(status)) + ")"
                                         : std::string()) +
                    ": the sandbox's filesystem is corrupt or over the reader's limits");
  auto j = nlohmann::json::parse(buf, nullptr, false);
  if (!j.is_object()) throw Error(Errc::internal, "the filesystem reader sent no result");
  if (j.contains("error")) {
    std::string code = j["error"].value("code", "internal");
    std::string msg = j["error"].value("message", "filesystem reader failed");
    throw Error(code == "unavailable" ? Errc::unavailable : Errc::internal, msg);
  }
  j["timing_ms"]["materialize"] = materialize_ms;
  return j;
}

}  // namespace airlock::engine::fsdiff

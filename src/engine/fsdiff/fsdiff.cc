#include "engine/fsdiff/fsdiff.h"

// clang-format off
#include <ext2fs/ext2_fs.h>
#include <ext2fs/ext2fs.h>
// clang-format on
#include <et/com_err.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "common/error.h"
#include "common/unique_fd.h"
#include "engine/confine/confine.h"
#include "protocol/messages.h"

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
  // `name`: a path for unix_io_manager, a descriptor number for unixfd_io_manager.
  Fs(const std::string& name, io_manager io, std::string what) : what_(std::move(what)) {
    errcode_t e = ext2fs_open(name.c_str(), EXT2_FLAG_64BITS, 0, 0, io, &fs_);
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

// Runs `diff -u <labels> A B` on the two texts; false if diff failed.
using RunDiff = std::function<bool(const std::vector<std::string>& labels, const std::string& a,
                                   const std::string& b, size_t max_output, std::string& out)>;

// Adds "diff" (or "binary" / "diff_skipped") to change `c` of `path`.
// `old`/`neu`: the two sides (absent = /dev/null).
void add_content_diff(nlohmann::json& c, const std::string& path, const std::string* old,
                      const std::string* neu, const Limits& lim, uint64_t& budget,
                      const RunDiff& run) {
  if ((old && !is_text(*old)) || (neu && !is_text(*neu))) {
    c["binary"] = true;
    return;
  }
  if (budget == 0) {
    c["diff_skipped"] = "total diff size cap reached";
    return;
  }
  std::vector<std::string> labels;
  for (auto [s, label] : {std::pair{old, "a" + path}, std::pair{neu, "b" + path}}) {
    labels.push_back("--label");
    labels.push_back(s ? label : "/dev/null");
  }
  std::string text;
  if (!run(labels, old ? *old : "", neu ? *neu : "",
           static_cast<size_t>(std::min(lim.max_diff_bytes, budget) + 1), text)) {
    c["diff_skipped"] = "diff failed";
    return;
  }
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

// How the walker handles a text change's two sides (stash_texts).
using Differ =
    std::function<void(nlohmann::json& c, const std::string& path, const std::string* old,
                       const std::string* neu, uint64_t& budget)>;

nlohmann::json diff_trees(Fs& a, Fs& b, const Options& opt, const Differ& add_content_diff) {
  const Limits& lim = opt.limits;
  auto t0 = Clock::now();
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
          add_content_diff(c, ia->first, &old, nullptr, budget);
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
          add_content_diff(c, ib->first, nullptr, &neu, budget);
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
            add_content_diff(c, ib->first, &old, &neu, budget);
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

// The walker's Differ: the two texts travel back (hex, so any byte does)
// in "_old"/"_new" for the daemon to diff confined; bounded in all by
// `budget` (four times the total diff cap).
Differ stash_texts(const Limits& lim) {
  auto left = std::make_shared<uint64_t>(lim.max_total_diff_bytes * 4);
  return [lim, left](nlohmann::json& c, const std::string&, const std::string* old,
                     const std::string* neu, uint64_t&) {
    if ((old && !is_text(*old)) || (neu && !is_text(*neu))) {
      c["binary"] = true;
      return;
    }
    uint64_t size = (old ? old->size() : 0) + (neu ? neu->size() : 0);
    if (size > *left) {
      c["diff_skipped"] = "total diff size cap reached";
      return;
    }
    *left -= size;
    c["_old"] = old ? nlohmann::json(protocol::to_hex(*old)) : nlohmann::json(nullptr);
    c["_new"] = neu ? nlohmann::json(protocol::to_hex(*neu)) : nlohmann::json(nullptr);
  };
}

}  // namespace

nlohmann::json walk_fds(int before_fd, int after_fd, const Options& opt) {
  Fs a(std::to_string(before_fd), unixfd_io_manager, "base");
  Fs b(std::to_string(after_fd), unixfd_io_manager, "sandbox's");
  return diff_trees(a, b, opt, stash_texts(opt.limits));
}

namespace {

// A raw view of a layer chain, as a descriptor for the walker: the raw image
// itself, or a sparse raw copy that a confined qemu-img makes in `scratch`
// (qemu-img parses the qcow2 metadata, which a guest's QEMU wrote).
struct RawView {
  UniqueFd fd;
  RawView(const LayerChain& chain, confine::Scratch& scratch, const std::string& name,
          const std::string& what) {
    if (chain.format == "raw") {
      fd.reset(::open(chain.top.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
      if (fd.fd < 0) throw_errno("open the " + what + " disk");
      return;
    }
    if (chain.format != "qcow2" || chain.qemu_source.empty())
      throw Error(Errc::internal, "unknown layer format '" + chain.format + "'");
    std::string source = scratch.give_image_opts(chain.qemu_source);
    std::string out = scratch.give_dir() + "/" + name;
    confine::Limits lim;
    lim.timeout = std::chrono::minutes(10);
    auto r = confine::run(
        scratch.exec({"qemu-img", "convert", "-O", "raw", source, out}, "qemu-img", lim));
    if (!r.ok())
      throw Error(Errc::unavailable, "cannot read the " + what + " disk layers: " + r.describe());
    fd.reset(::open((scratch.dir() / name).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (fd.fd < 0) throw_errno("open the " + what + " disk's raw copy");
  }
};

// The walker's stashed texts become diffs, each by a confined diff reading
// two memfds (the texts are the guest's; diff is one more parser of them).
void diff_stashed(nlohmann::json& j, const Limits& lim, int64_t uid) {
  uint64_t budget = lim.max_total_diff_bytes;
  auto memfd = [](const std::string& data) {
    UniqueFd fd(::memfd_create("airlock-diff", MFD_CLOEXEC));
    if (fd.fd < 0) throw_errno("memfd_create");
    size_t off = 0;
    while (off < data.size()) {
      ssize_t n = ::write(fd.fd, data.data() + off, data.size() - off);
      if (n <= 0) throw_errno("write a memfd");
      off += static_cast<size_t>(n);
    }
    return fd;
  };
  RunDiff run = [&](const std::vector<std::string>& labels, const std::string& a,
                    const std::string& b, size_t max_output, std::string& out) {
    UniqueFd fa = memfd(a), fb = memfd(b);
    std::vector<std::string> argv{"diff", "-u"};
    argv.insert(argv.end(), labels.begin(), labels.end());
    argv.push_back("/proc/self/fd/3");
    argv.push_back("/proc/self/fd/4");
    confine::Spec s;
    s.mode = "exec";
    s.what = "diff";
    s.argv = argv;
    s.fds = {fa.fd, fb.fd};
    s.uid = s.gid = uid;
    s.limits.timeout = std::chrono::seconds(30);
    s.limits.memory_bytes = 1ull << 30;
    s.limits.file_bytes = 0;
    s.limits.max_output = max_output;
    auto r = confine::run(s);
    if (r.out_truncated) {  // over its bound: what came is the diff's start
      r.out_truncated = false;
      r.exit_code = 1;
    }
    out = r.out;
    return !r.timed_out && (r.exit_code == 0 || r.exit_code == 1);
  };
  for (auto& c : j["changes"]) {
    if (!c.contains("_old") && !c.contains("_new")) continue;
    std::string old, neu;
    bool has_old = c["_old"].is_string(), has_new = c["_new"].is_string();
    if (has_old) old = protocol::from_hex(c["_old"].get<std::string>());
    if (has_new) neu = protocol::from_hex(c["_new"].get<std::string>());
    c.erase("_old");
    c.erase("_new");
    add_content_diff(c, c.value("path", ""), has_old ? &old : nullptr, has_new ? &neu : nullptr,
                     lim, budget, run);
  }
}

}  // namespace

nlohmann::json diff(const LayerChain& before, const LayerChain& after, const fs::path& tmp_dir,
                    const Options& opt) {
  auto t0 = Clock::now();
  confine::Scratch scratch(tmp_dir);
  RawView a(before, scratch, "base.raw", "base");
  RawView b(after, scratch, "sandbox.raw", "sandbox's");
  int64_t materialize_ms = ms_since(t0);

  // The walk runs in airlock-confine (confine.h): libext2fs parsing a
  // hostile filesystem must never take the daemon down with it (or its
  // memory), nor run with the daemon's privileges. The raw views are its
  // descriptors 3 and 4; it opens nothing itself.
  confine::Spec s;
  s.mode = "walk";
  s.what = "the filesystem diff walker";
  s.fds = {a.fd.fd, b.fd.fd};
  s.uid = s.gid = scratch.uid();
  const Limits& lim = opt.limits;
  s.args = {{"content", opt.content},
            {"limits",
             {{"max_entries", lim.max_entries},
              {"max_depth", lim.max_depth},
              {"max_changes", lim.max_changes},
              {"max_content_bytes", lim.max_content_bytes},
              {"max_diff_bytes", lim.max_diff_bytes},
              {"max_total_diff_bytes", lim.max_total_diff_bytes}}}};
  s.limits.memory_bytes = lim.child_memory_bytes;
  s.limits.cpu_seconds = lim.child_cpu_seconds;
  s.limits.file_bytes = 0;  // it writes only to its pipe
  s.limits.open_files = 16;
  s.limits.processes = 1;
  s.limits.timeout = std::chrono::seconds(lim.child_cpu_seconds * 2);
  s.limits.max_output = 256u << 20;
  auto r = confine::run(s);
  if (!r.ok())
    throw Error(Errc::unavailable, "the filesystem reader failed (" + r.describe() +
                                       "): the sandbox's filesystem is corrupt or over the "
                                       "reader's limits");
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  if (!j.is_object()) throw Error(Errc::internal, "the filesystem reader sent no result");
  if (j.contains("error")) {
    std::string code = j["error"].value("code", "internal");
    std::string msg = j["error"].value("message", "filesystem reader failed");
    throw Error(code == "unavailable" ? Errc::unavailable : Errc::internal, msg);
  }
  if (opt.content) diff_stashed(j, lim, scratch.uid());
  j["timing_ms"]["materialize"] = materialize_ms;
  return j;
}

Options options_from_json(const nlohmann::json& args) {
  Options o;
  o.content = args.value("content", false);
  const auto& l = args.at("limits");
  o.limits.max_entries = l.at("max_entries").get<uint64_t>();
  o.limits.max_depth = l.at("max_depth").get<int>();
  o.limits.max_changes = l.at("max_changes").get<uint64_t>();
  o.limits.max_content_bytes = l.at("max_content_bytes").get<uint64_t>();
  o.limits.max_diff_bytes = l.at("max_diff_bytes").get<uint64_t>();
  o.limits.max_total_diff_bytes = l.at("max_total_diff_bytes").get<uint64_t>();
  return o;
}

}  // namespace airlock::engine::fsdiff

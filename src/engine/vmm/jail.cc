#include "engine/vmm/jail.h"

#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "common/error.h"
#include "common/process.h"
#include "common/signals.h"
#include "common/subprocess.h"
#include "engine/vmm/jail_ids.h"

namespace airlock::vmm {

namespace fs = std::filesystem;

// One step of the mount plan, executed in the jailed child (after fork, so
// only syscalls on strings prepared here).
struct Jail::Op {
  enum Kind { dir, symlink, file, bind, proc } kind;
  std::string target;       // absolute, inside the new root (before pivot_root)
  std::string source;       // bind: host path; symlink: link text
  unsigned long flags = 0;  // bind: the remount flags
  bool own = false;         // file: give it to the jail's uid (the pid-file shadow)
};

namespace {

constexpr const char* kRootName = ".jail";    // the new root's mount point, in run_dir
constexpr const char* kKvmNode = "kvm.node";  // the jail's own KVM node, in run_dir
constexpr rlim_t kNofile = 4096;
constexpr rlim_t kNproc = 1024;

// Child failure stages that are not mount-plan ops (those are >= 0).
enum Stage : int {
  st_setsid = -1,
  st_cgroup = -2,
  st_unshare = -3,
  st_idmap = -4,
  st_fork = -5,
  st_private = -6,
  st_tmpfs = -7,
  st_pivot = -8,
  st_rootro = -9,
  st_rlimit = -10,
  st_creds = -11,
  st_caps = -12,
  st_nnp = -13,
  st_exec = -14,
};

const char* stage_name(int s) {
  switch (s) {
    case st_setsid:
      return "setsid";
    case st_cgroup:
      return "join cgroup";
    case st_unshare:
      return "unshare namespaces";
    case st_idmap:
      return "write uid/gid map";
    case st_fork:
      return "fork into the pid namespace";
    case st_private:
      return "make mounts private";
    case st_tmpfs:
      return "mount the root tmpfs";
    case st_pivot:
      return "pivot_root";
    case st_rootro:
      return "remount the root read-only";
    case st_rlimit:
      return "setrlimit";
    case st_creds:
      return "switch uid/gid";
    case st_caps:
      return "drop capabilities";
    case st_nnp:
      return "set no_new_privs";
    default:
      return "exec";
  }
}

// Mount flags of the mount holding `p` that a bind remount must keep (in a
// user namespace the kernel refuses to clear locked ones).
unsigned long kept_flags(const fs::path& p) {
  struct statvfs sv {};
  if (::statvfs(p.c_str(), &sv) != 0) return 0;
  unsigned long f = 0;
  if (sv.f_flag & ST_RDONLY) f |= MS_RDONLY;
  if (sv.f_flag & ST_NOSUID) f |= MS_NOSUID;
  if (sv.f_flag & ST_NODEV) f |= MS_NODEV;
  if (sv.f_flag & ST_NOEXEC) f |= MS_NOEXEC;
  if (sv.f_flag & ST_NOATIME) f |= MS_NOATIME;
  if (sv.f_flag & ST_NODIRATIME) f |= MS_NODIRATIME;
  if (sv.f_flag & ST_RELATIME) f |= MS_RELATIME;
  return f;
}

// Builds the mount plan: every path at its host path under `root`, with
// the symlinks met on the way reproduced, so the jailed program opens the
// very paths it was given.
class Planner {
  using Op = Jail::Op;

 public:
  explicit Planner(fs::path root) : root_(std::move(root)) {}

  void add(const fs::path& host, bool rw, bool device, const char* field, int depth = 0) {
    if (depth > 40)
      throw Error(Errc::invalid_argument, "too many symlinks: " + host.string(), field);
    fs::path p = host.lexically_normal();
    if (!p.is_absolute())
      throw Error(Errc::invalid_argument, "jail path must be absolute: " + host.string(), field);
    fs::path cur = "/";
    std::vector<fs::path> parts(std::next(p.begin()), p.end());
    for (size_t i = 0; i < parts.size(); ++i) {
      if (parts[i].empty()) continue;
      fs::path next = cur / parts[i];
      if (bound_.count(next.string())) return;  // already visible through a bound directory
      struct stat st {};
      if (::lstat(next.c_str(), &st) != 0)
        throw Error(Errc::not_found, "jail: " + next.string() + " does not exist", field);
      bool last = i + 1 == parts.size();
      if (S_ISLNK(st.st_mode)) {
        std::error_code ec;
        fs::path link = fs::read_symlink(next, ec);
        if (ec) throw Error(Errc::internal, "jail: cannot read link " + next.string());
        push_once({Op::symlink, inside(next), link.string()});
        fs::path resolved = link.is_absolute() ? link : cur / link;
        for (size_t j = i + 1; j < parts.size(); ++j) resolved /= parts[j];
        add(resolved, rw, device, field, depth + 1);
        return;
      }
      if (!last) {
        if (!S_ISDIR(st.st_mode))
          throw Error(Errc::invalid_argument, "jail: " + next.string() + " is not a directory",
                      field);
        push_once({Op::dir, inside(next), {}});
        cur = next;
        continue;
      }
      bool is_dir = S_ISDIR(st.st_mode);
      push_once({is_dir ? Op::dir : Op::file, inside(next), {}});
      unsigned long flags = kept_flags(next) | MS_NOSUID;
      if (!device) flags |= MS_NODEV;
      if (rw) {
        flags &= ~static_cast<unsigned long>(MS_RDONLY);
        flags |= MS_NOEXEC;  // nothing it may write is ever run
      } else {
        flags |= MS_RDONLY;
      }
      binds_.push_back({Op::bind, inside(next), next.string(), flags});
      if (is_dir) bound_.insert(next.string());
    }
  }
  void add_file_op(Op op) { push_once(std::move(op)); }
  void add_bind(Op op) { binds_.push_back(std::move(op)); }

  // Creation first (all inside the tmpfs), then binds shortest target first
  // so a directory is bound before anything mounted inside it.
  std::vector<Jail::Op> finish() {
    std::vector<Jail::Op> out = creates_;
    std::stable_sort(binds_.begin(), binds_.end(),
                     [](const Op& a, const Op& b) { return a.target.size() < b.target.size(); });
    std::set<std::string> seen;
    for (auto& b : binds_)
      if (seen.insert(b.target).second) out.push_back(b);
    return out;
  }

 private:
  std::string inside(const fs::path& host) const { return (root_ / host.relative_path()).string(); }
  void push_once(Op op) {
    if (made_.insert(op.target).second) creates_.push_back(std::move(op));
  }
  fs::path root_;
  std::set<std::string> made_, bound_;
  std::vector<Op> creates_, binds_;
};

// The shared libraries `exe` loads (ldd), cached per binary.
std::vector<fs::path> shared_libraries(const fs::path& exe) {
  static std::mutex mu;
  static std::map<std::string, std::vector<fs::path>> cache;
  std::lock_guard lock(mu);
  auto it = cache.find(exe.string());
  if (it != cache.end()) return it->second;
  SubprocessOptions opts;
  opts.timeout = std::chrono::seconds(10);
  auto r = run_command({"ldd", exe.string()}, opts);
  std::vector<fs::path> libs;
  if (r.ok()) {
    std::stringstream ss(r.out);
    std::string line;
    while (std::getline(ss, line)) {
      auto arrow = line.find("=> /");
      size_t start = arrow != std::string::npos ? arrow + 3 : line.find_first_not_of(" \t");
      if (start == std::string::npos || line[start] != '/') continue;
      auto end = line.find(" (", start);
      libs.emplace_back(line.substr(start, end == std::string::npos ? end : end - start));
    }
  } else if (r.out.find("not a dynamic executable") == std::string::npos &&
             r.err.find("not a dynamic executable") == std::string::npos) {
    throw Error(Errc::unavailable,
                "jail: cannot list the libraries of " + exe.string() + ": " + r.describe());
  }
  cache[exe.string()] = libs;
  return libs;
}

bool userns_works() {
  pid_t child = ::fork();
  if (child < 0) return false;
  if (child == 0)
    ::_exit(::unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS |
                      CLONE_NEWNET) == 0
                ? 0
                : 1);
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// A character device node of `device`'s major/minor at `node` (replacing
// whatever is there: run_dir is the jail's to write, so never followed),
// owned by uid:gid, mode 0600.
void make_kvm_node(const fs::path& device, const fs::path& node, uid_t uid, gid_t gid) {
  struct stat st {};
  if (::stat(device.c_str(), &st) != 0) throw_errno("jail: stat " + device.string());
  if (!S_ISCHR(st.st_mode))
    throw Error(Errc::invalid_argument, "jail: " + device.string() + " is not a character device",
                "kvm");
  if (::unlink(node.c_str()) != 0 && errno != ENOENT) throw_errno("unlink " + node.string());
  if (::mknod(node.c_str(), S_IFCHR | 0600, st.st_rdev) != 0) throw_errno("mknod " + node.string());
  // lchown: the node was just made by us, but never follow a name in run_dir.
  if (::lchown(node.c_str(), uid, gid) != 0) throw_errno("chown " + node.string());
}

// Async-signal-safe write of a whole buffer.
void write_all(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    p += n;
    size -= static_cast<size_t>(n);
  }
}

[[noreturn]] void child_fail(int report, int stage) {
  int msg[2] = {stage, errno};
  write_all(report, msg, sizeof(msg));
  ::_exit(127);
}

bool write_str(const char* path, const std::string& s) {
  int fd = ::open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ssize_t n = ::write(fd, s.data(), s.size());
  ::close(fd);
  return n == static_cast<ssize_t>(s.size());
}

bool drop_all_caps() {
  for (int cap = 0; cap <= 63; ++cap)
    if (::prctl(PR_CAPBSET_READ, cap, 0, 0, 0) == 1 && ::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0)
      return false;
  ::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  return ::syscall(SYS_capset, &hdr, data) == 0;
}

}  // namespace

const char* to_string(JailMode mode) {
  switch (mode) {
    case JailMode::full:
      return "full";
    case JailMode::userns:
      return "userns";
    default:
      return "none";
  }
}

JailMode jail_mode() {
  static std::once_flag once;
  static JailMode mode = JailMode::none;
  std::call_once(once, [] {
    if (::geteuid() == 0)
      mode = JailMode::full;
    else if (userns_works())
      mode = JailMode::userns;
  });
  return mode;
}

Jail::Jail() = default;
Jail::~Jail() = default;
Jail::Jail(Jail&&) noexcept = default;
Jail& Jail::operator=(Jail&&) noexcept = default;

Jail Jail::prepare(const JailSpec& spec) {
  std::error_code ec;
  if (spec.id.empty()) throw Error(Errc::invalid_argument, "jail: id is empty", "id");
  if (!fs::is_directory(spec.run_dir, ec))
    throw Error(Errc::not_found, "jail: run_dir is not a directory: " + spec.run_dir.string(),
                "run_dir");
  if (!spec.exe.is_absolute())
    throw Error(Errc::invalid_argument, "jail: exe must be an absolute path", "exe");
  Jail j;
  j.spec_ = spec;
  j.spec_.run_dir = fs::absolute(spec.run_dir).lexically_normal();
  j.mode_ = jail_mode();
  const fs::path& run_dir = j.spec_.run_dir;
  release_jail(run_dir);  // whatever an earlier attempt in this run_dir left
  fs::path root = run_dir / kRootName;

  // The plan first: a missing path fails before anything is created.
  if (j.mode_ != JailMode::none) {
    Planner plan(root);
    plan.add(spec.exe, false, false, "exe");
    for (const auto& lib : shared_libraries(spec.exe)) plan.add(lib, false, false, "exe");
    for (const auto& p : spec.ro) plan.add(p, false, false, "ro");
    for (const auto& p : spec.rw) plan.add(p, true, false, "rw");
    plan.add(run_dir, true, false, "run_dir");
    for (const char* dev : {"/dev/null", "/dev/urandom"}) plan.add(dev, true, true, "dev");
    if (spec.kvm && j.mode_ == JailMode::full) {
      // Its own node (made below, once the uid is leased), bound at /dev/kvm.
      plan.add_file_op({Jail::Op::file, (root / "dev/kvm").string(), {}, 0, false});
      plan.add_bind({Jail::Op::bind, (root / "dev/kvm").string(), (run_dir / kKvmNode).string(),
                     MS_NOSUID | MS_NOEXEC});
    } else if (spec.kvm) {
      plan.add(spec.kvm_device, true, true, "kvm");
    }
    if (spec.inherit_fd >= 0) {
      plan.add_file_op({Jail::Op::dir, (root / "proc").string(), {}, 0, false});
      plan.add_bind({Jail::Op::proc, (root / "proc").string(), {}, 0, false});
    }
    if (!spec.pid_file.empty()) {
      // The shadow the jailed program writes its own pid file into.
      plan.add_file_op({Jail::Op::file, (root / ".pidfile").string(), {}, 0, true});
      plan.add_bind({Jail::Op::bind, (root / spec.pid_file.relative_path()).string(),
                     (root / ".pidfile").string(), MS_NOSUID | MS_NODEV | MS_NOEXEC});
    }
    j.ops_ = plan.finish();
  }
  if (!spec.pid_file.empty()) {
    // Exists before the child runs (the shadow's mount point); root-owned.
    int fd =
        ::open(spec.pid_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) throw_errno("create " + spec.pid_file.string());
    ::close(fd);
  }
  if (j.mode_ != JailMode::none) {
    if (::mkdir(root.c_str(), 0755) != 0 && errno != EEXIST) throw_errno("mkdir " + root.string());
  }

  if (j.mode_ == JailMode::full) {
    uint32_t n = lease_jail_uid(run_dir);
    j.uid_ = jail_ids().base + n;
    j.gid_ = jail_ids().base + n;
    try {
      // root:<gid> 01770: the jail creates its sockets; the sticky bit keeps
      // it from renaming or deleting the daemon's own files in run_dir.
      if (::chown(run_dir.c_str(), 0, j.gid_) != 0) throw_errno("chown " + run_dir.string());
      if (::chmod(run_dir.c_str(), 01770) != 0) throw_errno("chmod " + run_dir.string());
      for (const auto& p : spec.chown)
        if (::chown(p.c_str(), j.uid_, j.gid_) != 0) throw_errno("chown " + p.string());
      if (spec.kvm) make_kvm_node(spec.kvm_device, run_dir / kKvmNode, j.uid_, j.gid_);
      if (!cgroup_controllers_available().empty()) {
        j.cgroups_ = create_sandbox_cgroup(spec.id, spec.limits);
        write_jail_lease(n, run_dir, j.cgroups_);
      }
    } catch (...) {
      release_jail(run_dir);
      throw;
    }
  } else {
    j.uid_ = ::geteuid();
    j.gid_ = ::getegid();
  }

  // What is not in force, by the names posture uses.
  if (j.mode_ != JailMode::full) j.missing_.push_back("uid");
  if (j.mode_ == JailMode::none)
    for (const char* m : {"mnt_namespace", "pid_namespace", "ipc_namespace", "uts_namespace",
                          "net_namespace", "root", "capabilities"})
      j.missing_.push_back(m);
  auto avail = cgroup_controllers_available();
  for (const char* c : {"memory", "pids", "cpu"})
    if (j.cgroups_.empty() || std::find(avail.begin(), avail.end(), c) == avail.end())
      j.missing_.push_back(std::string("cgroup_") + c);
  return j;
}

namespace {

char kPathEnv[] = "PATH=/usr/bin:/bin";

// Everything the jailed child needs, built in the parent while allocating is
// still safe: after fork the child only reads it.
struct ChildPlan {
  std::vector<char*> argv;
  char* envp[2] = {kPathEnv, nullptr};
  std::string exe;
  std::string root;
  std::vector<std::string> procs;  // cgroup.procs files to join
  std::string uid_map;
  std::string gid_map;
  JailMode mode = JailMode::none;
  uid_t uid = 0;
  gid_t gid = 0;
  const std::vector<gid_t>* groups = nullptr;
  int ns_flags = 0;
  struct rlimit nofile {};
  struct rlimit nproc {};
  struct rlimit core {};
  struct rlimit fsize {};
  const std::vector<Jail::Op>* ops = nullptr;
  int inherit_fd = -1;
  int out_fd = -1;
  int devnull = -1;
};

ChildPlan child_plan(const JailSpec& s, JailMode mode, uid_t uid, gid_t gid,
                     const std::vector<fs::path>& cgroups, const std::vector<Jail::Op>& ops,
                     const std::vector<std::string>& argv, int out_fd) {
  ChildPlan p;
  for (const auto& a : argv) p.argv.push_back(const_cast<char*>(a.c_str()));
  p.argv.push_back(nullptr);
  p.exe = s.exe.string();
  p.root = (s.run_dir / kRootName).string();
  for (const auto& c : cgroups) p.procs.push_back((c / "cgroup.procs").string());
  p.uid_map = std::to_string(uid) + " " + std::to_string(uid) + " 1\n";
  p.gid_map = std::to_string(gid) + " " + std::to_string(gid) + " 1\n";
  p.mode = mode;
  p.uid = uid;
  p.gid = gid;
  p.groups = &s.groups;
  p.ns_flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNET;
  if (mode == JailMode::userns) p.ns_flags |= CLONE_NEWUSER;
  p.nofile = {kNofile, kNofile};
  p.nproc = {kNproc, kNproc};
  p.core = {0, 0};
  rlim_t fsize = s.fsize_bytes ? s.fsize_bytes : RLIM_INFINITY;
  p.fsize = {fsize, fsize};
  p.ops = &ops;
  p.inherit_fd = s.inherit_fd;
  p.out_fd = out_fd;
  return p;
}

// One step of the mount plan, in the child: 0 or -1 with errno set.
int apply_mount_op(const Jail::Op& op, uid_t uid, gid_t gid) {
  int r = 0;
  switch (op.kind) {
    case Jail::Op::dir:
      r = ::mkdir(op.target.c_str(), 0755);
      if (r != 0 && errno == EEXIST) r = 0;
      break;
    case Jail::Op::symlink:
      r = ::symlink(op.source.c_str(), op.target.c_str());
      break;
    case Jail::Op::file: {
      int fd = ::open(op.target.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
      r = fd < 0 ? -1 : 0;
      if (fd >= 0 && op.own && ::fchown(fd, uid, gid) != 0) r = -1;
      if (fd >= 0) ::close(fd);
      break;
    }
    case Jail::Op::proc:
      // Its own pid namespace's processes only (it is PID 1 there).
      r = ::mount("proc", op.target.c_str(), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY,
                  "subset=pid");
      break;
    case Jail::Op::bind:
      r = ::mount(op.source.c_str(), op.target.c_str(), nullptr, MS_BIND, nullptr);
      if (r == 0)
        r = ::mount(nullptr, op.target.c_str(), nullptr, MS_REMOUNT | MS_BIND | op.flags, nullptr);
      break;
  }
  return r;
}

// In the child, in the new mount namespace: a tmpfs root holding only the
// mount plan, pivoted into and made read-only.
void child_build_root(const ChildPlan& p, int rep) {
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
    child_fail(rep, st_private);
  if (::mount("tmpfs", p.root.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=64k") != 0)
    child_fail(rep, st_tmpfs);
  for (size_t i = 0; i < p.ops->size(); ++i)
    if (apply_mount_op((*p.ops)[i], p.uid, p.gid) != 0) child_fail(rep, static_cast<int>(i));
  if (::chdir(p.root.c_str()) != 0 || ::syscall(SYS_pivot_root, ".", ".") != 0 ||
      ::umount2(".", MNT_DETACH) != 0 || ::chdir("/") != 0)
    child_fail(rep, st_pivot);
  if (::mount(nullptr, "/", nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV,
              nullptr) != 0)
    child_fail(rep, st_rootro);
  ::sethostname("airlock", 7);
}

// In the child, last: the standard fds, the one inherited fd, nothing else.
[[noreturn]] void child_exec(const ChildPlan& p, int rep) {
  // Out of the way of 0..4 first: the daemon's number may be any of them.
  int inherited = p.inherit_fd >= 0 ? ::fcntl(p.inherit_fd, F_DUPFD, 16) : -1;
  if (p.inherit_fd >= 0 && inherited < 0) child_fail(rep, st_exec);
  ::dup2(p.devnull, 0);
  ::dup2(p.out_fd, 1);
  ::dup2(p.out_fd, 2);
  ::dup2(rep, 3);
  ::fcntl(3, F_SETFD, FD_CLOEXEC);
  int first_closed = kInheritedFd;
  if (inherited >= 0) {
    ::dup2(inherited, kInheritedFd);  // without FD_CLOEXEC: it survives exec
    first_closed = kInheritedFd + 1;
  }
  ::close_range(first_closed, ~0U, 0);  // nothing else of the daemon leaks into the jail
  ::execve(p.exe.c_str(), p.argv.data(), p.envp);
  child_fail(3, st_exec);
}

// The first child, from fork to execve: only async-signal-safe calls (the
// daemon has other threads), on what `p` prepared. The order is the
// security argument and must not change:
//  - setsid, then the cgroups before the namespaces, so everything below
//    inherits the limits;
//  - unshare (and the id maps without root) before the second fork, so the
//    grandchild is PID 1 of the new pid namespace and detached;
//  - the root is built while the mount capabilities are still held, and is
//    read-only before the process runs;
//  - rlimits, then the bounding set (needs CAP_SETPCAP, so before giving up
//    root), then groups, gid and uid (the uid last: after it nothing else
//    can change), then every remaining capability, then no_new_privs so exec
//    cannot regain any;
//  - the fds and exec last, so every failure above still reaches the pipe.
[[noreturn]] void run_jailed_child(const ChildPlan& p, int rep) {
  if (::setsid() < 0) child_fail(rep, st_setsid);
  // Joined before the namespaces: everything below inherits the limits.
  for (const auto& proc : p.procs)
    if (!write_str(proc.c_str(), "0")) child_fail(rep, st_cgroup);
  if (p.mode != JailMode::none) {
    if (::unshare(p.ns_flags) != 0) child_fail(rep, st_unshare);
    if (p.mode == JailMode::userns) {
      if (!write_str("/proc/self/setgroups", "deny") ||
          !write_str("/proc/self/gid_map", p.gid_map) ||
          !write_str("/proc/self/uid_map", p.uid_map))
        child_fail(rep, st_idmap);
    }
  }
  // The second fork detaches (re-parented to init or the nearest
  // subreaper) and, with CLONE_NEWPID, is PID 1 of the new namespace.
  pid_t grandchild = ::fork();
  if (grandchild < 0) child_fail(rep, st_fork);
  if (grandchild > 0) {
    write_all(rep, &grandchild, sizeof(grandchild));
    ::_exit(0);
  }
  reset_signals();
  if (p.mode != JailMode::none) child_build_root(p, rep);
  if (::setrlimit(RLIMIT_CORE, &p.core) != 0 || ::setrlimit(RLIMIT_NOFILE, &p.nofile) != 0 ||
      ::setrlimit(RLIMIT_FSIZE, &p.fsize) != 0 ||
      (p.mode == JailMode::full && ::setrlimit(RLIMIT_NPROC, &p.nproc) != 0))
    child_fail(rep, st_rlimit);
  if (p.mode == JailMode::full) {
    // The bounding set needs CAP_SETPCAP: drop it before giving up root.
    for (int cap = 0; cap <= 63; ++cap)
      if (::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL) child_fail(rep, st_caps);
    if (::setgroups(p.groups->size(), p.groups->data()) != 0 ||
        ::setresgid(p.gid, p.gid, p.gid) != 0 || ::setresuid(p.uid, p.uid, p.uid) != 0)
      child_fail(rep, st_creds);
  }
  if (p.mode != JailMode::none && !drop_all_caps()) child_fail(rep, st_caps);
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) child_fail(rep, st_nnp);
  ::umask(077);
  child_exec(p, rep);
}

// Everything the children wrote before the pipe closed.
std::string read_report(int fd) {
  std::string buf;
  char tmp[64];
  for (;;) {
    ssize_t n = ::read(fd, tmp, sizeof(tmp));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    buf.append(tmp, static_cast<size_t>(n));
  }
  return buf;
}

// The host pid from the report, or the Error naming the step that failed
// (after waiting for a jailed process that had started to be gone).
pid_t decode_report(const std::string& buf, const std::vector<Jail::Op>& ops,
                    const std::string& exe) {
  pid_t pid = -1;
  size_t off = 0;
  if (buf.size() == sizeof(int) * 2 || buf.size() == sizeof(pid_t) + sizeof(int) * 2) {
    // A failure; maybe after the pid.
    if (buf.size() > sizeof(int) * 2) {
      std::memcpy(&pid, buf.data(), sizeof(pid_t));
      off = sizeof(pid_t);
    }
    int msg[2];
    std::memcpy(msg, buf.data() + off, sizeof(msg));
    if (pid > 0) wait_gone(pid, std::chrono::seconds(5));
    std::string step = msg[0] >= 0 && static_cast<size_t>(msg[0]) < ops.size()
                           ? (ops[msg[0]].kind == Jail::Op::bind ? "bind " + ops[msg[0]].source
                                                                 : "create " + ops[msg[0]].target)
                           : stage_name(msg[0]);
    if (msg[0] == st_exec)
      throw Error(Errc::unavailable, "cannot execute " + exe + ": " + std::strerror(msg[1]),
                  "qemu_binary");
    throw Error(Errc::internal, "jail: " + step + ": " + std::strerror(msg[1]));
  }
  if (buf.size() != sizeof(pid_t))
    throw Error(Errc::internal, "jail: could not fork (double fork failed)");
  std::memcpy(&pid, buf.data(), sizeof(pid_t));
  return pid;
}

// The host pid (the jailed process only knows its namespace's pid).
void write_pid_file(const fs::path& pid_file, pid_t pid) {
  std::string line = std::to_string(pid) + "\n";
  int fd = ::open(pid_file.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC | O_NOFOLLOW);
  if (fd >= 0) {
    write_all(fd, line.data(), line.size());
    ::close(fd);
  }
}

}  // namespace

pid_t Jail::spawn(const std::vector<std::string>& argv, int out_fd) const {
  if (argv.empty()) throw Error(Errc::invalid_argument, "jail: empty argv", "argv");
  // Everything the children need, prepared while allocating is still safe.
  ChildPlan plan = child_plan(spec_, mode_, uid_, gid_, cgroups_, ops_, argv, out_fd);
  plan.devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (plan.devnull < 0) throw_errno("open /dev/null");
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) {
    ::close(plan.devnull);
    throw_errno("pipe2");
  }
  pid_t child = ::fork();
  if (child < 0) {
    for (int fd : {plan.devnull, report[0], report[1]}) ::close(fd);
    throw_errno("fork");
  }
  if (child == 0) {
    ::close(report[0]);
    run_jailed_child(plan, report[1]);
  }
  ::close(plan.devnull);
  ::close(report[1]);
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  // The first child sends the host pid, or a failure; the jailed process
  // sends a failure or nothing (the pipe closes on exec).
  std::string buf = read_report(report[0]);
  ::close(report[0]);
  pid_t pid = decode_report(buf, ops_, plan.exe);
  if (!spec_.pid_file.empty()) write_pid_file(spec_.pid_file, pid);
  return pid;
}

std::vector<std::string> release_jail(const fs::path& run_dir_in) {
  std::vector<std::string> left;
  std::error_code ec;
  fs::path run_dir = fs::absolute(run_dir_in, ec).lexically_normal();
  ::rmdir((run_dir / kRootName).c_str());  // the host side is an empty directory
  ::unlink((run_dir / kKvmNode).c_str());  // a device node outlives nothing of ours
  for (auto& c : release_jail_leases(run_dir)) left.push_back(std::move(c));
  return left;
}

std::vector<fs::path> qemu_runtime_paths(const fs::path& exe) {
  std::vector<fs::path> out;
  std::error_code ec;
  fs::path prefix = exe.parent_path().parent_path();  // /usr for /usr/bin/qemu-...
  // Firmware and option ROMs (Debian searches all three), and QEMU's
  // loadable modules (TCG itself is one: accel-tcg-x86_64.so).
  for (const char* d : {"share/qemu", "share/seabios", "lib/ipxe", "share/ipxe", "lib/qemu"})
    if (fs::is_directory(prefix / d, ec)) out.push_back(prefix / d);
  for (const auto& e : fs::directory_iterator(prefix / "lib", ec)) {
    fs::path mods = e.path() / "qemu";
    if (e.is_directory(ec) && fs::is_directory(mods, ec) && !e.is_symlink(ec)) out.push_back(mods);
  }
  if (fs::exists("/etc/ld.so.cache", ec)) out.push_back("/etc/ld.so.cache");
  return out;
}

std::vector<fs::path> qcow2_chain(const fs::path& disk, uint64_t* virtual_size) {
  std::vector<fs::path> chain;
  fs::path cur = fs::absolute(disk).lexically_normal();
  for (int depth = 0; depth < 16; ++depth) {
    chain.push_back(cur);
    std::ifstream in(cur, std::ios::binary);
    unsigned char h[32] = {};
    if (!in.read(reinterpret_cast<char*>(h), sizeof(h))) break;
    if (std::memcmp(h, "QFI\xfb", 4) != 0) break;  // raw: the end of the chain
    auto be = [&](int off, int n) {
      uint64_t v = 0;
      for (int i = 0; i < n; ++i) v = v << 8 | h[off + i];
      return v;
    };
    if (depth == 0 && virtual_size) *virtual_size = be(24, 8);
    uint64_t off = be(8, 8);
    uint64_t len = be(16, 4);
    if (off == 0 || len == 0 || len > 1023) break;
    std::string name(len, '\0');
    in.seekg(static_cast<std::streamoff>(off));
    if (!in.read(name.data(), static_cast<std::streamsize>(len)))
      throw Error(Errc::invalid_argument, "qcow2 backing name unreadable in " + cur.string(),
                  "disk");
    fs::path next(name);
    cur = (next.is_absolute() ? next : cur.parent_path() / next).lexically_normal();
  }
  return chain;
}

}  // namespace airlock::vmm

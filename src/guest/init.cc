#include "guest/init.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <linux/random.h>
#include <linux/types.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "guest/log.h"
#include "guest/net.h"
#include "protocol/messages.h"

#ifndef EXT4_IOC_RESIZE_FS
#define EXT4_IOC_RESIZE_FS _IOW('f', 16, __u64)
#endif

namespace airlock::guest {
namespace {

constexpr unsigned long kExt4Magic = 0xEF53;
constexpr unsigned long kCgroup2Magic = 0x63677270;
constexpr unsigned long kDevptsMagic = 0x1cd1;     // DEVPTS_SUPER_MAGIC
constexpr unsigned long kTmpfsMagic = 0x01021994;  // TMPFS_MAGIC
// memory.min of the agent's cgroup (and airlock/ above it).
constexpr uint64_t kAgentReservedBytes = 16ull << 20;

bool is_mounted(const char* path, long magic = 0) {
  struct statfs fs {};
  if (statfs(path, &fs) != 0) return false;
  // A directory on the root fs has the same device as "/"; a mount point not.
  struct stat a {
  }, b{};
  if (stat(path, &a) != 0 || stat("/", &b) != 0) return false;
  if (magic && fs.f_type != static_cast<decltype(fs.f_type)>(magic)) return false;
  return a.st_dev != b.st_dev;
}

void mount_if_missing(const char* src, const char* target, const char* type, unsigned long flags,
                      const char* data, long magic = 0) {
  mkdir(target, 0755);
  if (is_mounted(target, magic)) return;
  if (mount(src, target, type, flags, data) != 0 && errno != EBUSY)
    logf("mount %s on %s: %s", type, target, strerror(errno));
}

bool write_file(const std::string& path, const std::string& value) {
  int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = write(fd, value.data(), value.size()) == static_cast<ssize_t>(value.size());
  close(fd);
  return ok;
}

std::string read_small(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void loopback_up() {
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return;
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
  if (ioctl(s, SIOCGIFFLAGS, &ifr) == 0) {
    ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
    if (ioctl(s, SIOCSIFFLAGS, &ifr) != 0) logf("loopback up: %s", strerror(errno));
  }
  close(s);
}

// disk_mb of a sandbox may exceed the base image's filesystem: grow ext4
// online to the size of the block device under "/".
void grow_root_fs() {
  struct statfs fs {};
  if (statfs("/", &fs) != 0 || fs.f_type != static_cast<decltype(fs.f_type)>(kExt4Magic)) return;
  struct stat st {};
  if (stat("/", &st) != 0) return;
  // /dev/block/MAJ:MIN names the device under "/" whatever its name.
  std::string dev =
      "/dev/block/" + std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev));
  int bfd = open(dev.c_str(), O_RDONLY | O_CLOEXEC);
  if (bfd < 0) bfd = open("/dev/vda", O_RDONLY | O_CLOEXEC);
  if (bfd < 0) return;
  uint64_t dev_bytes = 0;
  bool ok = ioctl(bfd, BLKGETSIZE64, &dev_bytes) == 0;
  close(bfd);
  if (!ok || fs.f_bsize == 0) return;
  uint64_t fs_blocks = fs.f_blocks;  // excludes metadata overhead: compare loosely
  uint64_t dev_blocks = dev_bytes / fs.f_bsize;
  if (dev_blocks <= fs_blocks + dev_blocks / 20 + 1024) return;  // within ~5%: nothing to do
  // The groups the resize adds keep their inode tables unzeroed: / is
  // mounted noinit_itable (images/init.sh), the overlay reads as zeros there.
  int rfd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (rfd < 0) return;
  __u64 target = dev_blocks;
  if (ioctl(rfd, EXT4_IOC_RESIZE_FS, &target) != 0)
    logf("growing / to %llu blocks failed: %s", static_cast<unsigned long long>(target),
         strerror(errno));
  else
    logf("grew / to %llu MiB", static_cast<unsigned long long>(dev_bytes >> 20));
  close(rfd);
}

}  // namespace

void pid1_setup() {
  mount_if_missing("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr);
  mount_if_missing("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr);
  mount_if_missing("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755");
  log_to_console();
  // Under /dev the device test alone cannot tell (every directory of the
  // devtmpfs differs from "/"): the filesystem type must match too. Without
  // devpts there are no ptys (pty execs fail with ENODEV).
  mount_if_missing("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "mode=0620,ptmxmode=0666",
                   kDevptsMagic);
  mount_if_missing("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777", kTmpfsMagic);
  mount_if_missing("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777");
  mount_if_missing("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755");
  mount_if_missing("cgroup2", "/sys/fs/cgroup", "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                   nullptr, kCgroup2Magic);
  // An exec's process that cannot be cloned into its cgroup (the fork
  // fallback of spawn.h) joins it right after fork. Without
  // favordynmods each such migration takes the cgroup threadgroup lock for
  // writing, which waits for an RCU grace period once the lock has gone back
  // to its fast mode between execs: measured in a guest under TCG, 25 ms per
  // fork+join+exec of /bin/true against 10-11 ms with it (and the agent's
  // exec of `true` 55-96 ms against 26-42 ms). Forks and exits pay a little
  // instead. Kernels before 6.0 do not know the option: then as before.
  if (mount(nullptr, "/sys/fs/cgroup", nullptr, MS_REMOUNT | MS_NOSUID | MS_NODEV | MS_NOEXEC,
            "favordynmods") != 0)
    logf("cgroup2 favordynmods: %s", strerror(errno));
  if (symlink("/proc/self/fd", "/dev/fd") != 0 && errno != EEXIST)
    logf("/dev/fd: %s", strerror(errno));
  symlink("/proc/self/fd/0", "/dev/stdin");
  symlink("/proc/self/fd/1", "/dev/stdout");
  symlink("/proc/self/fd/2", "/dev/stderr");
  if (sethostname("airlock", 7) != 0) logf("sethostname: %s", strerror(errno));
  loopback_up();
  grow_root_fs();
  // Leave our own file limit generous: many concurrent execs mean many pipes.
  rlimit rl{65536, 65536};
  setrlimit(RLIMIT_NOFILE, &rl);
}

std::string setup_cgroups(const std::string& mount_point) {
  struct statfs fs {};
  if (statfs(mount_point.c_str(), &fs) != 0 ||
      fs.f_type != static_cast<decltype(fs.f_type)>(kCgroup2Magic))
    return "";
  const std::string root = mount_point + "/airlock";
  if (mkdir(root.c_str(), 0755) != 0 && errno != EEXIST) {
    logf("mkdir %s: %s", root.c_str(), strerror(errno));
    return "";
  }
  const std::string agent = root + "/agent";
  mkdir(agent.c_str(), 0755);
  // No internal processes: move ourselves to a leaf before enabling
  // controllers for the subtree.
  if (!write_file(agent + "/cgroup.procs", "0"))
    logf("moving the agent into %s: %s", agent.c_str(), strerror(errno));
  std::istringstream ctrls(read_small(mount_point + "/cgroup.controllers"));
  std::string c;
  while (ctrls >> c) {
    write_file(mount_point + "/cgroup.subtree_control", "+" + c);
    write_file(root + "/cgroup.subtree_control", "+" + c);
  }
  // Memory the agent keeps whatever user code does: protection must be
  // granted on every level down to the agent's leaf.
  for (const std::string& cg : {root, agent})
    if (!write_file(cg + "/memory.min", std::to_string(kAgentReservedBytes)))
      logf("%s/memory.min: %s", cg.c_str(), strerror(errno));
  if (!write_file("/proc/self/oom_score_adj", "-1000")) logf("oom_score_adj: %s", strerror(errno));
  return root;
}

int open_virtio_port(const std::string& name) {
  DIR* d = opendir("/sys/class/virtio-ports");
  if (!d) return -1;
  int fd = -1;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::string n = read_small(std::string("/sys/class/virtio-ports/") + e->d_name + "/name");
    while (!n.empty() && (n.back() == '\n' || n.back() == ' ')) n.pop_back();
    if (n != name) continue;
    std::string dev = std::string("/dev/") + e->d_name;
    fd = open(dev.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) logf("open %s: %s", dev.c_str(), strerror(errno));
    break;
  }
  closedir(d);
  return fd;
}

bool set_clock_ns(int64_t ns) {
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  return clock_settime(CLOCK_REALTIME, &ts) == 0;
}

void apply_hello(const nlohmann::json& hello) {
  try {
    auto t = hello.find("time_ns");
    if (t != hello.end() && t->is_number_integer()) {
      int64_t ns = t->get<int64_t>();
      if (ns > 0 && !set_clock_ns(ns)) logf("clock_settime: %s", strerror(errno));
    }
    auto h = hello.find("hostname");
    if (h != hello.end() && h->is_string()) {
      std::string name = h->get<std::string>();
      bool ok = !name.empty() && name.size() <= 64;
      for (char ch : name)
        if (!(isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '.')) ok = false;
      if (!ok)
        logf("hello: hostname ignored (want 1..64 of [A-Za-z0-9.-])");
      else if (sethostname(name.data(), name.size()) != 0)
        logf("sethostname: %s", strerror(errno));
    }
    auto nw = hello.find("network");
    if (nw != hello.end() && !nw->is_null()) {
      try {
        GuestNetwork net = parse_guest_network(*nw);
        // virtio_net was loaded by the initramfs; the device may still be
        // probing, so give it a moment.
        std::string nic = first_nic(3000);
        std::string err = configure_network(nic, net);
        if (!err.empty()) logf("network: %s", err.c_str());
      } catch (const std::exception& ex) {
        logf("hello: network ignored: %s", ex.what());
      }
    }
    auto e = hello.find("entropy");
    if (e != hello.end() && e->is_string()) {
      std::string bytes = protocol::from_hex(e->get<std::string>());
      if (!bytes.empty() && bytes.size() <= 512) {
        // rand_pool_info with a flexible buffer; entropy is credited in bits.
        alignas(rand_pool_info) char buf[sizeof(rand_pool_info) + 512];
        auto* info = reinterpret_cast<rand_pool_info*>(buf);
        info->entropy_count = static_cast<int>(bytes.size() * 8);
        info->buf_size = static_cast<int>(bytes.size());
        std::memcpy(info->buf, bytes.data(), bytes.size());
        int fd = open("/dev/random", O_WRONLY | O_CLOEXEC);
        if (fd < 0 || ioctl(fd, RNDADDENTROPY, info) != 0)
          logf("RNDADDENTROPY: %s", strerror(errno));
        // A clone restored from a template has the template's CRNG state:
        // crediting entropy alone does not make the kernel reseed at once,
        // so force it, or two clones would read the same "random" bytes.
        if (fd >= 0 && ioctl(fd, RNDRESEEDCRNG) != 0) logf("RNDRESEEDCRNG: %s", strerror(errno));
        if (fd >= 0) close(fd);
      }
    }
    auto mid = hello.find("machine_id");
    if (mid != hello.end() && mid->is_string()) {
      std::string id = mid->get<std::string>();
      bool ok = id.size() == 32;
      for (char ch : id)
        if (!isxdigit(static_cast<unsigned char>(ch)) || isupper(static_cast<unsigned char>(ch)))
          ok = false;
      // Written in place (the rootfs is the sandbox's own overlay); a read-only
      // or missing /etc just goes without.
      if (!ok)
        logf("hello: machine_id ignored (want 32 lowercase hex digits)");
      else {
        int fd = open("/etc/machine-id", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0444);
        std::string line = id + "\n";
        if (fd < 0 || write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size()))
          logf("/etc/machine-id: %s", strerror(errno));
        if (fd >= 0) close(fd);
      }
    }
  } catch (const std::exception& ex) {
    logf("hello: %s", ex.what());
  }
}

}  // namespace airlock::guest

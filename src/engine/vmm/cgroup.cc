#include "engine/vmm/cgroup.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "common/error.h"
#include "common/process.h"

namespace airlock::vmm {

namespace fs = std::filesystem;

namespace {

constexpr const char* kControllers[] = {"memory", "pids", "cpu"};
constexpr int kCpuPeriodUs = 100000;

struct Hierarchy {
  int version = 0;  // 1 or 2
  fs::path mount;
  std::string root;  // the mount's root inside the hierarchy (mountinfo field 4)
  std::set<std::string> controllers;
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, sep)) out.push_back(part);
  return out;
}

// Every cgroup mount of this mount namespace.
std::vector<Hierarchy> hierarchies() {
  std::vector<Hierarchy> out;
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    auto sep = line.find(" - ");
    if (sep == std::string::npos) continue;
    auto pre = split(line.substr(0, sep), ' ');
    auto post = split(line.substr(sep + 3), ' ');
    if (pre.size() < 5 || post.size() < 3) continue;
    Hierarchy h;
    h.root = pre[3];
    h.mount = pre[4];
    if (post[0] == "cgroup2") {
      h.version = 2;
      std::string ctl = read_file_capped(h.mount / "cgroup.controllers", 4096);
      std::stringstream ss(ctl);
      std::string c;
      while (ss >> c) h.controllers.insert(c);
    } else if (post[0] == "cgroup") {
      h.version = 1;
      for (const auto& opt : split(post[2], ',')) h.controllers.insert(opt);
    } else {
      continue;
    }
    out.push_back(std::move(h));
  }
  return out;
}

// The hierarchy that carries `controller`: a v1 one if mounted (hybrid
// hosts bind the controllers there), else v2 if it offers it.
const Hierarchy* hierarchy_for(const std::vector<Hierarchy>& hs, const std::string& controller) {
  for (const auto& h : hs)
    if (h.version == 1 && h.controllers.count(controller)) return &h;
  for (const auto& h : hs)
    if (h.version == 2 && h.controllers.count(controller)) return &h;
  return nullptr;
}

// `pid`'s (0 = self) path inside `h`, from /proc/<pid>/cgroup; "" if none.
std::string cgroup_path_in(const Hierarchy& h, pid_t pid) {
  std::string file = pid ? "/proc/" + std::to_string(pid) + "/cgroup" : "/proc/self/cgroup";
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    auto a = line.find(':');
    auto b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    std::string ctls = line.substr(a + 1, b - a - 1);
    std::string path = line.substr(b + 1);
    if (h.version == 2 && line.compare(0, a, "0") == 0 && ctls.empty()) return path;
    if (h.version == 1 && !ctls.empty()) {
      for (const auto& c : split(ctls, ','))
        if (h.controllers.count(c)) return path;
    }
  }
  return {};
}

// Host directory of cgroup `path` (as /proc/<pid>/cgroup names it) in `h`.
fs::path dir_of(const Hierarchy& h, const std::string& path) {
  std::string rel = path;
  if (h.root != "/" && rel.compare(0, h.root.size(), h.root) == 0) rel = rel.substr(h.root.size());
  while (!rel.empty() && rel.front() == '/') rel.erase(0, 1);
  return rel.empty() ? h.mount : h.mount / rel;
}

// The "airlock" parent directory in `h` for this daemon.
fs::path parent_dir(const Hierarchy& h) {
  if (h.version == 2) return h.mount / "airlock";
  return dir_of(h, cgroup_path_in(h, 0)) / "airlock";
}

void write_file(const fs::path& p, const std::string& value) {
  int fd = ::open(p.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0)
    throw Error(Errc::unavailable, "cannot open " + p.string() + ": " + std::strerror(errno));
  ssize_t n = ::write(fd, value.data(), value.size());
  int err = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(value.size()))
    throw Error(Errc::unavailable,
                "cannot write '" + value + "' to " + p.string() + ": " + std::strerror(err));
}

void check_id(const std::string& id) {
  if (id.empty() || id.find('/') != std::string::npos || id == "." || id == "..")
    throw Error(Errc::invalid_argument, "bad cgroup name '" + id + "'", "id");
}

// v2's cpu.weight scale to v1's cpu.shares (default 1024, minimum 2) and back.
std::string weight_file(int version) { return version == 2 ? "cpu.weight" : "cpu.shares"; }
std::string weight_value(int version, int weight) {
  return std::to_string(version == 2 ? weight : std::max(2, weight * 1024 / kDefaultCpuWeight));
}

std::string trimmed(const fs::path& p) {
  std::string s = read_file_capped(p, 256);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

std::vector<std::string> cgroup_controllers_available() {
  static std::once_flag once;
  static std::vector<std::string> cached;
  std::call_once(once, [] {
    auto hs = hierarchies();
    for (const char* c : kControllers) {
      const Hierarchy* h = hierarchy_for(hs, c);
      if (!h) continue;
      fs::path base = parent_dir(*h).parent_path();
      if (::access(base.c_str(), W_OK) == 0) cached.push_back(c);
    }
  });
  return cached;
}

std::vector<fs::path> create_sandbox_cgroup(const std::string& id, const CgroupLimits& limits) {
  check_id(id);
  if (limits.cpu_weight < 0 || limits.cpu_weight > 10000)
    throw Error(Errc::invalid_argument,
                "cpu weight " + std::to_string(limits.cpu_weight) + " is not in 1..10000",
                "cpu_weight");
  auto hs = hierarchies();
  auto avail = cgroup_controllers_available();
  // hierarchy mount -> controllers used there (cpu and cpuacct may share one).
  std::map<fs::path, std::pair<const Hierarchy*, std::vector<std::string>>> per;
  for (const auto& c : avail) {
    const Hierarchy* h = hierarchy_for(hs, c);
    if (!h) continue;
    per[h->mount].first = h;
    per[h->mount].second.push_back(c);
  }
  if (per.empty())
    throw Error(Errc::unavailable, "no writable cgroup hierarchy with memory, pids or cpu");
  std::vector<fs::path> made;
  try {
    for (auto& [mount, hc] : per) {
      const Hierarchy& h = *hc.first;
      fs::path parent = parent_dir(h);
      if (::mkdir(parent.c_str(), 0755) != 0 && errno != EEXIST)
        throw_errno("mkdir " + parent.string());
      if (h.version == 2) {
        // Controllers must be enabled on the way down to reach the leaf.
        std::string enable;
        for (const auto& c : hc.second) enable += (enable.empty() ? "+" : " +") + c;
        write_file(h.mount / "cgroup.subtree_control", enable);
        write_file(parent / "cgroup.subtree_control", enable);
      }
      fs::path dir = parent / id;
      if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) throw_errno("mkdir " + dir.string());
      made.push_back(dir);
      for (const auto& c : hc.second) {
        if (c == "memory" && limits.memory_bytes) {
          std::string v = std::to_string(limits.memory_bytes);
          if (h.version == 2) {
            write_file(dir / "memory.max", v);
            // No swap: the limit is the limit (ignored where swap accounting is off).
            if (fs::exists(dir / "memory.swap.max")) write_file(dir / "memory.swap.max", "0");
          } else {
            write_file(dir / "memory.limit_in_bytes", v);
            // Swap counted too where it is accounted (memory+swap >= memory).
            if (fs::exists(dir / "memory.memsw.limit_in_bytes"))
              write_file(dir / "memory.memsw.limit_in_bytes", v);
          }
        } else if (c == "pids" && limits.pids) {
          write_file(dir / "pids.max", std::to_string(limits.pids));
        } else if (c == "cpu" && limits.cpu_weight) {
          write_file(dir / weight_file(h.version), weight_value(h.version, limits.cpu_weight));
        }
        if (c == "cpu" && limits.cpus) {
          std::string quota = std::to_string(static_cast<int64_t>(limits.cpus) * kCpuPeriodUs);
          if (h.version == 2) {
            write_file(dir / "cpu.max", quota + " " + std::to_string(kCpuPeriodUs));
          } else {
            write_file(dir / "cpu.cfs_period_us", std::to_string(kCpuPeriodUs));
            write_file(dir / "cpu.cfs_quota_us", quota);
          }
        }
      }
    }
  } catch (...) {
    remove_cgroup_dirs(made);
    throw;
  }
  return made;
}

bool set_sandbox_cpu_weight(const std::string& id, int weight) {
  check_id(id);
  if (weight < 1 || weight > 10000)
    throw Error(Errc::invalid_argument,
                "cpu weight " + std::to_string(weight) + " is not in 1..10000", "cpu_weight");
  // The cpu hierarchy's "airlock" parent, found once: this is on the
  // hand-out's path, and mountinfo does not change under a running daemon.
  static std::once_flag once;
  static int version = 0;
  static fs::path parent;
  std::call_once(once, [] {
    auto avail = cgroup_controllers_available();
    if (std::find(avail.begin(), avail.end(), "cpu") == avail.end()) return;
    auto hs = hierarchies();
    if (const Hierarchy* h = hierarchy_for(hs, "cpu")) {
      version = h->version;
      parent = parent_dir(*h);
    }
  });
  if (version == 0) return false;
  write_file(parent / id / weight_file(version), weight_value(version, weight));
  return true;
}

std::vector<fs::path> remove_cgroup_dirs(const std::vector<fs::path>& dirs) {
  std::vector<fs::path> left;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (const auto& d : dirs) {
    for (;;) {
      if (::rmdir(d.c_str()) == 0 || errno == ENOENT) break;
      if (errno != EBUSY || std::chrono::steady_clock::now() > deadline) {
        left.push_back(d);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  return left;
}

nlohmann::json read_cgroup_limits(pid_t pid) {
  auto hs = hierarchies();
  nlohmann::json out{{"version", nullptr},    {"paths", nlohmann::json::object()},
                     {"memory_max", nullptr}, {"pids_max", nullptr},
                     {"cpu_max", nullptr},    {"cpu_weight", nullptr}};
  for (const char* c : kControllers) {
    const Hierarchy* h = hierarchy_for(hs, c);
    if (!h) continue;
    std::string path = cgroup_path_in(*h, pid);
    if (path.empty()) continue;
    fs::path dir = dir_of(*h, path);
    out["paths"][c] = dir.string();
    if (out["version"].is_null() || h->version == 1) out["version"] = h->version;
    std::string c_str = c;
    if (c_str == "memory") {
      std::string v = trimmed(dir / (h->version == 2 ? "memory.max" : "memory.limit_in_bytes"));
      // v1 spells "no limit" as a huge page-aligned number.
      if (!v.empty() && v != "max") {
        uint64_t bytes = std::strtoull(v.c_str(), nullptr, 10);
        if (bytes < (uint64_t{1} << 62)) out["memory_max"] = bytes;
      }
    } else if (c_str == "pids") {
      std::string v = trimmed(dir / "pids.max");
      if (!v.empty() && v != "max") out["pids_max"] = std::stoll(v);
    } else {
      std::string v;
      if (h->version == 2) {
        v = trimmed(dir / "cpu.max");
        if (v.compare(0, 3, "max") == 0) v.clear();
      } else {
        std::string q = trimmed(dir / "cpu.cfs_quota_us");
        if (!q.empty() && q != "-1") v = q + " " + trimmed(dir / "cpu.cfs_period_us");
      }
      if (!v.empty()) out["cpu_max"] = v;
      std::string w = trimmed(dir / weight_file(h->version));
      if (!w.empty() && w.find_first_not_of("0123456789") == std::string::npos) {
        int64_t n = std::stoll(w);
        out["cpu_weight"] = h->version == 2 ? n : (n * kDefaultCpuWeight + 512) / 1024;
      }
    }
  }
  return out;
}

}  // namespace airlock::vmm

#include "engine/vmm/posture.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "engine/vmm/cgroup.h"

namespace airlock::vmm {

namespace fs = std::filesystem;

namespace {

constexpr const char* kNamespaces[] = {"mnt", "pid", "ipc", "uts", "net", "user", "cgroup"};
// The ones the jail must own (user/cgroup are reported, not required).
constexpr const char* kJailNamespaces[] = {"mnt", "pid", "ipc", "uts", "net"};

std::string trim(std::string s) {
  auto b = s.find_first_not_of(" \t");
  auto e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

nlohmann::json limit_value(const std::string& v) {
  if (v == "unlimited") return nullptr;
  try {
    return std::stoull(v);
  } catch (const std::exception&) {
    return v;
  }
}

// /proc/<pid>/limits: fixed columns located from its header line.
nlohmann::json read_limits(const std::string& proc) {
  static const std::pair<const char*, const char*> kWanted[] = {
      {"Max core file size", "core"}, {"Max open files", "nofile"},
      {"Max processes", "nproc"},     {"Max file size", "fsize"},
      {"Max address space", "as"},    {"Max locked memory", "memlock"}};
  nlohmann::json out = nlohmann::json::object();
  std::ifstream in(proc + "/limits");
  std::string header, line;
  if (!std::getline(in, header)) return out;
  size_t soft = header.find("Soft Limit"), hard = header.find("Hard Limit"),
         units = header.find("Units");
  if (soft == std::string::npos || hard == std::string::npos) return out;
  while (std::getline(in, line)) {
    if (line.size() <= hard) continue;
    std::string name = trim(line.substr(0, soft));
    for (const auto& [label, key] : kWanted) {
      if (name != label) continue;
      out[key] = {
          {"soft", limit_value(trim(line.substr(soft, hard - soft)))},
          {"hard", limit_value(trim(line.substr(
                       hard, units == std::string::npos ? std::string::npos : units - hard)))}};
    }
  }
  return out;
}

bool all_zero_hex(const nlohmann::json& v) {
  if (!v.is_string()) return false;
  return v.get<std::string>().find_first_not_of('0') == std::string::npos;
}

}  // namespace

nlohmann::json read_posture(pid_t pid) {
  std::string proc = "/proc/" + std::to_string(pid);
  std::ifstream st(proc + "/status");
  if (pid <= 0 || !st) throw Error(Errc::not_found, "no process " + std::to_string(pid));
  nlohmann::json p{{"pid", pid}};
  std::string line;
  auto ids = [](const std::string& v) {
    std::istringstream ss(v);
    long r = -1, e = -1;
    ss >> r >> e;
    return nlohmann::json{{"real", r}, {"effective", e}};
  };
  while (std::getline(st, line)) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon), val = trim(line.substr(colon + 1));
    if (key == "Uid")
      p["uid"] = ids(val);
    else if (key == "Gid")
      p["gid"] = ids(val);
    else if (key == "CapEff")
      p["capabilities"]["effective"] = val;
    else if (key == "CapPrm")
      p["capabilities"]["permitted"] = val;
    else if (key == "CapBnd")
      p["capabilities"]["bounding"] = val;
    else if (key == "CapAmb")
      p["capabilities"]["ambient"] = val;
    else if (key == "Seccomp")
      p["seccomp"] = std::stoi(val);
    else if (key == "NoNewPrivs")
      p["no_new_privs"] = val == "1";
  }
  std::error_code ec;
  for (const char* ns : kNamespaces) {
    auto theirs = fs::read_symlink(proc + "/ns/" + ns, ec);
    if (ec) continue;
    auto ours = fs::read_symlink(std::string("/proc/self/ns/") + ns, ec);
    p["namespaces"][ns] = {{"id", theirs.string()}, {"own", !ec && theirs != ours}};
  }
  // Its root: the same inode as ours means it sees the host's /.
  struct stat theirs {
  }, ours{};
  nlohmann::json root{{"own", nullptr}, {"entries", nlohmann::json::array()}};
  if (::stat((proc + "/root/").c_str(), &theirs) == 0 && ::stat("/", &ours) == 0) {
    root["own"] = theirs.st_dev != ours.st_dev || theirs.st_ino != ours.st_ino;
    for (const auto& e : fs::directory_iterator(proc + "/root/", ec))
      root["entries"].push_back(e.path().filename().string());
    std::sort(root["entries"].begin(), root["entries"].end());
  }
  p["root"] = root;
  p["cgroup"] = read_cgroup_limits(pid);
  p["rlimits"] = read_limits(proc);
  if (!p.contains("uid")) throw Error(Errc::not_found, "no process " + std::to_string(pid));
  p["missing"] = posture_missing(p);
  return p;
}

std::vector<std::string> posture_missing(const nlohmann::json& p) {
  std::vector<std::string> m;
  auto at = [&](const nlohmann::json::json_pointer& ptr) -> nlohmann::json {
    return p.contains(ptr) ? p.at(ptr) : nlohmann::json();
  };
  using ptr = nlohmann::json::json_pointer;
  auto uid = at(ptr("/uid/effective")), ruid = at(ptr("/uid/real"));
  if (!uid.is_number() || uid.get<long>() == 0 || !ruid.is_number() || ruid.get<long>() == 0)
    m.push_back("uid");
  if (!all_zero_hex(at(ptr("/capabilities/effective")))) m.push_back("capabilities");
  if (!all_zero_hex(at(ptr("/capabilities/bounding")))) m.push_back("capability_bounding_set");
  if (at(ptr("/seccomp")) != 2) m.push_back("seccomp");
  if (at(ptr("/no_new_privs")) != true) m.push_back("no_new_privs");
  for (const char* ns : kJailNamespaces)
    if (at(ptr(std::string("/namespaces/") + ns + "/own")) != true)
      m.push_back(std::string(ns) + "_namespace");
  if (at(ptr("/root/own")) != true) m.push_back("root");
  for (const char* c : {"memory", "pids", "cpu"})
    if (at(ptr(std::string("/cgroup/") + c + "_max")).is_null())
      m.push_back(std::string("cgroup_") + c);
  if (at(ptr("/rlimits/core/hard")) != 0) m.push_back("rlimit_core");
  for (const char* r : {"nofile", "fsize"})
    if (at(ptr(std::string("/rlimits/") + r + "/hard")).is_null())
      m.push_back(std::string("rlimit_") + r);
  return m;
}

}  // namespace airlock::vmm

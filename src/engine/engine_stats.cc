// Engine::stats: a sandbox's resource use, read from the host side (QEMU's
// /proc entries, the overlay's allocated blocks, the network helper's ended
// flows). Reading it is not activity: idle_timeout is not reset.
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "common/error.h"
#include "engine/engine.h"
#include "engine/engine_impl.h"

namespace airlock::engine {
namespace fs = std::filesystem;

namespace {

// utime + stime of `pid` in seconds, from /proc/<pid>/stat (fields 14, 15,
// counted after the parenthesised command name, which may hold spaces).
double cpu_seconds(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto close = s.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(s.substr(close + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

uint64_t rss_bytes(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

}  // namespace

nlohmann::json Engine::stats(const std::string& id) {
  auto& impl = *impl_;
  SandboxInfo info = get(id);  // Error(not_found)
  std::shared_ptr<Sandbox> sb = impl.table.find(id);
  nlohmann::json j = {
      {"id", id},
      {"state", to_string(info.state)},
      {"cpu_seconds", 0.0},
      {"memory_bytes", 0},
      {"disk_bytes", 0},
      {"net_rx_bytes", 0},
      {"net_tx_bytes", 0},
      {"age_s", std::max<int64_t>(0, (impl.wall_ms() - info.created_at_ms) / 1000)}};
  struct stat st;
  auto row = impl.registry.get(id);
  fs::path disk = (row ? row->run_dir : impl.sandbox_dir(id)) / "disk.qcow2";
  if (::stat(disk.c_str(), &st) == 0) j["disk_bytes"] = static_cast<uint64_t>(st.st_blocks) * 512;
  if (!sb) return j;
  int pid = sb->state() == State::running ? info.pid : 0;
  if (pid > 0) {
    j["cpu_seconds"] = cpu_seconds(pid);
    j["memory_bytes"] = rss_bytes(pid);
  }
  std::shared_ptr<nethost::EventReader> reader;
  {
    std::lock_guard lock(sb->mu);
    reader = sb->net_events;
  }
  if (reader) {
    auto [out, in] = nethost::flow_bytes(*reader);
    j["net_tx_bytes"] = out;
    j["net_rx_bytes"] = in;
  }
  return j;
}

}  // namespace airlock::engine

// Failure detection for running sandboxes (docs/design.md, "Failure
// states"): what the reaper checks every second, the agent ping, and how a
// dead VM's cause is told apart from the evidence it left (console tail,
// QEMU's cgroup, qemu.log).
#include <spdlog/spdlog.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <thread>

#include "common/error.h"
#include "common/process.h"
#include "engine/channel/guest_client.h"
#include "engine/engine.h"
#include "engine/engine_impl.h"
#include "engine/vmm/cgroup.h"
#include "engine/vmm/console.h"

namespace airlock::engine {

bool net_helper_alive(const Sandbox& sb) {
  // Mode none has no helper; a re-adopted sandbox whose helper was already
  // gone has net_pid 0 and was recorded then (adopted.net_pid = null).
  pid_t pid;
  {
    std::lock_guard lock(const_cast<Sandbox&>(sb).mu);
    pid = sb.net_pid;
  }
  if (pid <= 0 || !sb.networked) return true;
  return nethost::is_ours(pid, sb.run_dir());
}

namespace fs = std::filesystem;

namespace {

// A channel closed while QEMU still runs is only agent_lost if QEMU is still
// running this long after: QEMU exiting closes the channel first, and its
// death then says more (panic, oom, killed).
constexpr int64_t kClosedGraceMs = 2000;

// Console lines a guest prints as it dies or resets. The VM runs with
// panic=-1 and -no-reboot, so each of these ends QEMU by itself.
struct Marker {
  const char* text;
  const char* what;
};
constexpr Marker kGuestEnd[] = {
    {"Kernel panic", "guest kernel panic"},
    {"sysrq: Trigger a crash", "guest kernel panic"},
    {"SysRq : Trigger a crash", "guest kernel panic"},
    {"reboot: Restarting system", "guest reset"},
    {"reboot: System halted", "guest halted"},
    {"reboot: Power down", "guest powered off"},
};

// `key N` from a cgroup flat-keyed file (memory.events, memory.oom_control);
// -1 if absent.
int64_t keyed_value(const fs::path& file, const std::string& key) {
  std::ifstream in(file);
  std::string k;
  int64_t v;
  while (in >> k >> v)
    if (k == key) return v;
  return -1;
}

// "" unless QEMU's memory cgroup recorded an OOM kill.
std::string oom_evidence(const std::string& memory_cgroup) {
  if (memory_cgroup.empty()) return {};
  fs::path dir = memory_cgroup;
  int64_t kills = keyed_value(dir / "memory.events", "oom_kill");  // v2
  bool v1 = kills < 0;
  if (v1) kills = keyed_value(dir / "memory.oom_control", "oom_kill");
  if (kills <= 0) return {};
  std::string limit = read_file_capped(dir / (v1 ? "memory.limit_in_bytes" : "memory.max"), 64);
  while (!limit.empty() && (limit.back() == '\n' || limit.back() == ' ')) limit.pop_back();
  std::string why = "QEMU's cgroup hit its memory limit (" + limit + " bytes) and the kernel " +
                    "OOM killer killed it (oom_kill " + std::to_string(kills);
  if (v1) {
    std::string failcnt = read_file_capped(dir / "memory.failcnt", 64);
    while (!failcnt.empty() && failcnt.back() == '\n') failcnt.pop_back();
    if (!failcnt.empty()) why += ", failcnt " + failcnt;
  }
  return why + ")";
}

// How QEMU ended, as far as it said so in qemu.log (it reports the signals
// it catches, e.g. SIGTERM; SIGKILL leaves no trace).
std::string qemu_log_evidence(const fs::path& run_dir) {
  std::string log = read_file_capped(run_dir / "qemu.log", 64 * 1024);
  if (log.size() > 1024) log = log.substr(log.size() - 1024);
  std::smatch m;
  static const std::regex kSignal("terminating on signal ([0-9]+)");
  if (std::regex_search(log, m, kSignal)) return "QEMU terminated on signal " + m[1].str();
  while (!log.empty() && (log.back() == '\n' || log.back() == ' ')) log.pop_back();
  size_t nl = log.rfind('\n');
  std::string last = nl == std::string::npos ? log : log.substr(nl + 1);
  return last.empty() ? std::string() : "qemu.log: " + last.substr(0, 300);
}

// The last console line carrying a guest-end marker, with what it means.
std::optional<std::pair<std::string, std::string>> guest_end(const std::string& tail) {
  std::optional<std::pair<std::string, std::string>> found;
  size_t start = 0;
  while (start < tail.size()) {
    size_t end = tail.find('\n', start);
    if (end == std::string::npos) end = tail.size();
    std::string line = tail.substr(start, end - start);
    for (const Marker& m : kGuestEnd)
      if (line.find(m.text) != std::string::npos) found.emplace(m.what, line);
    start = end + 1;
  }
  return found;
}

}  // namespace

Verdict classify_death(const fs::path& run_dir, int pid, const std::string& memory_cgroup) {
  Verdict v{State::failed, "", "", "failed", nlohmann::json::object()};
  fs::path log = run_dir / "console.log";
  // Markers are looked for in the last 200 lines: a panic's own line comes
  // before its stack trace, which alone can be longer than the 40 lines
  // reported (and the closing "end Kernel panic" line may not be captured
  // yet on a loaded host).
  std::string wide = vmm::console_tail(log, 200);
  auto end = guest_end(wide);
  if (!end) {
    // The capture thread may still be copying the console's last bytes.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    wide = vmm::console_tail(log, 200);
    end = guest_end(wide);
  }
  std::string tail = vmm::console_tail(log, 40);
  if (end && tail.find(end->second) == std::string::npos) tail = end->second + "\n...\n" + tail;
  v.details["console_tail"] = tail;
  v.details["pid"] = pid;
  if (end) {
    v.failure = "guest_panic";
    v.reason = end->first + " (console: \"" + end->second.substr(0, 200) + "\")";
    return v;
  }
  if (std::string oom = oom_evidence(memory_cgroup); !oom.empty()) {
    v.failure = "oom";
    v.reason = oom;
    return v;
  }
  v.failure = "vmm_died";
  std::string how = qemu_log_evidence(run_dir);
  v.reason = "QEMU (pid " + std::to_string(pid) + ") exited or was killed without a guest panic; " +
             (how.rfind("QEMU terminated", 0) == 0
                  ? how
                  : "exit status unknown (QEMU runs detached, not as the daemon's child)" +
                        (how.empty() ? std::string() : "; " + how));
  return v;
}

std::optional<Verdict> Engine::Impl::check_health(const std::shared_ptr<Sandbox>& sbp,
                                                  int64_t now) {
  Sandbox& sb = *sbp;
  const auto& info = sb.rec.info;
  if (now >= sb.expires_steady_ms.load())
    return Verdict{State::timed_out, "",
                   "lifetime of " + std::to_string(info.spec.timeout_s) + " s expired", "timed_out",
                   nlohmann::json::object()};
  if (!sb.vm || !sb.vm->alive()) {
    // Classified outside the engine lock (it may wait for the console).
    return Verdict{State::failed, "", "", "failed", {{"classify", true}}};
  }
  // Read while QEMU runs: it names the cgroup to look for an OOM kill in
  // once QEMU is dead. Only the jail's own per-sandbox cgroup counts.
  if (sb.memory_cgroup.empty()) {
    try {
      std::string p = vmm::read_cgroup_limits(sb.vm->pid())["paths"].value("memory", "");
      sb.memory_cgroup = p.find("/airlock/" + sb.run_name()) != std::string::npos ? p : "-";
    } catch (const std::exception&) {
      sb.memory_cgroup = "-";
    }
  }
  if (sb.channel && sb.channel->closed()) {
    if (sb.closed_seen_ms == 0) sb.closed_seen_ms = now;
    if (now - sb.closed_seen_ms < kClosedGraceMs) return std::nullopt;
    return Verdict{
        State::failed,
        "agent_lost",
        "guest agent connection lost while QEMU still runs: " + sb.channel->closed_reason(),
        "failed",
        {{"console_tail", sb.vm->console_tail(40)}}};
  }
  if (!net_helper_alive(sb)) {
    // Failed, not restarted: QEMU's stream netdev cannot reconnect to a
    // new helper, the guest's flows are gone, and a helper the guest
    // managed to crash should be visible, not papered over.
    return Verdict{State::failed, "net_helper_died", "network helper died", "net_helper_died",
                   nlohmann::json::object()};
  }
  if (int idle = info.spec.idle_timeout_s; idle > 0) {
    if (sb.last_activity_ms == 0) sb.last_activity_ms = now;
    bool execs_running;
    {
      std::lock_guard lock(sb.mu);
      execs_running = !sb.execs.empty();
    }
    if (sb.busy > 0 || execs_running) {
      sb.last_activity_ms = now;
    } else if (now - sb.last_activity_ms >= int64_t{idle} * 1000) {
      // on_idle "pause": the reaper pauses it instead (details["pause"]).
      return Verdict{State::timed_out, "", "idle for " + std::to_string(idle) + " s", "timed_out",
                     info.spec.on_idle == "pause" ? nlohmann::json{{"pause", true}}
                                                  : nlohmann::json::object()};
    }
  }
  // The agent must answer a ping: a VM that runs but whose agent hangs (or
  // whose vCPUs stopped) would otherwise hold every call until its deadline.
  if (sb.channel) {
    if (sb.ping_in_flight) {
      if (now - sb.ping_sent_ms > cfg.agent_ping_timeout_ms)
        return Verdict{State::failed,
                       "agent_lost",
                       "guest agent did not answer a ping within " +
                           std::to_string(cfg.agent_ping_timeout_ms) + " ms (QEMU still runs)",
                       "failed",
                       {{"console_tail", sb.vm->console_tail(40)}}};
    } else if (now - sb.last_ping_ms >= cfg.agent_ping_interval_ms) {
      sb.last_ping_ms = now;
      sb.ping_sent_ms = now;
      sb.ping_in_flight = true;
      auto deadline =
          channel::Clock::now() + std::chrono::milliseconds(cfg.agent_ping_timeout_ms + 1000);
      // Its own thread: a hung agent must not stall the reaper. It holds
      // only the Sandbox (the channel's owner), never the engine. A ping that
      // fails leaves ping_in_flight set, so its age decides.
      std::thread([sbp, deadline] {
        try {
          channel::ping(*sbp->channel, deadline);
          sbp->ping_in_flight = false;
        } catch (const std::exception&) {
        }
      }).detach();
    }
  }
  return std::nullopt;
}

}  // namespace airlock::engine

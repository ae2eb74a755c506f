// The battery of `airlock probe` (its six sections): real sandboxes
// through the daemon, every outcome observed, never assumed.
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <random>
#include <thread>

#include "cli/probe.h"
#include "cli/probe_host.h"
#include "cli/spawn.h"
#include "common/error.h"
#include "daemon/base64.h"

namespace airlock::cli {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

struct Interrupted {};

int64_t since_ms(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

std::string secs(int64_t ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", ms / 1000.0);
  return buf;
}

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = s.find_first_not_of(" \t\r\n");
  return i == std::string::npos ? "" : s.substr(i);
}

std::string one_line(std::string s, size_t max = 200) {
  s = trim(std::move(s));
  for (char& ch : s)
    if (ch == '\n' || ch == '\r') ch = ' ';
  return s.size() > max ? s.substr(0, max) + "…" : s;
}

// What an exec did: its exit event, or the error that ended the call.
struct Run {
  bool ok = false;  // an exit event arrived
  std::string error;
  json exit;
  std::string out, err;
  int64_t ms = 0;
  std::string reason() const { return ok ? exit.value("reason", "") : "error"; }
  int code() const {
    return ok && exit.contains("exit_code") && exit["exit_code"].is_number()
               ? exit["exit_code"].get<int>()
               : -1;
  }
  bool succeeded() const { return ok && code() == 0; }
  // "exit 0 (exited), 1.2 s" or "error: ..., 0.3 s"
  std::string summary() const {
    if (!ok) return "error: " + one_line(error) + ", " + secs(ms);
    std::string s = exit["exit_code"].is_number() ? "exit " + std::to_string(code())
                    : exit.contains("signal") && exit["signal"].is_number()
                        ? "signal " + std::to_string(exit["signal"].get<int>())
                        : "ended";
    return s + " (" + reason() + "), " + secs(ms);
  }
};

// Lists the guest's processes (busybox: no ps needed).
const char* kGuestPs =
    "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done";

class Battery {
 public:
  Battery(const client::Client& c, const ProbeOptions& o, const DaemonPaths& paths,
          SandboxTracker& t)
      : c_(c), o_(o), paths_(paths), t_(t) {
    token_ = std::to_string(::getpid()) + "-" + std::to_string(std::random_device{}() % 100000);
  }

  ProbeReport report;
  json context;

  void run() {
    json info = c_.call("GET", "/v1/info");
    data_dir_ =
        info.contains("data_dir") ? fs::path(info["data_dir"].get<std::string>()) : paths_.data_dir;
    for (const auto& img : info.value("images", json::array()))
      if (img.value("name", "") == o_.image)
        rootfs_mb_ = int((img.value("rootfs_bytes", uint64_t{0}) + (1 << 20) - 1) >> 20);
    context = {{"image", o_.image},
               {"network", o_.network},
               {"quick", o_.quick},
               {"accelerator", info.value("accelerator", json())},
               {"data_dir", data_dir_.string()},
               {"host_addresses", host_addresses()}};
    // Kept idle throughout; must still answer at the end (section 6).
    if (want("after") || want("hostile")) idle_ = create({}, "idle");
    if (want("task")) task();
    if (want("reach")) reach();
    if (want("leftovers")) {
      leftovers("guest kernel panic", [&](const std::string& id, int) {
        exec(id, {{"cmd", "echo c > /proc/sysrq-trigger"}, {"timeout", 10}});
      });
      leftovers("QEMU killed (SIGKILL)", [&](const std::string&, int pid) {
        if (pid <= 0 || ::kill(pid, SIGKILL) != 0)
          throw Error(Errc::internal, "cannot SIGKILL QEMU pid " + std::to_string(pid) + ": " +
                                          std::strerror(errno));
      });
    }
    if (want("time")) time_to_instance();
    if (want("hostile")) hostile();
    if (want("after")) after_all();
  }

  // Destroys every sandbox still tracked (also after an interrupt).
  void cleanup() {
    for (const auto& id : t_.ids()) destroy(id);
  }

  // The cleanup check: no sandbox of this probe is left in the daemon.
  void check_cleanup() {
    cleanup();
    json left = c_.call("GET", "/v1/sandboxes?metadata.airlock_probe=" + token_);
    std::string ids;
    for (const auto& sb : left) ids += sb.value("id", "") + " ";
    add_expect("7 cleanup", "every probe sandbox destroyed", "none left running", left.empty(),
               left.empty() ? "0 of " + std::to_string(created_) + " left" : "left: " + ids);
  }

 private:
  void step() {
    if (t_.interrupted()) throw Interrupted{};
  }
  bool want(const std::string& section) const {
    return o_.only.empty() || std::find(o_.only.begin(), o_.only.end(), section) != o_.only.end();
  }

  void add(ProbeCheck ch) {
    std::fprintf(stderr, "probe: [%s] %s: %s (%s)\n", ch.section.c_str(), ch.name.c_str(),
                 to_string(ch.status), one_line(ch.observed, 160).c_str());
    report.add(std::move(ch));
    step();
  }
  void add_expect(const std::string& section, const std::string& name,
                  const std::string& expectation, bool ok, const std::string& observed,
                  int64_t ms = 0) {
    add({section, name, expectation, observed, ok ? ProbeStatus::pass : ProbeStatus::fail, ms});
  }

  // A sandbox of the probe's image and policy, `extra` merged over the spec.
  std::string create(const json& extra, const std::string& role) {
    step();
    json spec{{"image", o_.image},
              {"timeout", 3600},
              {"metadata", {{"airlock_probe", token_}, {"role", role}}}};
    if (o_.network != "none") spec["network"] = {{"mode", o_.network}};
    for (const auto& [k, v] : extra.items()) spec[k] = v;
    json sb = c_.call("POST", "/v1/sandboxes", spec);
    std::string id = sb.value("id", "");
    t_.add(id);
    ++created_;
    last_pid_ = sb.value("pid", 0);
    step();
    return id;
  }

  void destroy(const std::string& id) {
    try {
      c_.call("DELETE", "/v1/sandboxes/" + id);
    } catch (const Error&) {
      // Already gone (crashed and cleaned by the daemon, or not found).
    }
    t_.forget(id);
  }

  Run exec(const std::string& id, json body) {
    step();
    Run r;
    auto t0 = Clock::now();
    constexpr size_t kKeep = 256 << 10;
    try {
      r.exit = c_.exec(id, body, [&](const json& ev) {
        std::string type = ev.value("type", "");
        if (type != "stdout" && type != "stderr") return;
        auto bytes = daemon::base64_decode(ev.value("data", ""));
        std::string& dst = type == "stdout" ? r.out : r.err;
        if (bytes && dst.size() < kKeep) dst += bytes->substr(0, kKeep - dst.size());
      });
      r.ok = true;
    } catch (const std::exception& e) {
      r.error = e.what();
    }
    r.ms = since_ms(t0);
    return r;
  }
  Run sh(const std::string& id, const std::string& cmd, double timeout = 60) {
    return exec(id, {{"cmd", cmd}, {"timeout", timeout}});
  }
  // `echo ok` answers in `id`: "" if so, else what happened.
  std::string still_works(const std::string& id) {
    Run r = sh(id, "echo ok");
    return r.succeeded() && r.out == "ok\n" ? "" : "echo ok: " + r.summary();
  }

  // Section 1: the ordinary task under the given policy.
  void task() {
    const std::string S = "1 task";
    std::string id = create({}, "task");
    bool none = o_.network == "none";
    // Whether the package sources answer (decides SKIPs under --network open).
    std::vector<OutsideResult> outside;
    if (!none) outside = outside_network(id);
    Run apt = sh(id, "command -v apt-get");
    if (!apt.succeeded()) {
      add({S, "install a package", "", "no package manager in image", ProbeStatus::skip});
    } else if (none) {
      Run r = sh(id, "apt-get install -y -q cowsay 2>&1", 120);
      add_expect(S, "install a package (apt-get)", "fails cleanly and fast (< 30 s)",
                 r.ok && r.code() != 0 && r.ms < 30000, r.summary() + ": " + one_line(r.out, 120),
                 r.ms);
    } else {
      std::string why = outside_missing(outside, "apt");
      if (!why.empty()) {
        add({S, "install a package (apt-get)", "works", why, ProbeStatus::skip});
      } else {
        Run r = sh(id,
                   "export DEBIAN_FRONTEND=noninteractive; apt-get update -q 2>&1 && "
                   "apt-get install -y -q cowsay 2>&1 && test -x /usr/games/cowsay",
                   900);
        add_expect(S, "install a package (apt-get)", "works", r.succeeded(),
                   r.summary() + ": " + one_line(r.out, 120), r.ms);
      }
    }
    if (!none) pip_task(id, outside);
    // example.com: a name reserved for documentation, resolvable everywhere.
    // curl (debian), else an HTTP GET over busybox nc (busybox-static's
    // wget crashes resolving a name without /etc/resolv.conf), else wget.
    Run f = sh(id,
               "if command -v curl >/dev/null; then curl -fsS -m 4 -o /dev/null "
               "http://example.com/; elif command -v nc >/dev/null; then printf 'GET / "
               "HTTP/1.0\\r\\nHost: example.com\\r\\n\\r\\n' | nc -w 4 example.com 80 | "
               "grep -q '^HTTP/'; elif command -v wget >/dev/null; then wget -T 4 -q -O /dev/null "
               "http://example.com/; else echo 'no curl, nc or wget'; exit 127; fi 2>&1",
               30);
    if (none)
      add_expect(S, "fetch a URL by name", "fails cleanly and fast (< 5 s)",
                 f.ok && f.code() > 0 && f.code() < 126 && f.ms < 5000,
                 f.summary() + ": " + one_line(f.out, 120), f.ms);
    else if (!f.succeeded() && !no_outside_network(outside).empty())
      // No package source answers either: the host has no outside network.
      add({S, "fetch a URL by name", "works (needs internet on the host)",
           f.summary() + "; " + no_outside_network(outside), ProbeStatus::skip, f.ms});
    else
      add_expect(S, "fetch a URL by name", "works (needs internet on the host)", f.succeeded(),
                 f.summary() + ": " + one_line(f.out, 120), f.ms);
    // Written by the guest to its disk, read back through the files API.
    auto t0 = Clock::now();
    Run w = sh(id, "seq 1 20000 > /root/probe.txt && sync");
    std::string expected;
    for (int i = 1; i <= 20000; ++i) expected += std::to_string(i) + "\n";
    std::string got, why;
    int fd = ::memfd_create("probe", MFD_CLOEXEC);
    try {
      if (fd < 0) throw_errno("memfd_create");
      c_.download(id, "/root/probe.txt", fd);
      got.resize(size_t(::lseek(fd, 0, SEEK_END)));
      if (::pread(fd, got.data(), got.size(), 0) != ssize_t(got.size())) got.clear();
    } catch (const std::exception& e) {
      why = e.what();
    }
    if (fd >= 0) ::close(fd);
    add_expect(S, "write a file, read it back", "works, same bytes",
               w.succeeded() && got == expected,
               !w.succeeded()    ? "write: " + w.summary()
               : got == expected ? std::to_string(got.size()) + " bytes written and read back"
                                 : "read back " + std::to_string(got.size()) + " of " +
                                       std::to_string(expected.size()) + " bytes " + why,
               since_ms(t0));
    reach_from(id, o_.network);
    guest_view(id);
    destroy(id);
  }

  // Whether the image's package sources answer from inside sandbox `id`:
  // the apt source the image is configured with (`apt-get --print-uris`)
  // and pip's configured index (its config, else pip's own default), each
  // resolved and connected to with a 5 s bound. No host name is named here:
  // whatever the image and pip are set up with is what the tasks would use.
  std::vector<OutsideResult> outside_network(const std::string& id) {
    static const char* kScript = R"SH(reach() {
  hp=$(printf '%s' "$2" | sed -n 's#^[a-z+]*://\([^/@]*@\)\{0,1\}\([^/]*\).*#\2#p')
  case "$2" in https*) dp=443 ;; *) dp=80 ;; esac
  host=${hp%:*}; port=${hp##*:}; [ "$host" = "$hp" ] && port=$dp
  [ -n "$host" ] || { echo "$1 - no-source"; return; }
  if ! timeout 5 getent hosts "$host" >/dev/null 2>&1; then echo "$1 $host unresolved"
  elif timeout 5 bash -c "exec 3<>/dev/tcp/$host/$port" 2>/dev/null; then echo "$1 $host ok"
  else echo "$1 $host unreachable"; fi
}
reach apt "$(apt-get update --print-uris 2>/dev/null | sed -n "s/^'\([^']*\)'.*/\1/p" | head -n 1)"
reach pip "$(python3 -m pip config get global.index-url 2>/dev/null ||
  python3 -c 'from pip._internal.models.index import PyPI; print(PyPI.simple_url)' 2>/dev/null)"
)SH";
    return parse_outside_lines(sh(id, kScript, 60).out);
  }

  // Section 1 (part): `pip install` of a package from pip's configured
  // index into a target directory (the image's Python is externally
  // managed: nothing of the system's is replaced), then imported.
  void pip_task(const std::string& id, const std::vector<OutsideResult>& outside) {
    const std::string S = "1 task";
    Run pip = sh(id, "python3 -m pip --version");
    if (!pip.succeeded()) {
      add({S, "install a Python package (pip)", "", "no pip in image", ProbeStatus::skip});
      return;
    }
    std::string why = outside_missing(outside, "pip");
    if (!why.empty()) {
      add({S, "install a Python package (pip)", "works", why, ProbeStatus::skip});
      return;
    }
    Run r = sh(id,
               "python3 -m pip install -q --no-cache-dir --target /root/probe-pip cowsay 2>&1 && "
               "PYTHONPATH=/root/probe-pip python3 -c 'import cowsay' 2>&1",
               900);
    add_expect(S, "install a Python package (pip)", "works", r.succeeded(),
               r.summary() + ": " + one_line(r.out, 120), r.ms);
  }

  // Section 2 (part): TCP connects from sandbox `id` to addresses that
  // must never answer, plus a host listener on all addresses.
  void reach_from(const std::string& id, const std::string& mode) {
    Listener l;
    std::string P = std::to_string(l.port());
    std::vector<std::string> targets = {"127.0.0.1 " + P, "127.0.0.1 22",  "169.254.169.254 80",
                                        "10.0.0.1 80",    "172.16.0.1 80", "192.168.0.1 80"};
    for (const auto& a : host_addresses()) targets.push_back(a + " " + P);
    // busybox nc (minimal) or bash's /dev/tcp (debian); the default gateway
    // (the network helper's side) too.
    std::string script =
        "t() { if command -v nc >/dev/null 2>&1; then nc -w 2 \"$1\" \"$2\" </dev/null "
        ">/dev/null 2>&1; elif command -v bash >/dev/null 2>&1; then timeout 3 bash -c "
        "\"exec 3<>/dev/tcp/$1/$2\" 2>/dev/null; else return 99; fi; echo \"$1:$2 $?\"; }\n"
        "gw=$(awk '$2==\"00000000\"{h=$3; printf \"%d.%d.%d.%d\", \"0x\" substr(h,7,2), "
        "\"0x\" substr(h,5,2), \"0x\" substr(h,3,2), \"0x\" substr(h,1,2)}' /proc/net/route "
        "2>/dev/null)\n"
        "[ -n \"$gw\" ] && t \"$gw\" " +
        P + "\n";
    for (const auto& t : targets) script += "t " + t + "\n";
    script += "true\n";
    Run r = sh(id, script, 120);
    auto results = parse_reach_lines(r.out);
    std::string open, tested;
    bool no_tool = false;
    for (const auto& x : results) {
      if (x.rc == 0) open += x.target + " ";
      if (x.rc == 99) no_tool = true;
    }
    int accepted = l.drain();
    bool ok = r.succeeded() && !no_tool && results.size() >= targets.size() && open.empty() &&
              accepted == 0;
    std::string obs = !r.succeeded() ? r.summary()
                      : no_tool      ? "no nc or bash in the image to test with"
                      : !open.empty()
                          ? "CONNECTED: " + open
                          : std::to_string(results.size()) + " targets refused (loopback, " +
                                "metadata, RFC 1918, gateway, " +
                                std::to_string(host_addresses().size()) + " host addresses)";
    if (accepted) obs += "; host listener accepted " + std::to_string(accepted);
    add_expect("2 reach", "TCP to private addrs, network " + mode, "all refused", ok, obs, r.ms);
  }

  // Section 2 (part): what the guest sees of the host.
  void guest_view(const std::string& id) {
    const std::string S = "2 reach";
    Run s = sh(id, "for p in '" + paths_.socket.string() + "' '" + data_dir_.string() +
                       "'; do [ -e \"$p\" ] && echo \"visible: $p\"; done; true");
    add_expect(S, "daemon socket and data dir", "not visible in the guest",
               s.succeeded() && trim(s.out).empty(),
               s.succeeded() ? (trim(s.out).empty() ? "absent" : one_line(s.out)) : s.summary());
    struct View {
      const char* name;
      const char* cmd;
    };
    for (View v : {View{"/proc/cpuinfo model", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"},
                   View{"ls /sys/class", "ls /sys/class | tr '\\n' ' '"},
                   View{"ls /dev", "ls /dev | tr '\\n' ' '"},
                   View{"/proc/modules count", "wc -l < /proc/modules 2>&1"}}) {
      Run r = sh(id, v.cmd);
      add_expect(S, std::string("guest sees: ") + v.name, "reported", r.succeeded(),
                 r.succeeded() ? one_line(r.out, 4000) : r.summary());
    }
    Run k = sh(id, "[ -e /dev/kvm ] && echo present || echo absent");
    add_expect(S, "/dev/kvm in the guest", "absent", k.succeeded() && trim(k.out) == "absent",
               k.succeeded() ? trim(k.out) : k.summary());
  }

  void reach() {
    // The always-deny set must hold with the network on, too.
    std::string id = create({{"network", {{"mode", "open"}}}}, "reach-open");
    reach_from(id, "open");
    destroy(id);
  }

  // Waits up to `s` seconds for sandbox `id` to be reported not running;
  // returns its state ("" if still running).
  std::string wait_not_running(const std::string& id, double s, std::string& reason) {
    auto deadline = Clock::now() + std::chrono::milliseconds(int64_t(s * 1000));
    while (true) {
      try {
        json sb = c_.call("GET", "/v1/sandboxes/" + id);
        std::string st = sb.value("state", "");
        if (st != "running" && st != "starting") {
          reason = sb.value("reason", "");
          return st;
        }
      } catch (const Error& e) {
        if (e.code() == Errc::not_found) return "gone";
      }
      if (Clock::now() >= deadline) return "";
      step();
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }

  // What is left on the host of sandbox `id` (QEMU `pid`, run dir, cgroups,
  // processes naming it); waits up to 10 s for the daemon's teardown.
  std::string host_leftovers(const std::string& id, int pid, const std::vector<std::string>& cgs) {
    std::string left;
    auto deadline = Clock::now() + std::chrono::seconds(10);
    do {
      left.clear();
      if (pid > 0 && !pids_mentioning(id).empty()) left += "processes naming it; ";
      if (pid > 0 && fs::exists("/proc/" + std::to_string(pid))) {
        std::ifstream cf("/proc/" + std::to_string(pid) + "/cmdline");
        std::string cmd((std::istreambuf_iterator<char>(cf)), {});
        if (cmd.find(id) != std::string::npos) left += "QEMU pid " + std::to_string(pid) + "; ";
      }
      std::error_code ec;
      if (fs::exists(data_dir_ / "sandboxes" / id, ec)) left += "run dir; ";
      for (const auto& cg : cgs)
        if (fs::exists(cg, ec)) left += "cgroup " + cg + "; ";
      if (left.empty()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    } while (Clock::now() < deadline);
    return left;
  }

  std::vector<std::string> cgroups_of(const std::string& id) {
    std::vector<std::string> cgs;
    try {
      json p = c_.call("GET", "/v1/sandboxes/" + id + "/posture");
      json paths = p["process"]["cgroup"].value("paths", json::object());
      for (const auto& [k, v] : paths.items())
        if (v.is_string()) cgs.push_back(v.get<std::string>());
    } catch (const std::exception&) {
      // No posture: no cgroup paths to check (reported in the observation).
    }
    return cgs;
  }

  // Section 3: crash a sandbox with `crash`, then check the host is clean.
  template <typename F>
  void leftovers(const std::string& what, F crash) {
    const std::string S = "3 leftovers";
    std::string id = create({{"network", {{"mode", "none"}}}}, "crash");
    int pid = last_pid_;
    auto cgs = cgroups_of(id);
    auto t0 = Clock::now();
    std::string crash_error;
    try {
      crash(id, pid);
    } catch (const std::exception& e) {
      crash_error = e.what();
    }
    std::string reason;
    std::string state = crash_error.empty() ? wait_not_running(id, 15, reason) : "";
    int64_t ms = since_ms(t0);
    add_expect(S, what + ": reported", "not running within 15 s", !state.empty(),
               !crash_error.empty() ? crash_error
               : state.empty()
                   ? "still running after 15 s"
                   : state + (reason.empty() ? "" : " (" + reason + ")") + " after " + secs(ms),
               ms);
    std::string left = state.empty() ? "not checked: still running" : host_leftovers(id, pid, cgs);
    add_expect(S, what + ": host clean", "no QEMU, process, run dir or cgroup left",
               !state.empty() && left.empty(),
               left.empty() ? "QEMU pid " + std::to_string(pid) + " gone, run dir gone, " +
                                  std::to_string(cgs.size()) + " cgroup dirs gone"
                            : "left: " + left);
    destroy(id);
  }

  // Section 4: create -> first exec `true`.
  void time_to_instance() {
    int n = o_.quick ? 3 : 10;
    std::vector<double> ms;
    std::string failure;
    for (int i = 0; i < n && failure.empty(); ++i) {
      auto t0 = Clock::now();
      std::string id;
      try {
        id = create({}, "timing");
        Run r = exec(id, {{"argv", {"true"}}, {"timeout", 60}});
        if (!r.succeeded()) failure = "true: " + r.summary();
        ms.push_back(double(since_ms(t0)));
      } catch (const Error& e) {
        failure = e.what();
      }
      if (!id.empty()) destroy(id);
    }
    char buf[128] = "";
    if (!ms.empty())
      std::snprintf(buf, sizeof buf, "p50 %.2f s over %zu (min %.2f, max %.2f)",
                    median_ms(ms) / 1000, ms.size(), *std::min_element(ms.begin(), ms.end()) / 1000,
                    *std::max_element(ms.begin(), ms.end()) / 1000);
    context["time_to_instance_p50_ms"] = median_ms(ms);
    add_expect("4 time", "create → first exec (p50 over " + std::to_string(n) + ")",
               "every instance answers", failure.empty(),
               failure.empty() ? buf : std::string(buf) + " " + failure);
  }

  // One hostile case in `id`: PASS if `expected(run)` and `echo ok` works after.
  template <typename F>
  void hostile_case(const std::string& id, const std::string& name, const std::string& expectation,
                    json body, F expected) {
    Run r = exec(id, std::move(body));
    std::string after = still_works(id);
    add_expect("5 hostile", name, expectation + "; then echo ok works",
               expected(r) && after.empty(),
               r.summary() +
                   (r.ok && r.exit.value("truncated", false)
                        ? ", truncated, " + std::to_string(r.exit.value("stdout_dropped", 0)) +
                              " bytes dropped"
                        : "") +
                   (after.empty() ? "; echo ok: ok" : "; " + after),
               r.ms);
  }

  void hostile() {
    // The smallest disk the image allows, so filling it is quick.
    json extra{{"memory_mb", 256}, {"network", {{"mode", "none"}}}};
    if (rootfs_mb_ > 0) extra["disk_mb"] = std::max(rootfs_mb_, 128);
    std::string id = create(extra, "hostile");
    auto reason_is = [](const char* want) {
      return [want](const Run& r) { return r.reason() == want; };
    };
    hostile_case(id, "infinite loop, timeout 2 s", "reason timeout",
                 {{"cmd", "while :; do :; done"}, {"timeout", 2}}, reason_is("timeout"));
    hostile_case(id, "fork bomb, limits.pids 64", "reason pids_limit",
                 {{"cmd", "bomb() { bomb | bomb & }; bomb; sleep 30"},
                  {"timeout", 15},
                  {"limits", {{"pids", 64}}}},
                 reason_is("pids_limit"));
    // 5 x 60 MiB held at once is past the 256 MiB VM.
    hostile_case(
        id, "memory hog past guest RAM", "reason oom_killed",
        {{"cmd",
          "for i in 1 2 3 4 5; do dd if=/dev/zero of=/dev/null bs=60M count=100000 & done; "
          "wait"},
         {"timeout", 300}},
        reason_is("oom_killed"));
    hostile_case(id, "disk fill (dd to /root)", "reason no_space",
                 {{"cmd", "dd if=/dev/zero of=/root/fill bs=1M"}, {"timeout", 900}},
                 reason_is("no_space"));
    sh(id, "rm -f /root/fill", 300);
    hostile_case(id, "inode fill", "reason no_space",
                 {{"cmd",
                   "n=$(df -i /root 2>/dev/null | awk 'NR==2{print $4}'); "
                   "mkdir -p /root/inodes && cd /root/inodes && seq 1 $((${n:-200000} + 2000)) | "
                   "xargs touch"},
                  {"timeout", 900}},
                 reason_is("no_space"));
    sh(id, "rm -rf /root/inodes", 900);
    hostile_case(
        id, "output flood, output limit 100000", "truncated: true",
        {{"cmd", "head -c 3000000 /dev/zero"}, {"timeout", 300}, {"output_limit_bytes", 100000}},
        [](const Run& r) {
          return r.ok && r.exit.value("truncated", false) && r.out.size() == 100000;
        });
    {
      Run r = sh(id, "(setsid sh -c 'sleep 987003' &); sleep 1; echo started", 120);
      Run ps = sh(id, kGuestPs);
      bool gone = ps.succeeded() && ps.out.find("987003") == std::string::npos;
      std::string after = still_works(id);
      add_expect("5 hostile", "double-forked setsid daemon", "gone after the exec; echo ok works",
                 r.succeeded() && gone && after.empty(),
                 r.summary() + (gone ? "; daemon gone" : "; daemon STILL RUNNING") +
                     (after.empty() ? "" : "; " + after),
                 r.ms);
    }
    {
      Run m = sh(id,
                 "ko=$(find / -xdev -name '*.ko*' 2>/dev/null | head -1); "
                 "modprobe dummy >/dev/null 2>&1; echo \"modprobe dummy: rc $?\"; "
                 "insmod ${ko:-/probe-none.ko} >/dev/null 2>&1; echo \"insmod ${ko:-(no .ko "
                 "found)}: rc $?\"",
                 60);
      add_expect("5 hostile", "load a kernel module as guest root",
                 "reported (only the guest's own kernel)", m.succeeded(),
                 m.succeeded() ? one_line(m.out) : m.summary(), m.ms);
    }
    escape_sysrq(id);
    raw_disk_write();
    hostile_id_ = id;
  }

  // `echo b > /proc/sysrq-trigger` in a throwaway sandbox: it dies, the
  // others do not notice.
  void escape_sysrq(const std::string& hostile) {
    std::string id = create({{"network", {{"mode", "none"}}}}, "sysrq");
    auto t0 = Clock::now();
    Run r = sh(id, "echo b > /proc/sysrq-trigger; sleep 5; echo survived", 20);
    std::string reason, state = wait_not_running(id, 15, reason);
    std::string others = still_works(idle_);
    if (others.empty()) others = still_works(hostile);
    add_expect("5 hostile", "sysrq b (reboot) from guest root",
               "that sandbox dies; others unaffected", !state.empty() && others.empty(),
               (state.empty() ? "still running (" + r.summary() + ")"
                              : state + (reason.empty() ? "" : " (" + reason + ")")) +
                   (others.empty() ? "; others answer echo ok" : "; OTHERS: " + others),
               since_ms(t0));
    destroy(id);
  }

  // Random bytes over the start of the root disk, then a new sandbox must
  // get a clean disk.
  void raw_disk_write() {
    std::string id = create({{"network", {{"mode", "none"}}}}, "rawdisk");
    Run w = sh(id, "dd if=/dev/urandom of=/dev/vda bs=1M count=4 2>&1; sync", 60);
    add_expect("5 hostile", "raw write to /dev/vda (guest root)", "reported (its own disk only)",
               w.ok || !w.error.empty(),
               w.ok ? w.summary() + ": " + one_line(w.out, 100) : w.summary(), w.ms);
    destroy(id);
    std::string fresh = create({{"network", {{"mode", "none"}}}}, "after-rawdisk");
    Run r = exec(fresh, {{"argv",
                          {"/bin/sh", "-c",
                           "awk '$2==\"/\"{print $1, $3}' /proc/mounts; ls /etc >/dev/null "
                           "&& echo sh-ok"}},
                         {"timeout", 60}});
    bool ok = r.succeeded() && r.out.find("sh-ok") != std::string::npos;
    add_expect("5 hostile", "a new sandbox after the raw write",
               "clean disk: / mounts, /bin/sh works", ok,
               r.succeeded() ? "root " + one_line(r.out) : r.summary(), r.ms);
    destroy(fresh);
  }

  // Section 6: after all of it.
  void after_all() {
    const std::string S = "6 after";
    auto t0 = Clock::now();
    std::string err;
    try {
      json info = c_.call("GET", "/v1/info");
      if (!info.contains("version")) err = "no version in the answer";
    } catch (const std::exception& e) {
      err = e.what();
    }
    add_expect(S, "GET /v1/info", "the daemon answers", err.empty(),
               err.empty() ? "answered in " + std::to_string(since_ms(t0)) + " ms" : err);
    std::string idle = still_works(idle_);
    add_expect(S, "the sandbox idle since the start", "still answers echo ok", idle.empty(),
               idle.empty() ? "ok" : idle);
    if (!hostile_id_.empty()) destroy(hostile_id_);
  }

  const client::Client& c_;
  ProbeOptions o_;
  DaemonPaths paths_;
  SandboxTracker& t_;
  std::string token_, idle_, hostile_id_;
  fs::path data_dir_;
  int rootfs_mb_ = 0, last_pid_ = 0, created_ = 0;
};

}  // namespace

int run_probe(const client::Client& client, const ProbeOptions& opts, const DaemonPaths& paths) {
  if (opts.network != "none" && opts.network != "open")
    throw Error(Errc::invalid_argument, "--network must be none or open, not " + opts.network,
                "network");
  for (const auto& section : opts.only)
    if (std::find(kProbeSections.begin(), kProbeSections.end(), section) == kProbeSections.end())
      throw Error(
          Errc::invalid_argument,
          "--only: unknown section " + section + " (task, reach, leftovers, time, hostile, after)",
          "only");
  static SandboxTracker tracker;
  // Ctrl-C / SIGTERM: a thread destroys the probe's sandboxes (ending any
  // call in flight) and flags the battery, which stops at its next step
  // and cleans up what was created meanwhile. A second signal exits at once.
  sigset_t set = block_terminating_signals();
  std::thread([set, &client] {
    int sig = 0;
    sigwait(&set, &sig);
    tracker.interrupt();
    std::fprintf(stderr, "probe: interrupted; destroying its sandboxes\n");
    std::thread([&client] {
      for (const auto& id : tracker.ids()) try {
          client.call("DELETE", "/v1/sandboxes/" + id);
        } catch (const std::exception&) {
        }
    }).detach();
    sigwait(&set, &sig);
    std::_Exit(130);
  }).detach();

  Battery b(client, opts, paths, tracker);
  std::optional<std::string> aborted;
  try {
    b.run();
  } catch (const Interrupted&) {
    aborted = "interrupted";
  } catch (const std::exception& e) {
    aborted = e.what();
  }
  try {
    b.check_cleanup();
  } catch (const Interrupted&) {
    // The cleanup ran; only the check's report step saw the flag.
  } catch (const std::exception& e) {
    b.report.add({"7 cleanup", "every probe sandbox destroyed", "none left running",
                  std::string("cleanup failed: ") + e.what(), ProbeStatus::fail});
  }
  if (tracker.interrupted()) {
    b.cleanup();
    std::fprintf(stderr, "probe: interrupted\n");
    return 130;
  }
  if (aborted)
    b.report.add({"-", "battery", "runs to the end", "aborted: " + *aborted, ProbeStatus::fail});
  if (opts.json)
    std::cout << b.report.to_json(b.context).dump(2) << "\n";
  else
    std::cout << b.report.format_table();
  return b.report.exit_code();
}

}  // namespace airlock::cli

#include "guest/exec_tree.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "common/error.h"
#include "guest/log.h"
#include "guest/ops.h"
#include "guest/spawn.h"
#include "protocol/messages.h"

namespace airlock::guest {
namespace {

using nlohmann::json;
namespace code = protocol::code;

// How often the CPU-time limit is checked against the cgroup's cpu.stat.
constexpr long kCpuTickMs = 100;

int write_str(const std::string& path, const char* value) {
  int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = write(fd, value, strlen(value));
  close(fd);
  return n < 0 ? -1 : 0;
}

std::vector<std::string> parse_argv(const json& req) {
  auto it = req.find("argv");
  if (it == req.end() || !it->is_array() || it->empty())
    throw Error(Errc::invalid_argument, "argv must be a non-empty array of strings", "argv");
  std::vector<std::string> argv;
  for (const auto& a : *it) {
    if (!a.is_string())
      throw Error(Errc::invalid_argument, "argv must be a non-empty array of strings", "argv");
    argv.push_back(a.get<std::string>());
    if (argv.back().find('\0') != std::string::npos)
      throw Error(Errc::invalid_argument, "argv entries may not contain NUL bytes", "argv");
  }
  if (argv[0].empty()) throw Error(Errc::invalid_argument, "argv[0] is empty", "argv");
  return argv;
}

std::vector<std::string> build_env(const json& req, const User& u, bool pty) {
  std::map<std::string, std::string> env = {
      {"PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
      {"HOME", u.home},
      {"USER", u.name},
      {"LOGNAME", u.name},
      {"SHELL", u.shell},
      // A terminal gets a capable TERM unless the client names its own.
      {"TERM", pty ? "xterm-256color" : "dumb"},
      {"LANG", "C.UTF-8"}};
  auto it = req.find("env");
  if (it != req.end() && !it->is_null()) {
    if (!it->is_object())
      throw Error(Errc::invalid_argument, "env must be an object of strings", "env");
    for (const auto& [k, v] : it->items()) {
      if (!v.is_string())
        throw Error(Errc::invalid_argument, "env." + k + " must be a string", "env");
      if (k.empty() || k.find('=') != std::string::npos || k.find('\0') != std::string::npos)
        throw Error(Errc::invalid_argument, "env name '" + k + "' is invalid", "env");
      std::string value = v.get<std::string>();
      if (value.find('\0') != std::string::npos)
        throw Error(Errc::invalid_argument, "env." + k + " contains a NUL byte", "env");
      env[k] = value;
    }
  }
  std::vector<std::string> out;
  for (auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

ExecLimits parse_limits(const json& req) {
  ExecLimits l;
  auto it = req.find("limits");
  if (it == req.end() || it->is_null()) return l;
  if (!it->is_object())
    throw Error(Errc::invalid_argument, "limits must be an object {pids, memory_mb, cpu_seconds}",
                "limits");
  for (const auto& [k, v] : it->items()) {
    const std::string field = "limits." + k;
    if (k == "pids" || k == "memory_mb") {
      if (v.is_null()) continue;
      if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > 1048576)
        throw Error(Errc::invalid_argument, field + " must be an integer in 1..1048576", field);
      (k == "pids" ? l.pids : l.memory_mb) = v.get<int64_t>();
    } else if (k == "cpu_seconds") {
      if (v.is_null()) continue;
      if (!v.is_number() || !(v.get<double>() >= 0.01) || v.get<double>() > 31536000)
        throw Error(Errc::invalid_argument, field + " must be a number in 0.01..31536000", field);
      l.cpu_seconds = v.get<double>();
    } else {
      throw Error(Errc::invalid_argument,
                  field + " is not a known limit (pids, memory_mb, cpu_seconds)", field);
    }
  }
  return l;
}

// True if the filesystem holding `path` has no room left for an ordinary
// writer: (nearly) no available blocks or no free inodes. "Nearly": ext4
// answers ENOSPC with a block or two still counted available (measured: 1
// of 117203 after a dd fill), so under 1 MiB counts as full.
bool fs_full(const std::string& path) {
  struct statvfs st {};
  if (path.empty() || statvfs(path.c_str(), &st) != 0) return false;
  if (st.f_blocks == 0) return false;  // pseudo filesystems
  const uint64_t avail = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  return avail < (1u << 20) || (st.f_files > 0 && st.f_favail < 16);
}

}  // namespace

User parse_user(const nlohmann::json& req) {
  auto it = req.find("user");
  if (it == req.end() || it->is_null()) return *lookup_user("0");
  std::string spec;
  if (it->is_number_unsigned())
    spec = std::to_string(it->get<uint64_t>());
  else if (it->is_string())
    spec = it->get<std::string>();
  else
    throw Error(Errc::invalid_argument, "user must be a name or a numeric uid", "user");
  if (spec.empty()) throw Error(Errc::invalid_argument, "user is empty", "user");
  auto u = lookup_user(spec);
  if (!u) throw GuestError(code::not_found, "unknown user '" + spec + "' (not in /etc/passwd)");
  if (spec == "0" || u->uid == 0) {
    // A bare uid 0 without passwd entry still gets root's home.
    if (u->home == "/" && access("/root", F_OK) == 0) u->home = "/root";
  }
  return *u;
}

void parse_winsize(const json& j, const std::string& what, uint16_t& cols, uint16_t& rows) {
  if (!j.is_object())
    throw Error(Errc::invalid_argument, what + " must be an object {cols, rows}", what);
  for (const char* k : {"cols", "rows"}) {
    auto it = j.find(k);
    if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() < 1 ||
        it->get<int64_t>() > 4096)
      throw Error(Errc::invalid_argument, what + "." + k + " must be an integer in 1..4096",
                  what + "." + k);
  }
  cols = static_cast<uint16_t>(j["cols"].get<int64_t>());
  rows = static_cast<uint16_t>(j["rows"].get<int64_t>());
}

ExecSpec parse_exec_spec(const json& req) {
  ExecSpec s;
  if (auto p = req.find("pty"); p != req.end() && !p->is_null()) {
    parse_winsize(*p, "pty", s.cols, s.rows);
    s.pty = true;
  }
  s.user = parse_user(req);
  auto a = req.find("argv");
  if (s.pty && (a == req.end() || a->is_null()))
    s.argv = {s.user.shell.empty() ? "/bin/sh" : s.user.shell, "-l"};
  else
    s.argv = parse_argv(req);
  s.env = build_env(req, s.user, s.pty);
  if (auto c = protocol::optional_string(req, "cwd")) {
    s.cwd = *c;
    if (s.cwd.empty() || s.cwd[0] != '/')
      throw Error(Errc::invalid_argument, "cwd must be an absolute path", "cwd");
  } else {
    struct stat st {};
    s.cwd = stat(s.user.home.c_str(), &st) == 0 && S_ISDIR(st.st_mode) ? s.user.home : "/";
  }
  s.want_stdin = protocol::optional_bool(req, "stdin", false);
  s.timeout_ms = protocol::optional_int(req, "timeout_ms", 0, 0, 365LL * 86400 * 1000);
  s.limits = parse_limits(req);
  s.output_limit = static_cast<uint64_t>(
      protocol::optional_int(req, "output_limit_bytes", kDefaultOutputLimit, 0, int64_t{1} << 40));
  s.background = protocol::optional_bool(req, "background", false);
  s.output_buffer = static_cast<uint64_t>(protocol::optional_int(
      req, "output_buffer_bytes", kDefaultOutputBuffer, 0, int64_t{1} << 30));
  s.detached_stdin_ms = protocol::optional_int(req, "detached_stdin_ms", kDefaultDetachedStdinMs, 0,
                                               365LL * 86400 * 1000);
  if (auto id = protocol::optional_string(req, "exec_id")) {
    bool ok = !id->empty() && id->size() <= 64;
    for (char c : *id)
      if (!(isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_')) ok = false;
    if (!ok)
      throw Error(Errc::invalid_argument, "exec_id must be 1..64 of [A-Za-z0-9_-]", "exec_id");
    s.exec_id = *id;
  }
  if (s.background && s.pty)
    throw Error(Errc::invalid_argument, "a background exec takes no pty", "pty");
  return s;
}

ProcTree::ProcTree(Server& server) : server_(server) {}

ProcTree::~ProcTree() {
  kill();
  release();
}

namespace {

// The child did not start: `what` of the stage it failed at, with its errno.
[[noreturn]] void throw_spawn_failure(const SpawnResult& sr, const ExecSpec& spec) {
  errno = sr.err;
  switch (sr.stage) {
    case SpawnStage::cwd:
      throw_sys("cwd " + spec.cwd);
    case SpawnStage::user:
      throw_sys("switching to user " + spec.user.name);
    case SpawnStage::cgroup:
      throw_sys("joining the exec's cgroup");
    case SpawnStage::exec:
      throw_sys("exec " + spec.argv[0]);
    case SpawnStage::clone:
      throw_sys("clone");
    default:
      throw_sys("setting up stdio");
  }
}

}  // namespace

void ProcTree::make_cgroup() {
  if (server_.cgroup_root().empty()) {
    // A development host without a cgroup for us: only CPU time can still
    // be bounded (per process, by RLIMIT_CPU).
    if (limits_.pids || limits_.memory_mb)
      throw Error(Errc::invalid_argument,
                  "limits.pids and limits.memory_mb need cgroup v2, which this agent does not have",
                  limits_.pids ? "limits.pids" : "limits.memory_mb");
    return;
  }
  // A fresh cgroup: made ahead of time after the previous exec (the
  // server's spare), or now. Throws GuestError naming the mkdir.
  cg_ = server_.take_cgroup(limits_.pids || limits_.memory_mb || limits_.cpu_seconds > 0);
  cgroup_ = cg_.path;
  auto set = [&](const char* file, const std::string& value, bool required) {
    if (write_str(cgroup_ + "/" + file, value.c_str()) != 0 && required) {
      int e = errno;
      release();
      throw GuestError(code::internal, std::string("cannot set ") + file +
                                           " of the exec's cgroup: " + strerror(e) +
                                           " (controller not available?)");
    }
  };
  if (limits_.pids) set("pids.max", std::to_string(limits_.pids), true);
  if (limits_.memory_mb) {
    set("memory.max", std::to_string(limits_.memory_mb << 20), true);
    // No swap in the VM, but if there were, a limit must not spill into it.
    set("memory.swap.max", "0", false);
  }
}

void ProcTree::arm_timer(int& fd, int64_t first_ms, int64_t every_ms, std::function<void()> fn) {
  fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (fd < 0) return;
  itimerspec its{};
  its.it_value.tv_sec = first_ms / 1000;
  its.it_value.tv_nsec = (first_ms % 1000) * 1000000;
  its.it_interval.tv_sec = every_ms / 1000;
  its.it_interval.tv_nsec = (every_ms % 1000) * 1000000;
  if (timerfd_settime(fd, 0, &its, nullptr) != 0) {
    close(fd);
    fd = -1;
    return;
  }
  server_.watch(fd, EPOLLIN, [fd, fn](uint32_t) {
    uint64_t ticks;
    ssize_t r = read(fd, &ticks, sizeof ticks);
    (void)r;
    fn();
  });
}

void ProcTree::spawn(const ExecSpec& spec, int in_fd, int out_fd, int err_fd,
                     std::function<void(int status)> on_exit) {
  limits_ = spec.limits;
  cwd_ = spec.cwd;
  make_cgroup();
  const std::string procs = cgroup_.empty() ? "" : cgroup_ + "/cgroup.procs";

  // Everything the child needs is prepared before the clone: after it,
  // only system calls (spawn.h).
  std::vector<char*> cargv, cenv;
  for (auto& a : spec.argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (auto& e : spec.env) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  const User& user = spec.user;
  SpawnPlan plan;
  plan.argv = cargv.data();
  plan.envp = cenv.data();
  plan.in_fd = in_fd;
  plan.out_fd = out_fd;
  plan.err_fd = err_fd;
  plan.pty = spec.pty;
  plan.cwd = spec.cwd.c_str();
  plan.uid = user.uid;
  plan.gid = user.gid;
  plan.groups = user.groups.data();
  plan.ngroups = user.groups.size();
  // Per-process backstop of the cgroup-wide CPU watch below.
  if (limits_.cpu_seconds > 0)
    plan.cpu_seconds = static_cast<rlim_t>(std::ceil(limits_.cpu_seconds));
  plan.cgroup_fd = cg_.fd;
  if (!procs.empty()) plan.cgroup_procs = procs.c_str();

  trace_.prepared = monotonic_us();
  start_ = std::chrono::steady_clock::now();
  SpawnResult sr = spawn_process(plan, &trace_.spawn);
  pid_t pid = sr.pid;
  if (pid < 0) {
    release();
    throw_spawn_failure(sr, spec);
  }
  pid_ = pgid_ = pid;
  server_.on_child_exit(pid, [this, cb = std::move(on_exit)](int st) {
    exited_ = true;
    status_ = st;
    pid_ = -1;
    end_ = std::chrono::steady_clock::now();
    trace_.reaped = monotonic_us();
    // Judged now, while whatever filled the disk is still there (and only
    // for a failure, the only case where it can be the reason).
    const bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
    no_space_ = !ok && (fs_full("/") || fs_full(cwd_));
    if (timer_fd_ >= 0) server_.unwatch(timer_fd_), close(timer_fd_), timer_fd_ = -1;
    if (cpu_fd_ >= 0) server_.unwatch(cpu_fd_), close(cpu_fd_), cpu_fd_ = -1;
    cb(st);
  });
  if (spec.timeout_ms > 0) arm_timer(timer_fd_, spec.timeout_ms, 0, [this] { on_timeout(); });
  if (limits_.cpu_seconds > 0 && !cgroup_.empty())
    arm_timer(cpu_fd_, kCpuTickMs, kCpuTickMs, [this] { on_cpu_tick(); });
}

void ProcTree::on_timeout() {
  if (timer_fd_ >= 0) server_.unwatch(timer_fd_), close(timer_fd_), timer_fd_ = -1;
  timed_out_ = true;
  kill();
}

void ProcTree::on_cpu_tick() {
  uint64_t used_us = cgroup_value("cpu.stat", "usage_usec");
  if (static_cast<double>(used_us) < limits_.cpu_seconds * 1e6) return;
  if (cpu_fd_ >= 0) server_.unwatch(cpu_fd_), close(cpu_fd_), cpu_fd_ = -1;
  cpu_killed_ = true;
  kill();
}

namespace {
// The value of `key` in "key value" lines.
uint64_t value_of(char* text, const std::string& key) {
  for (char* line = text; line && *line;) {
    char* next = strchr(line, '\n');
    if (next) *next++ = 0;
    char* sp = strchr(line, ' ');
    if (sp && static_cast<size_t>(sp - line) == key.size() &&
        key.compare(0, key.size(), line, key.size()) == 0)
      return strtoull(sp + 1, nullptr, 10);
    line = next;
  }
  return 0;
}
}  // namespace

uint64_t ProcTree::cgroup_value(int fd, const std::string& file, const std::string& key) const {
  if (fd < 0) return cgroup_value(file, key);
  char buf[4096];
  ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return 0;
  buf[n] = 0;
  return value_of(buf, key);
}

uint64_t cgroup_key(int dir_fd, const std::string& file, const std::string& key) {
  // Plain reads, no iostream set-up (some are read at every exec's end).
  int fd = openat(dir_fd, file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[4096];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  return value_of(buf, key);
}

uint64_t ProcTree::cgroup_value(const std::string& file, const std::string& key) const {
  if (cgroup_.empty()) return 0;
  return cgroup_key(AT_FDCWD, cgroup_ + "/" + file, key);
}

void ProcTree::signal(int signo, bool from_host) {
  if (from_host) host_signaled_ = true;
  if (signo == SIGKILL) {
    kill();
    return;
  }
  if (!cgroup_.empty()) {
    std::ifstream procs(cgroup_ + "/cgroup.procs");
    pid_t p;
    while (procs >> p) ::kill(p, signo);
  } else if (pgid_ > 0) {
    ::kill(-pgid_, signo);
  }
}

void ProcTree::kill() {
  if (!cgroup_.empty()) {
    if (cg_.kill_fd >= 0 ? write(cg_.kill_fd, "1", 1) == 1
                         : write_str(cgroup_ + "/cgroup.kill", "1") == 0)
      return;
    // Kernels before 5.14 have no cgroup.kill: kill member by member, twice
    // to catch children forked meanwhile.
    for (int round = 0; round < 2; ++round) {
      std::ifstream procs(cgroup_ + "/cgroup.procs");
      pid_t p;
      while (procs >> p) ::kill(p, SIGKILL);
    }
  } else if (pgid_ > 0) {
    // No cgroup (development host): the session's process group is the best
    // we have; processes that setsid() away escape it.
    ::kill(-pgid_, SIGKILL);
  }
}

bool ProcTree::empty() const {
  if (!cgroup_.empty()) return cgroup_value("cgroup.events", "populated") == 0;
  return pgid_ <= 0 || (::kill(-pgid_, 0) != 0 && errno == ESRCH);
}

json ProcTree::outcome() const {
  json r;
  bool signaled = false;
  if (WIFEXITED(status_)) {
    r["exit_code"] = WEXITSTATUS(status_);
    r["signal"] = nullptr;
  } else {
    signaled = WIFSIGNALED(status_);
    r["exit_code"] = nullptr;
    r["signal"] = signaled ? WTERMSIG(status_) : 0;
  }
  const bool failed = signaled || WEXITSTATUS(status_) != 0;
  const int sig = signaled ? WTERMSIG(status_) : 0;
  const char* reason;
  if (host_signaled_ && signaled)
    reason = "killed";
  else if (cpu_killed_ || sig == SIGXCPU)
    reason = "cpu_limit";
  else if (cgroup_value(cg_.events_fd, "memory.events", "oom_kill") > cg_.base_oom_kills)
    reason = "oom_killed";
  else if ((failed || timed_out_) && cgroup_value("pids.events", "max") > cg_.base_pids_max)
    reason = "pids_limit";
  else if (timed_out_)
    // The agent's own decision wins over the disk-space heuristic below: a
    // program that hung on (or after) a full disk was still ended by its
    // timeout, and a full disk says nothing about why.
    reason = "timeout";
  else if (no_space_ && failed)
    reason = "no_space";
  else if (signaled)
    reason = "signaled";
  else
    reason = "exited";
  r["reason"] = reason;
  r["timed_out"] = timed_out_;
  r["duration_ms"] = std::chrono::duration_cast<std::chrono::milliseconds>(
                         (exited_ ? end_ : std::chrono::steady_clock::now()) - start_)
                         .count();
  // The same in microseconds: fork to the main process's exit (what the
  // start-up benchmark compares the host's round trip with).
  r["run_us"] = std::chrono::duration_cast<std::chrono::microseconds>(
                    (exited_ ? end_ : std::chrono::steady_clock::now()) - start_)
                    .count();
  return r;
}

nlohmann::json ProcTree::spawn_trace(int64_t received_us, int64_t now_us) const {
  // Phase durations in µs, each from the end of the one before: request ->
  // clone (parse, cgroup, limits, pipes), the clone, the child's set-up
  // (clone3 only), its execve until the agent runs again, then the
  // program's life until the agent reaped it, and from there to now (the
  // pipes' eof, the kill of what is left, the outcome).
  const SpawnTrace& s = trace_.spawn;
  auto d = [](int64_t a, int64_t b) { return a > 0 && b >= a ? b - a : 0; };
  json t{{"method", s.method},
         {"prepare", d(received_us, s.clone)},
         {"spawn", d(s.clone, s.back)},
         {"run", d(s.back, trace_.reaped)},
         {"finish", d(trace_.reaped, now_us)}};
  if (s.child > 0) {
    t["clone"] = d(s.clone, s.child);
    t["setup"] = d(s.child, s.exec);
    t["exec"] = d(s.exec, s.back);
  }
  return t;
}

void ProcTree::release() {
  if (timer_fd_ >= 0) server_.unwatch(timer_fd_), close(timer_fd_), timer_fd_ = -1;
  if (cpu_fd_ >= 0) server_.unwatch(cpu_fd_), close(cpu_fd_), cpu_fd_ = -1;
  if (pid_ > 0) server_.forget_child(pid_);
  pid_ = -1;
  // An exec without limits that left nothing behind: its cgroup serves the
  // next one (Server::recycle_cgroup). Its limits are never reset, so a
  // limited exec's cgroup goes.
  if (!cgroup_.empty() && cg_.fd >= 0 && !limits_.pids && !limits_.memory_mb &&
      !(limits_.cpu_seconds > 0) && empty()) {
    server_.recycle_cgroup(std::exchange(cg_, ExecCgroup{}));
    cgroup_.clear();
    return;
  }
  cg_.close_fds();
  if (!cgroup_.empty()) {
    // (This runs once the exec's reply is out: the stream is destroyed
    // after it.) Processes still dying keep the cgroup busy; the server removes it
    // once they are gone.
    if (rmdir(cgroup_.c_str()) != 0 && errno != ENOENT) server_.linger_cgroup(cgroup_);
    cgroup_.clear();
  }
}

}  // namespace airlock::guest

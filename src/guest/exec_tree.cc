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
#include "protocol/messages.h"

extern char** environ;

namespace airlock::guest {
namespace {

using nlohmann::json;
namespace code = protocol::code;

enum Stage : int { kStageCgroup = 1, kStageCwd, kStageUser, kStageExec, kStageIo };

struct ChildError {
  int stage;
  int err;
};

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

User parse_user(const json& req) {
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

ProcTree::ProcTree(Server& server, std::string name) : server_(server), name_(std::move(name)) {}

ProcTree::~ProcTree() {
  kill();
  release();
}

void ProcTree::spawn(const ExecSpec& spec, int in_fd, int out_fd, int err_fd,
                     std::function<void(int status)> on_exit) {
  limits_ = spec.limits;
  cwd_ = spec.cwd;
  if (server_.cgroup_root().empty()) {
    // A development host without a cgroup for us: only CPU time can still
    // be bounded (per process, by RLIMIT_CPU).
    if (limits_.pids || limits_.memory_mb)
      throw Error(Errc::invalid_argument,
                  "limits.pids and limits.memory_mb need cgroup v2, which this agent does not have",
                  limits_.pids ? "limits.pids" : "limits.memory_mb");
  } else {
    cgroup_ = server_.cgroup_root() + "/" + name_;
    if (mkdir(cgroup_.c_str(), 0755) != 0) {
      // A leftover of an earlier connection's stream with the same name.
      cgroup_ += "-" + std::to_string(server_.next_serial());
      if (mkdir(cgroup_.c_str(), 0755) != 0) {
        cgroup_.clear();
        throw_sys("mkdir exec cgroup under " + server_.cgroup_root());
      }
    }
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
    // An OOM kill takes the whole exec, not one random member of it.
    set("memory.oom.group", "1", false);
  }
  const std::string procs = cgroup_.empty() ? "" : cgroup_ + "/cgroup.procs";
  rlimit cpu_rl{RLIM_INFINITY, RLIM_INFINITY};
  if (limits_.cpu_seconds > 0) {
    // Per-process backstop of the cgroup-wide watch below.
    cpu_rl.rlim_cur = static_cast<rlim_t>(std::ceil(limits_.cpu_seconds));
    cpu_rl.rlim_max = cpu_rl.rlim_cur + 1;
  }

  // Everything the child needs is prepared before fork: after it, only
  // async-signal-safe calls.
  std::vector<char*> cargv, cenv;
  for (auto& a : spec.argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (auto& e : spec.env) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  const User& user = spec.user;
  const char* cwd = spec.cwd.c_str();
  const bool pty = spec.pty;

  int status[2];
  if (pipe2(status, O_CLOEXEC) != 0) {
    int e = errno;
    release();
    errno = e;
    throw_sys("pipe");
  }
  start_ = std::chrono::steady_clock::now();
  pid_t pid = fork();
  if (pid < 0) {
    int e = errno;
    close(status[0]);
    close(status[1]);
    release();
    errno = e;
    throw_sys("fork");
  }
  if (pid == 0) {
    auto die = [&](int stage) {
      ChildError ce{stage, errno};
      ssize_t r = write(status[1], &ce, sizeof ce);
      (void)r;
      _exit(127);
    };
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int s = 1; s < NSIG; ++s) signal(s, SIG_DFL);
    // Own session and process group: user code never shares the agent's,
    // and the group is the fallback tree kill.
    setsid();
    if (!procs.empty() && write_str(procs, "0") != 0) die(kStageCgroup);
    // User code is the OOM killer's first choice, never the agent.
    int adj = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (adj >= 0) {
      ssize_t r = write(adj, "0", 1);
      (void)r;
      close(adj);
    }
    int null_in = in_fd < 0 ? open("/dev/null", O_RDONLY) : -1;
    int null_out = out_fd < 0 || err_fd < 0 ? open("/dev/null", O_WRONLY) : -1;
    if (dup2(in_fd < 0 ? null_in : in_fd, 0) < 0 || dup2(out_fd < 0 ? null_out : out_fd, 1) < 0 ||
        dup2(err_fd < 0 ? null_out : err_fd, 2) < 0)
      die(kStageIo);
    // After setsid: the pty slave becomes this session's controlling
    // terminal, so its line discipline turns Ctrl-C/Ctrl-Z into signals to the
    // foreground job and a hangup to the session.
    if (pty && ioctl(0, TIOCSCTTY, 0) != 0) die(kStageIo);
    if (chdir(cwd) != 0) die(kStageCwd);
    if (setgroups(user.groups.size(), user.groups.data()) != 0 && user.uid != 0) die(kStageUser);
    if (setgid(user.gid) != 0 || setuid(user.uid) != 0) die(kStageUser);
    if (cpu_rl.rlim_cur != RLIM_INFINITY) setrlimit(RLIMIT_CPU, &cpu_rl);
    environ = cenv.data();  // execvp searches the new PATH
    execvp(cargv[0], cargv.data());
    die(kStageExec);
  }
  close(status[1]);
  ChildError ce{};
  ssize_t n;
  do n = read(status[0], &ce, sizeof ce);
  while (n < 0 && errno == EINTR);
  close(status[0]);
  if (n == sizeof ce) {
    // The child failed before exec: reap it here and report why.
    waitpid(pid, nullptr, 0);
    release();
    errno = ce.err;
    switch (ce.stage) {
      case kStageCwd:
        throw_sys("cwd " + spec.cwd);
      case kStageUser:
        throw_sys("switching to user " + user.name);
      case kStageCgroup:
        throw_sys("joining the exec's cgroup");
      case kStageExec:
        throw_sys("exec " + spec.argv[0]);
      default:
        throw_sys("setting up stdio");
    }
  }
  pid_ = pgid_ = pid;
  server_.on_child_exit(pid, [this, cb = std::move(on_exit)](int st) {
    exited_ = true;
    status_ = st;
    pid_ = -1;
    end_ = std::chrono::steady_clock::now();
    // Judged now, while whatever filled the disk is still there.
    no_space_ = fs_full("/") || fs_full(cwd_);
    if (timer_fd_ >= 0) server_.unwatch(timer_fd_), close(timer_fd_), timer_fd_ = -1;
    if (cpu_fd_ >= 0) server_.unwatch(cpu_fd_), close(cpu_fd_), cpu_fd_ = -1;
    cb(st);
  });
  auto arm = [&](int& fd, int64_t first_ms, int64_t every_ms, std::function<void()> fn) {
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
  };
  if (spec.timeout_ms > 0) arm(timer_fd_, spec.timeout_ms, 0, [this] { on_timeout(); });
  if (limits_.cpu_seconds > 0 && !cgroup_.empty())
    arm(cpu_fd_, kCpuTickMs, kCpuTickMs, [this] { on_cpu_tick(); });
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

uint64_t ProcTree::cgroup_value(const std::string& file, const std::string& key) const {
  if (cgroup_.empty()) return 0;
  std::ifstream in(cgroup_ + "/" + file);
  std::string k;
  uint64_t v;
  while (in >> k >> v)
    if (k == key) return v;
  return 0;
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
    if (write_str(cgroup_ + "/cgroup.kill", "1") == 0) return;
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
  else if (cgroup_value("memory.events", "oom_kill") > 0)
    reason = "oom_killed";
  else if (cgroup_value("pids.events", "max") > 0 && (failed || timed_out_))
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

void ProcTree::release() {
  if (timer_fd_ >= 0) server_.unwatch(timer_fd_), close(timer_fd_), timer_fd_ = -1;
  if (cpu_fd_ >= 0) server_.unwatch(cpu_fd_), close(cpu_fd_), cpu_fd_ = -1;
  if (pid_ > 0) server_.forget_child(pid_);
  pid_ = -1;
  if (!cgroup_.empty()) {
    // Processes still dying keep the cgroup busy; the server removes it
    // once they are gone.
    if (rmdir(cgroup_.c_str()) != 0 && errno != ENOENT) server_.linger_cgroup(cgroup_);
    cgroup_.clear();
  }
}

}  // namespace airlock::guest

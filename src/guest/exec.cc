// exec (api/guest-protocol.md §5): one child per stream, in its own session
// and cgroup, stdout/stderr streamed under credit, stdin fed from the host.
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <map>

#include "common/error.h"
#include "guest/log.h"
#include "guest/ops.h"
#include "guest/users.h"
#include "protocol/messages.h"

extern char** environ;

namespace airlock::guest {
namespace {

using nlohmann::json;
using protocol::kInitialCredit;
namespace code = protocol::code;

enum Stage : int { kStageCgroup = 1, kStageCwd, kStageUser, kStageExec, kStageIo };

struct ChildError {
  int stage;
  int err;
};

int write_str(const std::string& path, const char* value) {
  int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = write(fd, value, strlen(value));
  close(fd);
  return n < 0 ? -1 : 0;
}

class Exec : public Stream {
 public:
  Exec(Server& server, uint32_t id) : Stream(server, id) {}
  ~Exec() override { release(); }

  void start(const json& req);
  void on_data(uint8_t channel, const std::string& bytes) override;
  void on_eof(uint8_t channel) override;
  void on_credit(uint8_t channel, uint32_t bytes) override;
  void on_signal(int signo) override { signal_tree(signo); }
  void abort() override {
    signal_tree(SIGKILL);
    release();
  }

 private:
  struct Out {
    int fd = -1;
    uint64_t credit = kInitialCredit;
    uint64_t bytes = 0;
    bool watched = false;
  };
  void on_output(uint8_t ch);
  void update_watch(uint8_t ch);
  void write_stdin();
  void on_exit(int status);
  void on_timeout();
  void maybe_finish();
  void signal_tree(int signo);
  void release();
  void close_fd(int& fd) {
    if (fd >= 0) {
      server_.unwatch(fd);
      close(fd);
      fd = -1;
    }
  }

  pid_t pid_ = -1;
  std::string cgroup_;
  Out out_[3];  // index 1 = stdout, 2 = stderr
  int in_fd_ = -1;
  bool in_watched_ = false;
  std::string in_buf_;
  bool in_eof_ = false;
  uint64_t in_window_ = kInitialCredit;
  uint64_t in_bytes_ = 0;
  int timer_fd_ = -1;
  bool exited_ = false, timed_out_ = false, done_ = false;
  int status_ = 0;
  std::chrono::steady_clock::time_point start_;
};

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

std::vector<std::string> build_env(const json& req, const User& u) {
  std::map<std::string, std::string> env = {
      {"PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
      {"HOME", u.home},
      {"USER", u.name},
      {"LOGNAME", u.name},
      {"SHELL", u.shell},
      {"TERM", "dumb"},
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

void set_nonblock(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

void Exec::start(const json& req) {
  const std::vector<std::string> argv = parse_argv(req);
  const User user = parse_user(req);
  const std::vector<std::string> env = build_env(req, user);
  std::string cwd;
  if (auto c = protocol::optional_string(req, "cwd")) {
    cwd = *c;
    if (cwd.empty() || cwd[0] != '/')
      throw Error(Errc::invalid_argument, "cwd must be an absolute path", "cwd");
  } else {
    struct stat st {};
    cwd = stat(user.home.c_str(), &st) == 0 && S_ISDIR(st.st_mode) ? user.home : "/";
  }
  const bool want_stdin = protocol::optional_bool(req, "stdin", false);
  const int64_t timeout_ms = protocol::optional_int(req, "timeout_ms", 0, 0, 365LL * 86400 * 1000);

  if (!server_.cgroup_root().empty()) {
    cgroup_ = server_.cgroup_root() + "/exec-" + std::to_string(id_);
    if (mkdir(cgroup_.c_str(), 0755) != 0) {
      // A leftover of an earlier connection's stream with the same id.
      cgroup_ += "-" + std::to_string(server_.next_serial());
      if (mkdir(cgroup_.c_str(), 0755) != 0) throw_sys("mkdir " + cgroup_);
    }
  }
  const std::string procs = cgroup_.empty() ? "" : cgroup_ + "/cgroup.procs";

  // Everything the child needs is prepared before fork: after it, only
  // async-signal-safe calls.
  std::vector<char*> cargv, cenv;
  for (auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (auto& e : env) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);

  int in[2] = {-1, -1}, out[2], err[2], status[2];
  if (pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC) || pipe2(status, O_CLOEXEC) ||
      (want_stdin && pipe2(in, O_CLOEXEC)))
    throw_sys("pipe");
  start_ = std::chrono::steady_clock::now();
  pid_t pid = fork();
  if (pid < 0) {
    int e = errno;
    for (int fd : {in[0], in[1], out[0], out[1], err[0], err[1], status[0], status[1]})
      if (fd >= 0) close(fd);
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
    setsid();
    if (!procs.empty() && write_str(procs, "0") != 0) die(kStageCgroup);
    int devnull = want_stdin ? -1 : open("/dev/null", O_RDONLY);
    if (dup2(want_stdin ? in[0] : devnull, 0) < 0 || dup2(out[1], 1) < 0 || dup2(err[1], 2) < 0)
      die(kStageIo);
    if (chdir(cwd.c_str()) != 0) die(kStageCwd);
    if (setgroups(user.groups.size(), user.groups.data()) != 0 && user.uid != 0) die(kStageUser);
    if (setgid(user.gid) != 0 || setuid(user.uid) != 0) die(kStageUser);
    environ = cenv.data();  // execvp searches the new PATH
    execvp(cargv[0], cargv.data());
    die(kStageExec);
  }
  pid_ = pid;
  for (int fd : {in[0], out[1], err[1], status[1]})
    if (fd >= 0) close(fd);
  ChildError ce{};
  ssize_t n;
  do n = read(status[0], &ce, sizeof ce);
  while (n < 0 && errno == EINTR);
  close(status[0]);
  if (n == sizeof ce) {
    // The child failed before exec: reap it here and report why.
    waitpid(pid, nullptr, 0);
    pid_ = -1;
    close(out[0]);
    close(err[0]);
    if (in[1] >= 0) close(in[1]);
    if (!cgroup_.empty()) rmdir(cgroup_.c_str());
    errno = ce.err;
    switch (ce.stage) {
      case kStageCwd:
        throw_sys("cwd " + cwd);
      case kStageUser:
        throw_sys("switching to user " + user.name);
      case kStageCgroup:
        throw_sys("joining cgroup " + cgroup_);
      case kStageExec:
        throw_sys("exec " + argv[0]);
      default:
        throw_sys("setting up stdio");
    }
  }
  server_.on_child_exit(pid, [this](int st) { on_exit(st); });
  server_.send_json(protocol::Type::event, id_, {{"started", true}, {"pid", pid}});
  out_[1].fd = out[0];
  out_[2].fd = err[0];
  for (uint8_t ch : {1, 2}) {
    set_nonblock(out_[ch].fd);
    update_watch(ch);
  }
  if (want_stdin) {
    in_fd_ = in[1];
    set_nonblock(in_fd_);
  }
  if (timeout_ms > 0) {
    timer_fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    itimerspec its{};
    its.it_value.tv_sec = timeout_ms / 1000;
    its.it_value.tv_nsec = (timeout_ms % 1000) * 1000000;
    if (timer_fd_ >= 0 && timerfd_settime(timer_fd_, 0, &its, nullptr) == 0)
      server_.watch(timer_fd_, EPOLLIN, [this](uint32_t) { on_timeout(); });
  }
}

// Reads a pipe only while the host has granted credit: with none left the fd
// leaves the epoll set, the pipe fills and the child blocks in write().
void Exec::update_watch(uint8_t ch) {
  Out& o = out_[ch];
  bool want = o.fd >= 0 && o.credit > 0;
  if (want && !o.watched) server_.watch(o.fd, EPOLLIN, [this, ch](uint32_t) { on_output(ch); });
  if (!want && o.watched) server_.unwatch(o.fd);
  o.watched = want;
}

void Exec::on_output(uint8_t ch) {
  Out& o = out_[ch];
  char buf[protocol::kMaxPayload];
  size_t want = std::min<uint64_t>(o.credit, sizeof buf);
  ssize_t n = read(o.fd, buf, want);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n > 0) {
    server_.send_data(id_, ch, buf, n);
    o.credit -= n;
    o.bytes += n;
    update_watch(ch);
    return;
  }
  // EOF (every writer closed) or a read error.
  o.watched = false;
  close_fd(o.fd);
  protocol::Frame eof;
  eof.type = protocol::Type::eof;
  eof.channel = ch;
  eof.stream = id_;
  server_.send(eof);
  maybe_finish();
}

void Exec::on_credit(uint8_t ch, uint32_t bytes) {
  if (ch != 1 && ch != 2) return;
  out_[ch].credit = std::min<uint64_t>(out_[ch].credit + bytes, UINT32_MAX);
  update_watch(ch);
}

void Exec::on_data(uint8_t ch, const std::string& bytes) {
  if (ch != 0 || bytes.size() > in_window_) {
    fail(code::protocol_error, ch != 0 ? "exec takes data only on channel 0 (stdin)"
                                       : "stdin data beyond the granted credit");
    return;
  }
  in_window_ -= bytes.size();
  if (in_fd_ < 0) {
    // No stdin (not requested, or the process closed it): discard, but
    // keep the host's window open.
    in_window_ += bytes.size();
    server_.send_credit(id_, 0, bytes.size());
    return;
  }
  in_buf_ += bytes;
  write_stdin();
}

void Exec::on_eof(uint8_t ch) {
  if (ch != 0) return;
  in_eof_ = true;
  write_stdin();
}

void Exec::write_stdin() {
  while (in_fd_ >= 0 && !in_buf_.empty()) {
    ssize_t n = write(in_fd_, in_buf_.data(), in_buf_.size());
    if (n > 0) {
      in_buf_.erase(0, n);
      in_bytes_ += n;
      in_window_ += n;
      server_.send_credit(id_, 0, n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      if (!in_watched_) server_.watch(in_fd_, EPOLLOUT, [this](uint32_t) { write_stdin(); });
      in_watched_ = true;
      return;
    }
    // EPIPE: the process does not read stdin any more. Drop what is left.
    in_window_ += in_buf_.size();
    server_.send_credit(id_, 0, in_buf_.size());
    in_buf_.clear();
    close_fd(in_fd_);
  }
  if (in_watched_ && in_fd_ >= 0) server_.unwatch(in_fd_);
  in_watched_ = false;
  if (in_eof_ && in_buf_.empty()) close_fd(in_fd_);
}

void Exec::on_exit(int status) {
  exited_ = true;
  status_ = status;
  pid_ = -1;
  maybe_finish();
}

void Exec::on_timeout() {
  timed_out_ = true;
  close_fd(timer_fd_);
  signal_tree(SIGKILL);
}

void Exec::signal_tree(int signo) {
  if (!cgroup_.empty()) {
    if (signo == SIGKILL && write_str(cgroup_ + "/cgroup.kill", "1") == 0) return;
    std::ifstream procs(cgroup_ + "/cgroup.procs");
    pid_t p;
    while (procs >> p) kill(p, signo);
  } else if (pid_ > 0) {
    // No cgroup (development host): the session's process group is the best
    // we have; processes that setsid() away escape it.
    kill(-pid_, signo);
    kill(pid_, signo);
  }
}

void Exec::maybe_finish() {
  if (done_ || !exited_ || out_[1].fd >= 0 || out_[2].fd >= 0) return;
  done_ = true;
  json r;
  if (WIFEXITED(status_)) {
    r["exit_code"] = WEXITSTATUS(status_);
    r["signal"] = nullptr;
  } else {
    r["exit_code"] = nullptr;
    r["signal"] = WIFSIGNALED(status_) ? WTERMSIG(status_) : 0;
  }
  r["timed_out"] = timed_out_;
  r["duration_ms"] = std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::steady_clock::now() - start_)
                         .count();
  r["stdout_bytes"] = out_[1].bytes;
  r["stderr_bytes"] = out_[2].bytes;
  r["stdin_bytes"] = in_bytes_;
  release();
  server_.finish(id_, r);
}

void Exec::release() {
  for (uint8_t ch : {1, 2}) {
    out_[ch].watched = false;
    close_fd(out_[ch].fd);
  }
  in_watched_ = false;
  close_fd(in_fd_);
  close_fd(timer_fd_);
  if (pid_ > 0) server_.forget_child(pid_);
  pid_ = -1;
  if (!cgroup_.empty()) {
    // Background processes the exec left behind keep the cgroup busy; the
    // server removes it once they are gone.
    if (rmdir(cgroup_.c_str()) != 0 && errno != ENOENT) server_.linger_cgroup(cgroup_);
    cgroup_.clear();
  }
}

}  // namespace

std::unique_ptr<Stream> start_exec(Server& server, uint32_t id, const json& req) {
  auto e = std::make_unique<Exec>(server, id);
  e->start(req);
  return e;
}

}  // namespace airlock::guest

#include "common/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "common/error.h"
#include "common/unique_fd.h"

extern char** environ;

namespace airlock {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kMaxLine = 64 * 1024;

using Fd = UniqueFd;

void make_pipe(Fd& r, Fd& w) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) throw_errno("pipe2");
  r.fd = p[0];
  w.fd = p[1];
}

// One output stream of the child: capture (bounded) and split into lines.
struct Sink {
  OutputStream which;
  std::string* captured;
  bool* truncated;
  std::size_t max;
  const SubprocessOptions* opts;
  std::string partial;  // an incomplete line waiting for its '\n'

  void feed(const char* data, std::size_t n) {
    std::size_t room = captured->size() < max ? max - captured->size() : 0;
    captured->append(data, std::min(room, n));
    if (n > room) *truncated = true;
    if (!opts->on_line) return;
    std::string_view chunk(data, n);
    while (!chunk.empty()) {
      auto nl = chunk.find('\n');
      if (nl == std::string_view::npos) {
        partial.append(chunk);
        if (partial.size() >= kMaxLine) flush();
        return;
      }
      partial.append(chunk.substr(0, nl));
      chunk.remove_prefix(nl + 1);
      opts->on_line(which, partial);
      partial.clear();
    }
  }
  void flush() {
    if (opts->on_line && !partial.empty()) opts->on_line(which, partial);
    partial.clear();
  }
};

std::vector<std::string> build_env(const SubprocessOptions& o) {
  std::set<std::string> overridden;
  for (const auto& [k, v] : o.env) overridden.insert(k);
  std::vector<std::string> env;
  if (!o.clear_env) {
    for (char** e = environ; e && *e; ++e) {
      std::string_view kv(*e);
      auto eq = kv.find('=');
      if (eq != std::string_view::npos && overridden.count(std::string(kv.substr(0, eq)))) continue;
      env.emplace_back(kv);
    }
  }
  for (const auto& [k, v] : o.env) env.push_back(k + "=" + v);
  return env;
}

// Kills the child's whole process group and reaps the child.
void kill_and_reap(pid_t pid, int* status) {
  ::kill(-pid, SIGKILL);
  ::kill(pid, SIGKILL);
  while (::waitpid(pid, status, 0) < 0 && errno == EINTR) {
  }
}

std::string tail_lines(const std::string& text, int lines) {
  std::size_t end = text.find_last_not_of(" \n");
  if (end == std::string::npos) return {};
  ++end;
  std::size_t pos = end;
  for (int i = 0; i < lines; ++i) {
    auto nl = pos == 0 ? std::string::npos : text.rfind('\n', pos - 1);
    if (nl == std::string::npos) return text.substr(0, end);
    pos = nl;
  }
  return text.substr(pos + 1, end - pos - 1);
}

}  // namespace

std::string quote_command(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) {
    if (!s.empty()) s += ' ';
    bool plain = !a.empty() && a.find_first_of(" \t\n'\"\\$`*?;&|<>()") == std::string::npos;
    if (plain) {
      s += a;
      continue;
    }
    s += '\'';
    for (char c : a) s += c == '\'' ? std::string("'\\''") : std::string(1, c);
    s += '\'';
  }
  return s;
}

std::string SubprocessResult::describe() const {
  std::string what = "`" + command + "`";
  if (timed_out) {
    what += " timed out after " + std::to_string(duration.count()) + " ms";
  } else if (term_signal != 0) {
    what += " was killed by signal " + std::to_string(term_signal) + " (" +
            ::strsignal(term_signal) + ")";
  } else if (exit_code == 0) {
    what += " succeeded";
  } else {
    what += " exited with status " + std::to_string(exit_code);
  }
  const std::string& text = err.find_first_not_of(" \n") != std::string::npos ? err : out;
  std::string t = tail_lines(text, 20);
  if (!t.empty()) what += ": " + t;
  return what;
}

namespace {

// posix_spawnp searches the PATH of the *calling* process; honour a PATH
// override from options.env by searching it ourselves.
std::string resolve_program(const std::string& argv0, const SubprocessOptions& options) {
  std::string program = argv0;
  for (const auto& [k, v] : options.env) {
    if (k != "PATH" || program.find('/') != std::string::npos) continue;
    std::string_view dirs(v);
    while (true) {
      auto colon = dirs.find(':');
      std::string cand = std::string(dirs.substr(0, colon)) + "/" + argv0;
      if (::access(cand.c_str(), X_OK) == 0) {
        program = cand;
        break;
      }
      if (colon == std::string_view::npos) break;
      dirs.remove_prefix(colon + 1);
    }
  }
  return program;
}

// Starts the child on the given pipe ends (in_fd < 0: /dev/null) and sets
// `start` just before it runs. Throws naming `command` if it cannot start.
pid_t spawn_child(const std::vector<std::string>& argv, const SubprocessOptions& options, int in_fd,
                  int out_fd, int err_fd, const std::string& command, Clock::time_point& start) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  struct Cleanup {
    posix_spawn_file_actions_t* fa;
    posix_spawnattr_t* attr;
    ~Cleanup() {
      posix_spawn_file_actions_destroy(fa);
      posix_spawnattr_destroy(attr);
    }
  } cleanup{&fa, &attr};

  if (in_fd >= 0)
    posix_spawn_file_actions_adddup2(&fa, in_fd, 0);
  else
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
  posix_spawn_file_actions_adddup2(&fa, err_fd, 2);
  if (!options.cwd.empty()) posix_spawn_file_actions_addchdir_np(&fa, options.cwd.c_str());

  // Own process group (so a timeout kills grandchildren too); default signal
  // dispositions and an empty mask, whatever the calling daemon changed
  // (an ignored SIGPIPE would otherwise be inherited across exec).
  sigset_t all, none;
  sigfillset(&all);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);

  std::vector<std::string> env = build_env(options);
  std::vector<char*> envp, args;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& a : argv_copy) args.push_back(a.data());
  args.push_back(nullptr);
  std::string program = resolve_program(argv[0], options);

  start = Clock::now();
  pid_t pid = -1;
  int rc = ::posix_spawnp(&pid, program.c_str(), &fa, &attr, args.data(), envp.data());
  if (rc != 0) {
    throw Error(rc == ENOENT || rc == EACCES ? Errc::not_found : Errc::internal,
                "cannot run `" + command + "`: " + std::strerror(rc));
  }
  return pid;
}

// How long one poll may sleep: until the deadline or the next tick, at most
// a minute; -1 when there is neither.
int poll_timeout_ms(Clock::time_point now, Clock::time_point wait_until) {
  if (wait_until == Clock::time_point::max()) return -1;
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(wait_until - now).count();
  return static_cast<int>(std::clamp<long long>(ms, 0, 60'000));
}

// The parent's side of a running child: its pipes and pidfd, polled until it
// exits (or the deadline), capturing output and feeding input. `exited` and
// `status` say what is known when run() returns or throws.
struct Pump {
  const SubprocessOptions& options;
  SubprocessResult& result;
  pid_t pid;
  Fd& out_r;
  Fd& err_r;
  Fd& in_w;
  Fd& pidfd;
  Sink& out_sink;
  Sink& err_sink;
  bool exited = false;
  int status = 0;
  std::size_t input_off = 0;
  char buf[65536];

  void run(Clock::time_point start) {
    const bool has_deadline = options.timeout.count() > 0;
    const auto deadline = start + options.timeout;
    auto next_tick = start + options.tick_interval;
    while (true) {
      auto now = Clock::now();
      if (has_deadline && now >= deadline) {
        result.timed_out = true;
        kill_and_reap(pid, &status);
        exited = true;
        break;
      }
      if (options.on_tick && now >= next_tick) {
        options.on_tick();
        next_tick = now + options.tick_interval;
      }
      if (out_r.fd < 0 && err_r.fd < 0 && (exited || pidfd.fd < 0)) break;

      pollfd pfds[4];
      int n = 0;
      int i_out = -1, i_err = -1, i_in = -1, i_pid = -1;
      if (out_r.fd >= 0) pfds[i_out = n++] = {out_r.fd, POLLIN, 0};
      if (err_r.fd >= 0) pfds[i_err = n++] = {err_r.fd, POLLIN, 0};
      if (in_w.fd >= 0) pfds[i_in = n++] = {in_w.fd, POLLOUT, 0};
      if (pidfd.fd >= 0 && !exited) pfds[i_pid = n++] = {pidfd.fd, POLLIN, 0};

      auto wait_until = Clock::time_point::max();
      if (has_deadline) wait_until = deadline;
      if (options.on_tick) wait_until = std::min(wait_until, next_tick);
      int timeout_ms = poll_timeout_ms(now, wait_until);
      if (n == 0) {
        // No pidfd (old kernel) and pipes closed: just wait for the child.
        break;
      }
      int pr = ::poll(pfds, n, timeout_ms);
      if (pr < 0) {
        if (errno == EINTR) continue;
        throw_errno("poll");
      }
      if (i_out >= 0) drain(pfds[i_out], out_r, out_sink);
      if (i_err >= 0) drain(pfds[i_err], err_r, err_sink);
      if (i_in >= 0 && (pfds[i_in].revents & (POLLOUT | POLLERR | POLLHUP))) write_input();
      if (i_pid >= 0 && (pfds[i_pid].revents & POLLIN)) reap_and_take_buffered();
    }
  }

  // Reads what poll says is ready; closes the pipe at its end or on an error.
  void drain(const pollfd& p, Fd& fd, Sink& sink) {
    if (!(p.revents & (POLLIN | POLLHUP | POLLERR))) return;
    ssize_t r = ::read(fd.fd, buf, sizeof buf);
    if (r > 0) {
      sink.feed(buf, static_cast<std::size_t>(r));
    } else if (r == 0 || (errno != EINTR && errno != EAGAIN)) {
      sink.flush();
      fd.reset();
    }
  }

  void write_input() {
    ssize_t w =
        ::write(in_w.fd, options.input.data() + input_off, options.input.size() - input_off);
    if (w > 0) input_off += static_cast<std::size_t>(w);
    if ((w < 0 && errno != EAGAIN && errno != EINTR) || input_off >= options.input.size())
      in_w.reset();  // done, or the child closed its stdin (EPIPE)
  }

  // The child itself exited: reap it, take what is already buffered, but do
  // not wait for grandchildren that inherited the pipes.
  void reap_and_take_buffered() {
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    exited = true;
    for (Fd* fd : {&out_r, &err_r}) {
      if (fd->fd < 0) continue;
      ::fcntl(fd->fd, F_SETFL, O_NONBLOCK);
      Sink& sink = fd == &out_r ? out_sink : err_sink;
      ssize_t r;
      while ((r = ::read(fd->fd, buf, sizeof buf)) > 0) sink.feed(buf, static_cast<std::size_t>(r));
      sink.flush();
      fd->reset();
    }
  }
};

}  // namespace

SubprocessResult run_command(const std::vector<std::string>& argv,
                             const SubprocessOptions& options) {
  if (argv.empty() || argv[0].empty())
    throw Error(Errc::invalid_argument, "run_command: empty argv", "argv");

  SubprocessResult result;
  result.command = quote_command(argv);

  Fd out_r, out_w, err_r, err_w, in_r, in_w;
  make_pipe(out_r, out_w);
  make_pipe(err_r, err_w);
  if (!options.input.empty()) make_pipe(in_r, in_w);

  Clock::time_point start;
  pid_t pid = spawn_child(argv, options, in_r.fd, out_w.fd, err_w.fd, result.command, start);
  out_w.reset();
  err_w.reset();
  in_r.reset();

  // A pidfd tells us when the child itself exits, even if a grandchild keeps
  // the output pipes open.
  Fd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));

  Sink out_sink{OutputStream::out,  &result.out, &result.out_truncated,
                options.max_output, &options,    {}};
  Sink err_sink{OutputStream::err,  &result.err, &result.err_truncated,
                options.max_output, &options,    {}};
  if (in_w.fd >= 0) ::fcntl(in_w.fd, F_SETFL, O_NONBLOCK);

  Pump pump{options, result, pid, out_r, err_r, in_w, pidfd, out_sink, err_sink};
  try {
    pump.run(start);
  } catch (...) {
    if (!pump.exited) kill_and_reap(pid, &pump.status);
    throw;
  }
  if (!pump.exited) {
    while (::waitpid(pid, &pump.status, 0) < 0 && errno == EINTR) {
    }
  }
  out_sink.flush();
  err_sink.flush();
  result.duration = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  if (!result.timed_out) {
    if (WIFEXITED(pump.status)) result.exit_code = WEXITSTATUS(pump.status);
    if (WIFSIGNALED(pump.status)) result.term_signal = WTERMSIG(pump.status);
  }
  return result;
}

SubprocessResult run_checked(const std::vector<std::string>& argv,
                             const SubprocessOptions& options) {
  SubprocessResult r = run_command(argv, options);
  if (r.timed_out) throw Error(Errc::timeout, r.describe());
  if (!r.ok()) throw Error(Errc::internal, r.describe());
  return r;
}

}  // namespace airlock

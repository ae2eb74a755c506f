#include "engine/confine/confine.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <functional>

#include "common/error.h"
#include "engine/confine/acl.h"
#include "engine/vmm/jail_ids.h"

namespace airlock::engine::confine {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;

std::string fd_name(int n) { return "/proc/self/fd/" + std::to_string(n); }

// Reads both pipes until they close or the deadline passes.
void drain(int out, int err, Result& r, size_t max_out, Clock::time_point deadline) {
  constexpr size_t kMaxErr = 64 * 1024;
  pollfd p[2] = {{out, POLLIN, 0}, {err, POLLIN, 0}};
  char buf[65536];
  while (p[0].fd >= 0 || p[1].fd >= 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      r.timed_out = true;
      return;
    }
    int n = ::poll(p, 2, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno("poll the confined helper");
    for (int i = 0; i < 2; ++i) {
      if (p[i].fd < 0 || !(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t got = ::read(p[i].fd, buf, sizeof buf);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        p[i].fd = -1;
        continue;
      }
      std::string& dst = i == 0 ? r.out : r.err;
      size_t cap = i == 0 ? max_out : kMaxErr;
      size_t room = dst.size() < cap ? cap - dst.size() : 0;
      dst.append(buf, std::min(room, static_cast<size_t>(got)));
      if (static_cast<size_t>(got) > room && i == 0) {
        r.out_truncated = true;  // a result over its bound is a failure, not a prefix
        return;
      }
    }
  }
}

}  // namespace

std::string Result::describe() const {
  std::string tail = err.size() > 2000 ? err.substr(err.size() - 2000) : err;
  while (!tail.empty() && (tail.back() == '\n' || tail.back() == ' ')) tail.pop_back();
  std::string s = what;
  if (timed_out)
    s += " was killed at its deadline";
  else if (out_truncated)
    s += " sent more output than its bound and was killed";
  else if (term_signal)
    s += " was killed by signal " + std::to_string(term_signal) +
         " (over its memory or CPU limit, or crashed)";
  else
    s += " exited with status " + std::to_string(exit_code);
  if (!tail.empty()) s += ": " + tail;
  return s;
}

const Result& Result::check() const {
  if (!ok()) throw Error(timed_out ? Errc::timeout : Errc::unavailable, describe());
  return *this;
}

fs::path helper_binary() {
  if (const char* env = std::getenv("AIRLOCK_CONFINE"); env && *env) return env;
  std::error_code ec;
  fs::path exe_dir = fs::read_symlink("/proc/self/exe", ec).parent_path();
  for (const fs::path& cand :
       {exe_dir / "airlock-confine", exe_dir / ".." / "bin" / "airlock-confine"})
    if (::access(cand.c_str(), X_OK) == 0) return cand.lexically_normal();
  throw Error(Errc::unavailable, "the confinement helper airlock-confine was not found beside " +
                                     exe_dir.string() + " (set AIRLOCK_CONFINE)");
}

Result run(const Spec& spec) {
  nlohmann::json j{{"mode", spec.mode},
                   {"what", spec.what},
                   {"argv", spec.argv},
                   {"args", spec.args},
                   {"fds", spec.fds.size()},
                   {"uid", spec.uid},
                   {"gid", spec.gid},
                   {"limits",
                    {{"memory_bytes", spec.limits.memory_bytes},
                     {"cpu_seconds", spec.limits.cpu_seconds},
                     {"file_bytes", spec.limits.file_bytes},
                     {"open_files", spec.limits.open_files},
                     {"processes", spec.limits.processes}}}};
  std::string exe = helper_binary().string();
  std::string arg = j.dump();
  // Everything the child needs exists before fork: between fork and execve
  // a child of a multi-threaded process may only make async-signal-safe calls.
  char* argv[] = {exe.data(), arg.data(), nullptr};
  char path_env[] = "PATH=/usr/sbin:/usr/bin:/sbin:/bin";
  char lang_env[] = "LC_ALL=C";
  char* envp[] = {path_env, lang_env, nullptr};
  std::vector<int> given = spec.fds;
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) throw_errno("pipe");
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(out[0]);
    ::close(out[1]);
    throw_errno("pipe");
  }
  UniqueFd out_r(out[0]), out_w(out[1]), err_r(err[0]), err_w(err[1]);
  UniqueFd devnull(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (devnull.fd < 0) throw_errno("open /dev/null");
  // The given fds are first moved above every target number, so dup2 onto
  // 3.. never overwrites one still to be placed.
  int high = 3 + static_cast<int>(given.size()) + 16;
  std::vector<UniqueFd> moved;
  for (int fd : given) {
    int d = ::fcntl(fd, F_DUPFD_CLOEXEC, high);
    if (d < 0) throw_errno("dup a descriptor for " + spec.what);
    moved.emplace_back(d);
  }
  pid_t pid = ::fork();
  if (pid < 0) throw_errno("fork for " + spec.what);
  if (pid == 0) {
    ::setpgid(0, 0);
    ::dup2(devnull.fd, 0);
    ::dup2(out_w.fd, 1);
    ::dup2(err_w.fd, 2);
    for (size_t i = 0; i < moved.size(); ++i) ::dup2(moved[i].fd, 3 + static_cast<int>(i));
    ::close_range(3 + static_cast<unsigned>(moved.size()), ~0U, 0);
    ::execve(argv[0], argv, envp);
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here: no window where a kill of the group misses it
  out_w.reset();
  err_w.reset();
  Result r;
  r.what = spec.what;
  auto deadline = Clock::now() + spec.limits.timeout;
  try {
    drain(out_r.fd, err_r.fd, r, spec.limits.max_output, deadline);
  } catch (...) {
    ::kill(-pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    throw;
  }
  // The tool closing its pipes is not its end (atexit handlers still run):
  // it gets until the deadline to exit. Then, its pid held as a zombie (so
  // the group id cannot be reused), the whole group goes: a tool's
  // children die with it, also on success.
  siginfo_t info{};
  while (!r.timed_out && !r.out_truncated) {  // over its bound: no need to wait
    info.si_pid = 0;
    if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
        info.si_pid == pid)
      break;
    if (Clock::now() >= deadline)
      r.timed_out = true;
    else
      ::usleep(2000);
  }
  ::kill(-pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.term_signal = WTERMSIG(status);
  if (r.timed_out || r.out_truncated) r.exit_code = -1;
  if (r.exit_code == 127 && r.err.empty()) r.err = "cannot execute " + exe;
  return r;
}

Scratch::Scratch(const fs::path& parent) {
  std::string tmpl = (parent / "confine-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) throw_errno("mkdtemp in " + parent.string());
  dir_ = fs::absolute(tmpl).lexically_normal();
  if (::geteuid() != 0) return;  // no other uid to become: the caller's own
  try {
    uid_ = vmm::jail_ids().base + vmm::lease_jail_uid(dir_);
    if (::chown(dir_.c_str(), static_cast<uid_t>(uid_), static_cast<gid_t>(uid_)) != 0)
      throw_errno("chown " + dir_.string());
  } catch (...) {
    std::error_code ec;
    if (uid_ >= 0) vmm::release_jail_leases(dir_);
    fs::remove_all(dir_, ec);
    throw;
  }
}

Scratch::~Scratch() {
  for (auto& g : grants_) revoke_user(g.fd.fd, static_cast<uint32_t>(uid_));
  std::error_code ec;
  if (uid_ >= 0) reclaim();
  fs::remove_all(dir_, ec);
  if (uid_ >= 0) vmm::release_jail_leases(dir_);
}

std::string Scratch::give(const fs::path& file, bool writable) {
  UniqueFd fd(::open(file.c_str(), (writable ? O_RDWR : O_RDONLY) | O_NOFOLLOW | O_CLOEXEC));
  if (fd.fd < 0) throw_errno("open " + file.string() + " for a confined tool");
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) throw_errno("stat " + file.string());
  if (!S_ISREG(st.st_mode))
    throw Error(Errc::invalid_argument, file.string() + " is not a regular file");
  bool granted = false;
  for (const auto& g : grants_) granted |= g.dev == st.st_dev && g.ino == st.st_ino;
  bool usable = granted || uid_ < 0 || st.st_uid == static_cast<uid_t>(uid_) ||
                (!writable && (st.st_mode & 0004));
  if (!usable) {
    UniqueFd keep(::fcntl(fd.fd, F_DUPFD_CLOEXEC, 3));
    if (keep.fd < 0) throw_errno("dup " + file.string());
    grant_user(keep.fd, static_cast<uint32_t>(uid_), writable ? 6 : 4, file.c_str());
    grants_.push_back({std::move(keep), st.st_dev, st.st_ino});
  }
  fds_.push_back(std::move(fd));
  return fd_name(2 + static_cast<int>(fds_.size()));
}

std::string Scratch::give_image_opts(const std::string& spec) {
  if (spec.rfind("json:", 0) != 0)
    throw Error(Errc::internal, "not a json: image spec: " + spec.substr(0, 40));
  auto j = nlohmann::json::parse(spec.substr(5));
  std::function<void(nlohmann::json&)> rename = [&](nlohmann::json& n) {
    if (!n.is_object()) return;
    if (n.value("driver", "") == "file" && n.contains("filename"))
      n["filename"] = give(n["filename"].get<std::string>());
    for (auto& [k, v] : n.items()) rename(v);
  };
  rename(j);
  return "json:" + j.dump();
}

void Scratch::forget() { fds_.clear(); }

std::string Scratch::give_fd(int fd) {
  UniqueFd d(::fcntl(fd, F_DUPFD_CLOEXEC, 3));
  if (d.fd < 0) throw_errno("dup a descriptor for a confined tool");
  fds_.push_back(std::move(d));
  return fd_name(2 + static_cast<int>(fds_.size()));
}

std::string Scratch::give_dir() {
  UniqueFd d(::open(dir_.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (d.fd < 0) throw_errno("open " + dir_.string());
  fds_.push_back(std::move(d));
  return fd_name(2 + static_cast<int>(fds_.size()));
}

Spec Scratch::exec(std::vector<std::string> argv, std::string what, Limits limits) const {
  Spec s;
  s.mode = "exec";
  s.what = std::move(what);
  s.argv = std::move(argv);
  s.limits = limits;
  for (const auto& f : fds_) s.fds.push_back(f.fd);
  s.uid = s.gid = uid_;
  return s;
}

void Scratch::reclaim() {
  if (uid_ < 0) return;
  ::lchown(dir_.c_str(), 0, 0);
  ::chmod(dir_.c_str(), 0700);
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) ::lchown(e.path().c_str(), 0, 0);
}

}  // namespace airlock::engine::confine

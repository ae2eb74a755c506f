#include "cli/exec_cmd.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <optional>

#include "cli/attach.h"
#include "cli/stdin_pump.h"
#include "common/error.h"
#include "daemon/base64.h"

namespace airlock::cli {

using nlohmann::json;

namespace {

void write_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno(fd == 1 ? "writing stdout" : "writing stderr");
    bytes.remove_prefix(size_t(n));
  }
}

std::string read_all_fd(int fd) {
  std::string out;
  char buf[65536];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno("reading stdin");
    if (n == 0) return out;
    out.append(buf, size_t(n));
  }
}

}  // namespace

// Runs an exec, writing its stdout/stderr as raw bytes as they arrive.
int run_exec(const client::Client& c, const std::string& id, const ExecOptions& opts,
             const std::vector<std::string>& argv, bool interactive) {
  std::optional<std::string> in;
  // A closed stdin (e.g. a CI runner without one) means no input, not an error.
  bool stdin_open = ::fcntl(0, F_GETFD) != -1;
  bool forward = stdin_open && (interactive || !::isatty(0));
  // Pipes, sockets, terminals (-i) and big files are streamed as they are
  // read (a line typed into `sh` over a pipe is answered at once; 2 GiB go
  // through in bounded memory). A small file or /dev/null goes inline.
  struct stat st {};
  bool small =
      forward && ::fstat(0, &st) == 0 &&
      ((S_ISREG(st.st_mode) && st.st_size <= (1 << 20)) || (S_ISCHR(st.st_mode) && !::isatty(0)));
  if (forward && small) in = read_all_fd(0);
  json body = exec_body(opts, argv, in);
  std::unique_ptr<StdinPump> pump;
  if (forward && !small) {
    body["stdin_stream"] = true;
    pump = std::make_unique<StdinPump>(c.socket(), id, 0, reattach_patience());
  }
  // Whatever ends the exec (exit, error, lost connection) ends the pump.
  struct PumpStop {
    std::unique_ptr<StdinPump>& p;
    ~PumpStop() {
      if (p) p->stop();
    }
  } pump_stop{pump};
  // Counted as printed: if the connection to airlockd breaks mid-exec (the
  // daemon was restarted), the rest is fetched from exactly this offset.
  AttachState resume{id, "", 0, 0};
  json exit;
  try {
    exit = c.exec(id, body, [&](const json& ev) {
      std::string type = ev.value("type", "");
      if (type == "start") {
        resume.exec_id = ev.value("exec_id", "");
        if (pump) pump->start(resume.exec_id);
      }
      if (type != "stdout" && type != "stderr") return;
      auto bytes = daemon::base64_decode(ev.value("data", ""));
      if (!bytes) throw Error(Errc::internal, "airlockd sent invalid base64 output");
      write_all(type == "stdout" ? 1 : 2, *bytes);
      resume.offset += bytes->size();
    });
  } catch (const client::ConnectionLost&) {
    auto patience = reattach_patience();
    if (resume.exec_id.empty() || patience.count() == 0) throw;
    // The pump resumes on its own (the guest keeps a detached exec's stdin).
    exit = reattach(c, resume, write_all, patience);
  }
  if (exit.value("timed_out", false))
    std::fprintf(stderr, "airlock: command timed out after %.3g s\n",
                 exit.value("duration_ms", 0) / 1000.0);
  std::string reason = exit.value("reason", "");
  if (reason == "pids_limit" || reason == "oom_killed" || reason == "cpu_limit" ||
      reason == "no_space" || reason == "killed")
    std::fprintf(stderr, "airlock: command ended: %s\n", reason.c_str());
  if (exit.value("truncated", false))
    std::fprintf(stderr, "airlock: output truncated (%llu stdout + %llu stderr bytes dropped)\n",
                 static_cast<unsigned long long>(exit.value("stdout_dropped", uint64_t{0})),
                 static_cast<unsigned long long>(exit.value("stderr_dropped", uint64_t{0})));
  return exit_code_of(exit);
}

int run_attach(const client::Client& c, const std::string& id, const std::string& exec_id,
               uint64_t offset) {
  AttachState st{id, exec_id, offset, 0};
  json exit = reattach(c, st, write_all, reattach_patience());
  return exit_code_of(exit);
}

}  // namespace airlock::cli

// Running a host command: argv (never a shell), a deadline, bounded output.
//
// One helper for every tool airlock drives (qemu-img, apt-get, mkfs.ext4,
// image recipes, ...). The child gets its own process group so a timeout
// kills everything it started, stdin is /dev/null unless `input` is given,
// and output is either captured (up to `max_output` bytes per stream; the
// rest is counted but dropped, so a chatty tool cannot grow our memory) or
// streamed line by line to a callback, or both.
//
//   auto r = run_command({"qemu-img", "info", path}, {.timeout = 10s});
//   if (!r.ok()) throw Error(Errc::internal, r.describe());
//
//   // Or let it throw Error(internal) naming the command and its stderr:
//   std::string out = run_checked({"apt-cache", "policy", pkg}).out;
//
// Errors name the command: describe() gives e.g.
//   "`qemu-img create ...` exited with status 1: <last stderr lines>".
#pragma once

#include <chrono>
#include <cstddef>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace airlock {

enum class OutputStream { out, err };

struct SubprocessOptions {
  // Kill the process group (SIGKILL) once this passes; zero = no deadline.
  std::chrono::milliseconds timeout{0};
  // Working directory of the child; empty = inherit.
  std::filesystem::path cwd;
  // Variables set (or overridden) on top of the inherited environment,
  // or of an empty one when clear_env is true.
  std::vector<std::pair<std::string, std::string>> env;
  bool clear_env = false;
  // Written to the child's stdin (then closed); empty = /dev/null.
  std::string input;
  // Bytes kept per stream in SubprocessResult::out / err (the first ones).
  std::size_t max_output = 1 << 20;
  // Called for each complete line (without the '\n'; a final unterminated
  // line is delivered too; lines longer than 64 KiB arrive in pieces).
  // Captured output is still kept as well.
  std::function<void(OutputStream, std::string_view line)> on_line;
  // Called about every tick_interval while the child runs (e.g. to poll a
  // progress measure). Exceptions thrown here kill the child and propagate.
  std::function<void()> on_tick;
  std::chrono::milliseconds tick_interval{500};
};

struct SubprocessResult {
  std::string command;     // the argv, quoted for messages
  int exit_code = -1;      // exit status if the child exited, else -1
  int term_signal = 0;     // the signal that ended it, else 0
  bool timed_out = false;  // we killed it because the deadline passed
  std::string out, err;    // captured output (bounded by max_output)
  bool out_truncated = false, err_truncated = false;
  std::chrono::milliseconds duration{0};

  bool ok() const { return exit_code == 0 && !timed_out; }
  // "`cmd` exited with status 3: <tail of stderr (or stdout)>" and the like.
  std::string describe() const;
};

// Runs argv[0] (looked up in PATH) with the given options and waits for it.
// Throws Error(invalid_argument, field "argv") for an empty argv and
// Error(not_found) naming the program if it cannot be started; otherwise
// returns the outcome, whatever the exit status.
SubprocessResult run_command(const std::vector<std::string>& argv,
                             const SubprocessOptions& options = {});

// run_command that throws Error(internal, result.describe()) unless ok()
// (Error(timeout, ...) if the deadline passed).
SubprocessResult run_checked(const std::vector<std::string>& argv,
                             const SubprocessOptions& options = {});

// The argv as one shell-like string for messages: words with spaces or
// quotes are single-quoted.
std::string quote_command(const std::vector<std::string>& argv);

}  // namespace airlock

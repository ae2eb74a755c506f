// `airlock shell ID` and `airlock exec --tty ID -- ARGV`: a terminal in the
// sandbox over airlockd's WebSocket route GET /v1/sandboxes/{id}/pty
// (Boost.Beast over the unix socket). The local terminal is put in raw mode
// (restored on every way out: exit, error, SIGTERM/SIGHUP, daemon gone), so
// Ctrl-C, Ctrl-D, Ctrl-Z are plain bytes for the guest's pty; the window
// size is sent at the start and on every SIGWINCH.
#pragma once

#include <termios.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace airlock::cli {

// Puts `fd` (a terminal) in raw mode and restores its settings, and its file
// status flags (the event loop makes it non-blocking), when destroyed. Does
// nothing for a non-terminal.
class RawTerminal {
 public:
  explicit RawTerminal(int fd);
  ~RawTerminal();
  RawTerminal(const RawTerminal&) = delete;
  RawTerminal& operator=(const RawTerminal&) = delete;
  bool active() const { return saved_.has_value(); }

 private:
  int fd_;
  std::optional<termios> saved_;
  int flags_ = -1;
};

struct PtyOptions {
  std::vector<std::string> argv;  // empty: the user's login shell
  std::vector<std::string> env;   // raw "K=V"
  std::string cwd, user;
};

// The first text frame: {"argv"?, "cols", "rows", "env"?, "cwd"?, "user"?};
// TERM from the environment unless `opts.env` names one.
nlohmann::json pty_start_message(const PtyOptions& opts, int cols, int rows, const char* term_env);

// Runs the session on stdin/stdout until the command ends. Returns the CLI's
// exit status (the command's exit code, 128+signal, ...). Throws Error for
// errors before or from the session (no such sandbox, bad argument),
// ConnectionLost if the daemon went away mid-session.
int run_pty(const std::filesystem::path& socket, const std::string& id, const PtyOptions& opts);

}  // namespace airlock::cli

// A small process that outlives `airlock mcp` to keep its promise that the
// session's sandboxes do not survive it, even when it cannot clean up itself
// (SIGKILL, which MCP clients send when a server is slow to exit, or a
// crash). The server tells it over a pipe which sandboxes it owns; when the
// pipe closes (the server exited, however) the guardian destroys whatever is
// still listed, and every live sandbox labelled with the session's tag (a
// create still booting when the server died: the guardian waits for it to
// finish, up to two minutes), and exits. It ignores the terminal's and the client's
// signals (SIGINT, SIGTERM, SIGHUP) so a kill of the process group does not
// stop the clean-up.
//
//   std::string tag = new_session_tag();
//   Guardian g = Guardian::start(socket, tag);   // before any thread exists
//   session.set_observer([&](auto& id, bool owned) { g.note(id, owned); });
#pragma once

#include <filesystem>
#include <mutex>
#include <string>

namespace airlock::mcp {

class Guardian {
 public:
  // Forks the guardian process (single-threaded callers only: fork).
  static Guardian start(const std::filesystem::path& socket, const std::string& tag);
  Guardian(Guardian&& other) noexcept;
  Guardian& operator=(Guardian&&) = delete;
  ~Guardian();  // closes the pipe: the guardian cleans up and exits

  // The session now owns (`owned` true) or no longer owns sandbox `id`.
  void note(const std::string& id, bool owned);

 private:
  explicit Guardian(int fd) : fd_(fd) {}
  std::mutex mu_;
  int fd_ = -1;
};

// A session tag unique on this host: "mcp-<pid>-<random hex>".
std::string new_session_tag();

// The guardian's work, apart from the fork (tested directly): reads "+id" /
// "-id" lines from `fd` until EOF, then destroys the ids still owned and the
// live sandboxes labelled `tag` through the daemon at `socket`. Returns how
// many it destroyed.
int guard_until_eof(int fd, const std::filesystem::path& socket, const std::string& tag,
                    double wait_s = 120);

}  // namespace airlock::mcp

// The tools of one MCP client connection, over the daemon's public HTTP API
// (client::Client: the unix socket, or a TCP listener as one tenant). The
// session remembers the sandboxes it created so that close() can destroy
// them when the client goes away, except those created with keep: true.
//
// It acts only on the sandboxes it created (kept ones included): on the
// unix socket the daemon would let it reach every tenant's, and a model
// talking to this server should not drive, read or destroy sandboxes it
// was never given. Another id is "not found", as the daemon says for an id
// that does not exist, and sandbox_list shows only the session's own.
// Scope::all (`airlock mcp --all`) lifts this: every sandbox the daemon
// shows this caller.
//
//   Session s(client::Client(socket));
//   json result = s.call("sandbox_exec", {{"sandbox_id", id}, {"command", "ls /"}});
//   // result: {"content": [{"type":"text",...}], "structuredContent": {...}, "isError": false}
//   s.close();  // destroys what it created
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "client/client.h"

namespace airlock::mcp {

// The metadata label a session puts on the sandboxes it owns (value: its
// tag), so the guardian finds also one whose create was still running when
// the server died.
inline constexpr const char* kSessionLabel = "mcp_session";

class Session {
 public:
  enum class Scope { created, all };
  // `tag` (if not empty) labels the sandboxes this session owns.
  explicit Session(client::Client client, std::string tag = "", Scope scope = Scope::created);

  // Runs tool `name` (which must exist: find_tool) with `arguments` and
  // returns the MCP CallToolResult. Every failure (bad arguments, the
  // daemon's errors, a lost connection) is a result with isError: true
  // whose text carries the code, message and field; nothing throws.
  // `structured` false (protocol 2025-03-26) leaves out structuredContent.
  // `call_key` (the JSON-RPC request id, dumped) lets cancel() find the
  // command this call runs.
  nlohmann::json call(const std::string& name, const nlohmann::json& arguments,
                      bool structured = true, const std::string& call_key = "");

  // notifications/cancelled: kills the command that call `call_key` runs in
  // its sandbox (its result then says reason "killed"); a cancel that
  // arrives while that command is still being started kills it as soon as
  // it has an exec id. Returns whether the call runs (or starts) a command.
  bool cancel(const std::string& call_key);

  // Destroys every sandbox this session created without keep (already gone
  // is fine) and refuses further creates: one that finishes afterwards is
  // destroyed at once. Safe to call more than once and from any thread.
  void close();

  // Ids of the sandboxes close() would destroy.
  std::vector<std::string> owned() const;

  // Called (under the session's lock, so in order) whenever a sandbox
  // becomes owned or stops being owned: the Guardian's feed.
  void set_observer(std::function<void(const std::string& id, bool owned)> observer);

 private:
  nlohmann::json create(const nlohmann::json& args);
  nlohmann::json exec(const nlohmann::json& args, const std::string& call_key);
  nlohmann::json write_file(const nlohmann::json& args);
  nlohmann::json read_file(const nlohmann::json& args);
  nlohmann::json list_files(const nlohmann::json& args);
  nlohmann::json set_network(const nlohmann::json& args);
  nlohmann::json logs(const nlohmann::json& args);
  nlohmann::json destroy(const nlohmann::json& args);
  nlohmann::json list(const nlohmann::json& args);
  void disown(const std::string& id);
  // Error(not_found, field sandbox_id) unless the session may act on `id`.
  void check_scope(const std::string& id) const;

  client::Client client_;
  std::string tag_;
  Scope scope_;
  std::set<std::string> created_;  // guarded by mu_; keep ones too
  mutable std::mutex mu_;
  std::set<std::string> owned_;                             // guarded by mu_
  std::function<void(const std::string&, bool)> observer_;  // guarded by mu_
  // call key -> the command a sandbox_exec call runs (or is starting).
  struct Running {
    std::string sandbox_id;
    std::string exec_id;  // empty until the daemon's start event
    bool cancel_pending = false;
  };
  bool kill(const Running& target);  // DELETE of its exec; false when already gone

  std::map<std::string, Running> running_;  // guarded by mu_
  bool closed_ = false;                     // guarded by mu_
};

}  // namespace airlock::mcp

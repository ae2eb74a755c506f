// GET /v1/sandboxes/{id}/pty: an interactive terminal over a WebSocket
// (internal to airlockd; the protocol is in api/openapi.yaml and docs/design.md).
//
//   client -> server, first text frame:
//     {"argv": [...]?, "cols": N, "rows": N, "env": {}?, "cwd": "..."?, "user": "..."?}
//   then binary frames = terminal input, text frames
//     {"resize": {"cols": N, "rows": N}} or {"signal": N}
//   or, to attach to a pty exec of a previous daemon (engine attach_exec):
//     {"exec_id": "...", "offset": N?, "cols": N?, "rows": N?}
//   server -> client: text {"type":"start","exec_id"} (or {"type":"attach",...}),
//     binary terminal output,
//     text {"type":"exit","exit_code",...} or {"type":"error","error":{...}}, then close.
//
// Errors before the upgrade (no such sandbox, not running, not a WebSocket
// request) are ordinary HTTP error responses.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "daemon/exchange.h"
#include "engine/api/service.h"

namespace airlock::daemon {

// The first text frame's other form, {"exec_id", "offset"?, "cols"?, "rows"?}:
// attach to a pty exec that outlived its client (the daemon was restarted)
// from byte `offset` of its terminal output (optionally resizing it).
struct PtyAttach {
  std::string exec_id;
  uint64_t offset = 0;
  std::optional<std::pair<int, int>> size;  // cols, rows
};
// nullopt if `text` is not an attach message (no exec_id); else the
// message, or Error(invalid_argument, field).
std::optional<PtyAttach> parse_pty_attach(const std::string& text);

// A parsed client control message (text frame after the first).
struct PtyControl {
  std::optional<std::pair<int, int>> resize;  // cols, rows
  std::optional<int> signal;
};

// The first text frame as an exec request. Throws Error(invalid_argument,
// field) naming what is wrong (unknown field, cols/rows out of 1..4096, ...).
engine::ExecRequest parse_pty_start(const std::string& text);
// A later text frame. Throws Error(invalid_argument, field).
PtyControl parse_pty_control(const std::string& text);

// Serves the route: checks, upgrades and runs the session until the exec
// ended and the close handshake is done, or the client went away (then the
// exec is killed). Throws Error before the upgrade only.
void handle_pty(engine::SandboxService& engine, Exchange& ex, const std::string& id);

}  // namespace airlock::daemon

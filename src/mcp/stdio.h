// `airlock mcp`'s transport: newline-delimited JSON-RPC on stdin/stdout
// (logs go to stderr only). tools/call runs on its own thread so a long
// sandbox_exec does not hold up ping or other calls; replies are written
// whole, one line each, under a lock.
//
// The session ends when stdin reaches EOF (the client closed it or died)
// or on SIGTERM, SIGHUP or SIGINT: then the sandboxes it created without
// keep are destroyed (which also ends commands running in them), calls
// still in flight get up to `drain_s` to finish, and serve() returns.
#pragma once

#include "mcp/session.h"

namespace airlock::mcp {

// Blocks SIGTERM, SIGHUP, SIGINT and SIGPIPE in the calling thread (and so
// in threads it starts later). Call before any thread exists so serve() can
// take those signals through a signalfd.
void block_session_signals();

// Serves MCP on `in_fd`/`out_fd` until EOF or a signal. Returns 0 after EOF,
// 128 + the signal number after a signal.
int serve(Session& session, int in_fd, int out_fd, double drain_s = 30);

}  // namespace airlock::mcp

// airlockd's HTTP/1.1 server: a unix socket, one thread per connection
// (engine calls block), keep-alive, routes from router.h, bodies validated by
// request.h, errors as {"error": {"code", "message", "field"}}.
//
// The socket file is the credential (mode 0600 in a 0700 directory; with
// a group `airlock` on the host, 0660 in a 0750 directory of that group). A lock
// file beside it (<socket>.lock, flock) makes a second daemon on the same
// socket refuse to start; a stale socket file is removed only when nothing
// answers on it.
//
//   Server server("/var/lib/airlock/airlockd.sock");
//   server.bind();                       // throws Error(conflict) if taken
//   engine::SandboxService engine(config);       // only once the socket is ours
//   bool clean = server.run(engine);     // until SIGTERM/SIGINT
//
// Streaming responses (see api/openapi.yaml):
//   * exec: 200 chunked application/x-ndjson, one JSON object per line:
//       {"type":"start","exec_id":..,"pid":..}
//       {"type":"stdout"|"stderr","data":"<base64>"}   (one per chunk, flushed)
//       {"type":"exit", <engine::to_json(ExecResult)>}
//     or, after the stream started, {"type":"error","error":{code,message,field}}.
//     Errors before the process starts are ordinary 4xx/5xx JSON responses.
//     A client that disconnects kills the exec.
//
// Bounds (ServerLimits, airlockd --max-connections / --idle-timeout): beyond
// max_connections a new connection is answered 503 unavailable and closed;
// a socket read or write blocked longer than idle_timeout (a client that
// sends nothing, stops mid-request or stops reading a stream) closes its
// connection, with a 408 when a request had begun. Time inside the engine is
// never idle: a silent exec or an event follow stream is not cut. Counted in
// GET /v1/info "daemon.connections".
//
//   * file download: 200 chunked application/octet-stream; an error after
//     the first byte aborts the connection without the terminating chunk,
//     so the client sees a truncated (invalid) chunked body, never a short
//     file that looks complete.
#pragma once

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <set>

#include "daemon/connection.h"
#include "daemon/principal.h"
#include "engine/api/service.h"

namespace boost::asio::ssl {
class context;
}
namespace airlock::auth {
class Auth;
}

namespace airlock::daemon {

struct ListenSpec;

class Exchange;

class Server {
 public:
  explicit Server(std::filesystem::path socket_path, ServerLimits limits = {});
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Takes the lock file and binds the socket (0600). Throws Error(conflict)
  // if another daemon holds the lock or answers on the socket.
  void bind();

  // Also serves the API on TCP (`airlockd --listen`), TLS when `tls` is set.
  // Every TCP request is authenticated by `auth` (set_auth first): the
  // socket file stays the operator's door. Call after bind(), before run();
  // throws Error naming the address if it cannot be bound.
  void listen(const ListenSpec& spec, std::shared_ptr<boost::asio::ssl::context> tls);
  // Tokens, tenants' quotas and the audit log (src/auth); required by
  // listen(). Outlives the server.
  void set_auth(auth::Auth* auth);
  // The TCP ports actually bound (for --listen HOST:0), in listen() order.
  std::vector<int> tcp_ports() const;

  // Serves until SIGTERM/SIGINT or stop(); then stops accepting, removes the
  // socket, ends open connections and waits (bounded) for their threads.
  // Returns false if some connection thread is still inside the engine when
  // the wait ends (the caller should then exit without destroying the engine).
  bool run(engine::SandboxService& engine);

  // Asks run() to return; thread-safe.
  void stop();

  // A handler for every request whose path starts with `prefix` (e.g. the
  // E2B-compatible surface, src/e2b), tried before the route table. It
  // answers the exchange itself; an airlock::Error it throws before
  // answering becomes the usual error response. Call before run().
  using Extension = std::function<void(engine::SandboxService&, Exchange&, const Principal&)>;
  void add_extension(std::string prefix, Extension handler);

  // Connections open / refused / cut, as in GET /v1/info.
  nlohmann::json counters() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace airlock::daemon

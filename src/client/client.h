// A small HTTP/1.1 client for airlockd over its unix socket (Boost.Beast,
// synchronous, one connection per call). Non-2xx answers become
// airlock::Error rebuilt from the daemon's {"error": {code, message, field}}.
//
//   Client c("/home/me/.local/share/airlock/airlockd.sock");
//   json sb = c.call("POST", "/v1/sandboxes", json{{"image", "minimal"}});
//   json exit = c.exec(sb["id"], body, [](const json& ev) { ... });
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "common/error.h"

namespace airlock::client {

// The daemon's answer broke off after the request was sent (the daemon died
// or closed the connection mid-exec): the command's fate is unknown. The CLI
// exits with kExitConnectionLost for it, distinct from the command's codes.
class ConnectionLost : public Error {
 public:
  explicit ConnectionLost(const std::string& message) : Error(Errc::unavailable, message) {}
};

// `airlock exec/run` exit status when the connection to airlockd was lost
// while the command ran (as ssh uses 255 for its own failures).
inline constexpr int kExitConnectionLost = 255;

namespace detail {
struct Conn;
}

class Client {
 public:
  explicit Client(std::filesystem::path socket);
  ~Client();
  Client(const Client&);
  Client& operator=(const Client&);
  Client(Client&&) noexcept;  // keeps the connection of listening()
  Client& operator=(Client&&) noexcept;

  const std::filesystem::path& socket() const { return socket_; }

  // True if a daemon answers GET /v1/info on the socket (with anything: a
  // daemon at its connection cap answers 503 and is still running).
  bool ping() const;

  // True if something accepts connections on the socket: one connect(2), no
  // request. The connection is kept and carries this client's next request
  // if that comes within 2 s (else it is closed unused, which the daemon
  // takes quietly). This is how the CLI checks for a daemon before its
  // first call: ping()'s GET /v1/info costs a round trip and the daemon's
  // listing of images, recipes and templates, once per agent call.
  bool listening() const;

  // A JSON request (no body if `body` is null). Returns the parsed answer
  // (null for 204). Throws Error for error answers and connection failures.
  nlohmann::json call(const std::string& method, const std::string& target,
                      const nlohmann::json& body = nullptr) const;

  // POST /v1/sandboxes/{id}/exec; calls `on_event` for every NDJSON event as
  // it arrives (start, stdout, stderr) and returns the final "exit" event.
  // An "error" event, or a stream that ends without "exit", throws Error;
  // a connection that breaks mid-stream throws ConnectionLost.
  nlohmann::json exec(const std::string& id, const nlohmann::json& body,
                      const std::function<void(const nlohmann::json&)>& on_event) const;

  // GET `target` answered with NDJSON (e.g. .../network/events?follow=true):
  // calls `on_event` for every line as it arrives, until the stream ends. A
  // line {"error": {...}} throws Error, as does an incomplete stream.
  // With `post_body`, the request is a POST of that JSON (POST /v1/images/build).
  void stream_lines(const std::string& target,
                    const std::function<void(const nlohmann::json&)>& on_event,
                    const nlohmann::json& post_body = nullptr) const;

  // PUT /v1/sandboxes/{id}/files: streams `fd` (to EOF) as a chunked body.
  // Returns the bytes the daemon wrote.
  uint64_t upload(const std::string& id, const std::string& path, uint32_t mode, int fd) const;
  // POST `target` with the bytes of `fd` as a chunked body (image import);
  // returns the JSON answer, throws Error for an error answer.
  nlohmann::json post_stream(const std::string& target, int fd) const;

  // GET /v1/sandboxes/{id}/files: streams the file into `fd`. Throws Error if
  // the download is truncated. Returns the bytes written.
  uint64_t download(const std::string& id, const std::string& path, int fd) const;

 private:
  struct Spare;
  // A connection made by listening() (or a fresh one).
  std::unique_ptr<detail::Conn> open() const;

  std::filesystem::path socket_;
  mutable std::unique_ptr<Spare> spare_;  // not copied: a copy opens its own
};

// POST /v1/sandboxes/{id}/exec/{exec_id}/stdin[?eof=true], one request per
// send() on one kept-alive connection (reconnecting when the daemon closed
// it). For the CLI's stdin pump (stdin_pump.h).
class StdinSender {
 public:
  StdinSender(std::filesystem::path socket, std::string id, std::string exec_id);
  ~StdinSender();
  StdinSender(const StdinSender&) = delete;
  StdinSender& operator=(const StdinSender&) = delete;
  // Appends `bytes` (then closes stdin if `eof`); returns the daemon's
  // {"exec_id","stdin_bytes","stdin_total","stdin_closed"}. Throws Error
  // for error answers (e.g. conflict once the exec ended).
  nlohmann::json send(std::string_view bytes, bool eof);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A daemon's TCP listener (airlockd --listen) named where a socket path goes:
// a "socket" of the form http://HOST:PORT or https://HOST:PORT connects
// over TCP, sends $AIRLOCK_TOKEN as a bearer token, and for https checks
// the certificate against $AIRLOCK_CA (PEM; default the system's CAs) and
// HOST. std::nullopt for an ordinary path; Error(invalid_argument) for a
// malformed URL.
struct Remote {
  std::string host, port;
  bool tls = false;
};
std::optional<Remote> parse_remote(const std::string& url);

// Refuses (Error(invalid_argument), field AIRLOCK_URL) to send `token` over
// plain http to a host that is not this machine's loopback: any hop could
// read it there. Loopback is an address (127.0.0.0/8, ::1) or "localhost",
// never resolved, so a name that merely points at 127.0.0.1 does not count.
// The same rule as the Python SDK's.
void check_token_transport(const Remote& r, const std::string& token, const std::string& url);

// Maps the daemon's error code string back to an Errc ("not_found" -> not_found).
int errc_from_string(const std::string& code);

}  // namespace airlock::client

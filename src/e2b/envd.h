// The in-sandbox half of the E2B-compatible API ("envd", docs/e2b.md),
// served under /e2b/envd on airlockd's TCP listener. E2B's SDK, pointed
// there by E2B_SANDBOX_URL, sends every in-sandbox call to that one URL with
// the headers
//
//   E2b-Sandbox-Id: <sandbox id>      which sandbox
//   E2b-Sandbox-Port: 49983           envd's port (other ports: not served)
//   X-Access-Token: <token>           secure sandboxes (access.h)
//   Authorization: Basic b64(user:)   the user to run as (envd >= 0.4.0: only
//                                     when the caller names one)
//
// and no API key (e2b 2.10's plain-HTTP client, for /health and /files,
// sends only the access token: then the token alone names the sandbox). So a call is authorised by
// the sandbox's access token (every sandbox is secure by default), or, only where the operator
// turned insecure sandboxes on (airlockd --e2b-allow-insecure), by nothing at all for one created
// with `secure: false`; a caller that does present an airlock token (a tenant) must also own the
// sandbox. Every refusal (unknown id, another tenant's sandbox, a missing or wrong access token, a
// sandbox that is not running) is the same answer E2B's proxy gives for a sandbox that does not
// exist: 502 {"code": 502, "message", "sandboxId"}, so a caller learns nothing about ids it may not
// use; those that are failed authentications count against the caller's address in the daemon's
// auth-failure limiter (audit.h), so access tokens and ids cannot be guessed at line rate.
//
// The routing table: one registration per method. A service lives in its
// own file and registers itself (process.cc: process.Process; the
// filesystem service and /files likewise):
//
//   envd.unary("/process.Process/List", [](Call& c, const json& req) { ... return resp; });
//   envd.stream("/process.Process/Start", [](Call& c, const json& req, StreamWriter& out) {...});
//   envd.http("GET", "/files", [](Call& c) { c.ex.send_...; });
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "daemon/exchange.h"
#include "daemon/principal.h"
#include "e2b/access.h"
#include "e2b/connect.h"
#include "engine/api/service.h"

namespace airlock::e2b {

inline constexpr std::string_view kEnvdPrefix = "/e2b/envd";
inline constexpr int kEnvdPort = 49983;

// One call, its sandbox resolved and authorised.
struct Call {
  engine::SandboxService& engine;
  daemon::Exchange& ex;
  engine::SandboxInfo sandbox;
  // The run-as user: the Basic auth user name when the SDK sent one, else
  // the sandbox's default (`user` for template base, root otherwise).
  std::string user;
  // Connect-Timeout-Ms, if sent (the SDK's timeoutMs of a command).
  std::optional<int64_t> timeout_ms;
  // Keepalive-Ping-Interval (seconds) the SDK asked for, clamped 1..50.
  int keepalive_s = 50;

  // A request header's value ("" if absent).
  std::string header(std::string_view name) const;
};

// The response side of a Connect server stream: 200 application/connect+json
// begins with the first message (or the end).
class StreamWriter {
 public:
  explicit StreamWriter(daemon::Exchange& ex) : ex_(ex) {}
  // false once the client is gone (then stop: the connection is cut).
  bool send(const nlohmann::json& message);
  // The end-of-stream message, with `error` if the call failed.
  void finish(const connect::RpcError* error = nullptr);
  bool finished() const { return finished_; }

 private:
  bool begin();
  daemon::Exchange& ex_;
  bool finished_ = false;
};

class Envd {
 public:
  using Unary = std::function<nlohmann::json(Call&, const nlohmann::json&)>;
  using Stream = std::function<void(Call&, const nlohmann::json&, StreamWriter&)>;
  using Http = std::function<void(Call&)>;

  // `allow_insecure`: airlockd --e2b-allow-insecure (anonymous calls to a
  // sandbox created with `secure: false` are served).
  explicit Envd(std::shared_ptr<const AccessTokens> tokens, bool allow_insecure = false)
      : tokens_(std::move(tokens)), allow_insecure_(allow_insecure) {}

  // Registrations (before serving): `path` below kEnvdPrefix, e.g.
  // "/process.Process/List" or "/files".
  void unary(std::string path, Unary handler);
  void stream(std::string path, Stream handler);
  void http(std::string method, std::string path, Http handler);

  // Run by shutdown(), newest first: a service's teardown (process.cc ends
  // the commands it runs, which must happen before the engine goes away).
  void on_shutdown(std::function<void()> hook) { shutdown_.push_back(std::move(hook)); }
  void shutdown() {
    for (auto it = shutdown_.rbegin(); it != shutdown_.rend(); ++it) (*it)();
    shutdown_.clear();
  }

  // Answers one request whose path starts with kEnvdPrefix.
  void serve(engine::SandboxService& engine, daemon::Exchange& ex, const daemon::Principal& who) const;

 private:
  engine::SandboxInfo resolve(engine::SandboxService& engine, daemon::Exchange& ex,
                              const daemon::Principal& who) const;
  void serve_rpc(Call& call, const std::string& path) const;

  std::shared_ptr<const AccessTokens> tokens_;
  bool allow_insecure_;
  std::map<std::string, Unary> unary_;
  std::map<std::string, Stream> stream_;
  std::map<std::string, Http> http_;  // key "METHOD path"
  std::vector<std::function<void()>> shutdown_;
};

// The envd airlockd serves: every service registered (services.cc).
std::shared_ptr<Envd> make_envd(std::shared_ptr<const AccessTokens> tokens,
                                bool allow_insecure = false);

// The run-as user of an `Authorization: Basic base64(name:)` header ("" if
// none); RpcError invalid_argument if it is malformed.
std::string basic_auth_user(std::string_view authorization);

}  // namespace airlock::e2b

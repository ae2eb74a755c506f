#include "e2b/envd.h"

#include "daemon/base64.h"
#include "e2b/audit.h"
#include "e2b/model.h"
#include "e2b/version.h"

namespace airlock::e2b {

using connect::Code;
using connect::RpcError;
using nlohmann::json;

namespace {

// A sandbox the caller may not use, whatever the reason: E2B's proxy answer
// for a sandbox that does not exist (the SDK maps 502 to "sandbox not found
// ... likely due to sandbox timeout", for Connect calls via `unavailable`).
struct NotFound {
  std::string id;
  bool auth_failure = true;  // the caller did not prove it may use `id`
};

std::optional<int64_t> parse_ms(const std::string& v) {
  if (v.empty() || v.size() > 12 || v.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  return std::stoll(v);
}

bool has_content_type(const std::string& value, std::string_view want) {
  std::string_view v = value;
  if (auto semi = v.find(';'); semi != std::string_view::npos) v = v.substr(0, semi);
  while (!v.empty() && v.back() == ' ') v.remove_suffix(1);
  return v == want;
}

// The request body through `parse`, read up to `cap` bytes; a longer body is
// Connect's resource_exhausted (unary calls and streams alike).
template <class Parse>
json read_request(daemon::Exchange& ex, size_t cap, Parse parse) {
  try {
    return parse(ex.read_body(cap));
  } catch (const Error& e) {
    if (e.code() != Errc::payload_too_large) throw;
    throw RpcError(
        Code::resource_exhausted,
        "request message exceeds " + std::to_string(connect::kMaxRequestMessage) + " bytes");
  }
}

void send_rpc_error(daemon::Exchange& ex, const RpcError& e) {
  ex.send_json(connect::http_status(e.code()), connect::error_json(e));
}

}  // namespace

std::string Call::header(std::string_view name) const {
  const auto& req = ex.request();
  auto it = req.find(boost::beast::string_view(name.data(), name.size()));
  return it == req.end() ? std::string() : std::string(it->value());
}

bool StreamWriter::begin() {
  if (!ex_.streaming()) ex_.begin_stream("application/connect+json");
  return true;
}

bool StreamWriter::send(const json& message) {
  if (finished_) return false;
  begin();
  return ex_.write_chunk(connect::message_envelope(message));
}

void StreamWriter::finish(const RpcError* error) {
  if (finished_) return;
  finished_ = true;
  begin();
  if (ex_.write_chunk(connect::end_stream_envelope(error)))
    ex_.end_stream();
  else
    ex_.abort_stream();
}

void Envd::unary(std::string path, Unary handler) { unary_[std::move(path)] = std::move(handler); }
void Envd::stream(std::string path, Stream handler) {
  stream_[std::move(path)] = std::move(handler);
}
void Envd::http(std::string method, std::string path, Http handler) {
  http_[method + " " + path] = std::move(handler);
}

std::string basic_auth_user(std::string_view authorization) {
  if (authorization.size() < 6 ||
      !boost::beast::iequals(boost::beast::string_view(authorization.data(), 6), "Basic "))
    return "";
  std::string_view b64 = authorization.substr(6);
  while (!b64.empty() && b64.front() == ' ') b64.remove_prefix(1);
  auto decoded = daemon::base64_decode(b64);
  if (!decoded) throw RpcError(Code::invalid_argument, "Authorization: Basic is not base64");
  std::string user = decoded->substr(0, decoded->find(':'));
  if (user.size() > 32 || user.find_first_of(std::string_view("\0/\n\r:", 5)) != std::string::npos)
    throw RpcError(Code::invalid_argument, "invalid user name in Authorization: Basic");
  return user;
}

// Which sandbox, and may this caller use it (see envd.h)?
engine::SandboxInfo Envd::resolve(engine::SandboxService& engine, daemon::Exchange& ex,
                                  const daemon::Principal& who) const {
  const auto& req = ex.request();
  auto h = [&](const char* name) {
    auto it = req.find(name);
    return it == req.end() ? std::string() : std::string(it->value());
  };
  std::string id = h("E2b-Sandbox-Id");
  std::string token = h("X-Access-Token");
  if (id.empty() && token.size() == 64) {
    // e2b 2.10's HTTP client (/health, /files) sends the access token but
    // no E2b-Sandbox-Id: the token names its sandbox (an HMAC of the id).
    for (const auto& sb : engine.list({{std::string(kMetaSecure), "true"}}))
      if (tokens_->check(sb.id, token)) {
        id = sb.id;
        break;
      }
  }
  if (id.empty() || id.size() > 64) throw NotFound{id.substr(0, 64)};
  engine::SandboxInfo info;
  try {
    info = engine.get(id);
  } catch (const Error& e) {
    if (e.code() == Errc::not_found || e.code() == Errc::invalid_argument) throw NotFound{id};
    throw;
  }
  const auto& meta = info.spec.metadata;
  bool via_e2b = meta.count(kMetaTemplate) > 0;
  auto sec = meta.find(kMetaSecure);
  bool secure = sec != meta.end() && sec->second == "true";
  if (who.kind == daemon::Principal::Kind::anonymous) {
    // No airlock credential: only an E2B sandbox, by its access token, or
    // one made with secure: false where the operator allows those.
    if (!via_e2b) throw NotFound{id};
    if (secure ? token.empty() || !tokens_->check(id, token) : !allow_insecure_) throw NotFound{id};
  } else {
    if (!who.can_see(info.spec.tenant)) throw NotFound{id};
    if (secure && !token.empty() && !tokens_->check(id, token)) throw NotFound{id};
  }
  // Authorised, but not there to serve: no failure of the caller's.
  if (info.state != engine::State::running) throw NotFound{id, false};
  std::string port = h("E2b-Sandbox-Port");
  if (!port.empty() && port != std::to_string(kEnvdPort)) throw NotFound{id, false};
  return info;
}

void Envd::serve(engine::SandboxService& engine, daemon::Exchange& ex, const daemon::Principal& who) const {
  std::string path(ex.path().substr(kEnvdPrefix.size()));
  std::optional<Call> call;
  try {
    engine::SandboxInfo info = resolve(engine, ex, who);
    call.emplace(Call{engine, ex, std::move(info), "", std::nullopt, 50});
  } catch (const NotFound& nf) {
    if (nf.auth_failure && count_envd_auth_failure(ex, who, std::string(kEnvdPrefix) + path, nf.id))
      return;  // answered 429
    ex.send_json(502,
                 {{"code", 502}, {"message", "The sandbox was not found"}, {"sandboxId", nf.id}});
    return;
  }
  Call& c = *call;
  try {
    c.user = basic_auth_user(c.header("Authorization"));
    if (c.user.empty())
      c.user = c.sandbox.spec.metadata.count(kMetaTemplate) &&
                       c.sandbox.spec.metadata.at(kMetaTemplate) == "base"
                   ? "user"
                   : "root";
    c.timeout_ms = parse_ms(c.header("Connect-Timeout-Ms"));
    if (auto k = parse_ms(c.header("Keepalive-Ping-Interval")))
      c.keepalive_s = static_cast<int>(std::clamp<int64_t>(*k, 1, 50));
  } catch (const RpcError& e) {
    send_rpc_error(ex, e);
    return;
  }

  if (path == "/health" && ex.method() == "GET") {
    ex.send_empty(204);  // envd: 204, no body
    return;
  }
  if (auto it = http_.find(std::string(ex.method()) + " " + path); it != http_.end()) {
    it->second(c);
    return;
  }
  serve_rpc(c, path);
}

void Envd::serve_rpc(Call& c, const std::string& path) const {
  daemon::Exchange& ex = c.ex;
  auto u = unary_.find(path);
  auto s = stream_.find(path);
  if (u == unary_.end() && s == stream_.end()) {
    ex.send_json(404, connect::error_json(RpcError(Code::unimplemented,
                                                   "airlock's envd " + std::string(kEnvdVersion) +
                                                       " does not serve " + path)));
    return;
  }
  if (ex.method() != "POST") {
    ex.send_error(405, "method_not_allowed", "Connect calls are POST", "POST");
    return;
  }
  std::string ctype = c.header("Content-Type");
  if (u != unary_.end()) {
    if (!has_content_type(ctype, "application/json")) {
      ex.send_json(415, connect::error_json(RpcError(
                            Code::invalid_argument,
                            "unary calls take Content-Type application/json (the JSON codec)")));
      return;
    }
    try {
      json req = read_request(ex, connect::kMaxRequestMessage,
                              [](std::string_view b) { return connect::parse_unary_request(b); });
      json resp = u->second(c, req);
      ex.send_json(200, resp);
    } catch (const RpcError& e) {
      if (ex.responded()) throw;
      send_rpc_error(ex, e);
    } catch (const Error& e) {
      if (ex.responded()) throw;
      send_rpc_error(ex, connect::from_error(e));
    }
    return;
  }
  if (!has_content_type(ctype, "application/connect+json")) {
    ex.send_json(415, connect::error_json(
                          RpcError(Code::invalid_argument,
                                   "streaming calls take Content-Type application/connect+json")));
    return;
  }
  StreamWriter out(ex);
  try {
    // + 5: the envelope's flag byte and length.
    json req = read_request(ex, connect::kMaxRequestMessage + 5,
                            [](std::string_view b) { return connect::parse_stream_request(b); });
    s->second(c, req, out);
    out.finish();
  } catch (const RpcError& e) {
    out.finish(&e);
  } catch (const Error& e) {
    RpcError r = connect::from_error(e);
    out.finish(&r);
  }
}

}  // namespace airlock::e2b

#include "client/client.h"

#include <unistd.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <variant>

#include "client/text.h"
#include "common/error.h"

namespace airlock::client {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using stream = net::local::stream_protocol;
using tcp = net::ip::tcp;
using nlohmann::json;

namespace {

constexpr Errc kCodes[] = {Errc::invalid_argument,  Errc::not_found,      Errc::conflict,
                           Errc::payload_too_large, Errc::timeout,        Errc::unavailable,
                           Errc::guest_error,       Errc::protocol_error, Errc::internal,
                           Errc::unauthenticated,   Errc::quota_exceeded, Errc::rate_limited};

Errc errc_of(const std::string& code) {
  for (Errc c : kCodes)
    if (to_string(c) == code) return c;
  return code == "method_not_allowed" ? Errc::invalid_argument : Errc::internal;
}

// Error from an answer: the daemon's error JSON if it sent one, else the status.
[[noreturn]] void throw_answer(int status, const std::string& body) {
  json j = json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_object()) {
    const json& e = j["error"];
    throw Error(errc_of(e.value("code", "internal")), e.value("message", "error"),
                e.value("field", ""));
  }
  throw Error(status >= 500 ? Errc::internal : Errc::invalid_argument,
              "airlockd answered HTTP " + std::to_string(status) +
                  (body.empty() ? "" : ": " + body.substr(0, 200)));
}

// The connection's byte stream: the unix socket, or TCP (plain or TLS) to
// an airlockd --listen named by an http(s):// address (client.h).
using SslStream = net::ssl::stream<tcp::socket>;
struct AnyStream {
  std::variant<stream::socket, tcp::socket, std::unique_ptr<SslStream>> s;

  template <class F>
  decltype(auto) visit(F&& f) {
    return std::visit(
        [&](auto& x) -> decltype(auto) {
          if constexpr (std::is_same_v<std::decay_t<decltype(x)>, std::unique_ptr<SslStream>>)
            return f(*x);
          else
            return f(x);
        },
        s);
  }
  template <class B>
  size_t read_some(const B& b, beast::error_code& ec) {
    size_t n = visit([&](auto& x) { return x.read_some(b, ec); });
    if (ec == net::ssl::error::stream_truncated) ec = net::error::eof;
    return n;
  }
  template <class B>
  size_t read_some(const B& b) {
    beast::error_code ec;
    size_t n = read_some(b, ec);
    if (ec) throw beast::system_error(ec);
    return n;
  }
  template <class B>
  size_t write_some(const B& b, beast::error_code& ec) {
    return visit([&](auto& x) { return x.write_some(b, ec); });
  }
  template <class B>
  size_t write_some(const B& b) {
    beast::error_code ec;
    size_t n = write_some(b, ec);
    if (ec) throw beast::system_error(ec);
    return n;
  }
};

}  // namespace

struct detail::Conn {
  net::io_context io;
  AnyStream sock{stream::socket(io)};
  beast::flat_buffer buf;
  std::string token;  // AIRLOCK_TOKEN, sent on TCP only

  explicit Conn(const std::filesystem::path& path) {
    beast::error_code ec;
    if (auto r = parse_remote(path.string())) {
      connect_tcp(*r, path.string());
      return;
    }
    std::get<stream::socket>(sock.s).connect(stream::endpoint(path.string()), ec);
    if (ec)
      throw Error(Errc::unavailable,
                  "cannot connect to airlockd at " + path.string() + ": " + ec.message());
  }

  void connect_tcp(const Remote& r, const std::string& url) {
    if (const char* t = std::getenv("AIRLOCK_TOKEN")) token = t;
    check_token_transport(r, token, url);  // before any byte is sent
    beast::error_code ec;
    tcp::resolver resolver(io);
    auto results = resolver.resolve(r.host, r.port, ec);
    tcp::socket s(io);
    if (!ec) net::connect(s, results, ec);
    if (ec)
      throw Error(Errc::unavailable, "cannot connect to airlockd at " + url + ": " + ec.message());
    s.set_option(tcp::no_delay(true), ec);
    if (!r.tls) {
      sock.s = std::move(s);
      return;
    }
    // Verified against AIRLOCK_CA (a PEM file) or the system's CAs.
    static net::ssl::context ctx = [] {
      net::ssl::context c(net::ssl::context::tls_client);
      const char* ca = std::getenv("AIRLOCK_CA");
      beast::error_code e;
      if (ca && *ca)
        c.load_verify_file(ca, e);
      else
        c.set_default_verify_paths(e);
      if (e)
        throw Error(Errc::invalid_argument,
                    std::string("AIRLOCK_CA ") + (ca ? ca : "") + ": " + e.message(), "AIRLOCK_CA");
      c.set_verify_mode(net::ssl::verify_peer);
      return c;
    }();
    auto ssl = std::make_unique<SslStream>(std::move(s), ctx);
    SSL_set_tlsext_host_name(ssl->native_handle(), r.host.c_str());
    // The name (or IP address) in the URL must be the certificate's.
    ssl->set_verify_callback(net::ssl::host_name_verification(r.host));
    ssl->handshake(net::ssl::stream_base::client, ec);
    if (ec) throw Error(Errc::unavailable, "TLS with " + url + " failed: " + ec.message());
    sock.s = std::move(ssl);
  }

  template <class Body>
  void send(http::request<Body>& req) {
    req.set(http::field::host, "localhost");
    req.set(http::field::user_agent, "airlock/" AIRLOCK_VERSION);
    if (!token.empty()) req.set(http::field::authorization, "Bearer " + token);
    req.prepare_payload();
    beast::error_code ec;
    http::write(sock, req, ec);
    if (ec) throw Error(Errc::unavailable, "sending to airlockd failed: " + ec.message());
  }

  // Reads a whole (bounded) response.
  http::response<http::string_body> read_all() {
    http::response_parser<http::string_body> p;
    p.body_limit(64ull << 20);
    beast::error_code ec;
    http::read(sock, buf, p, ec);
    if (ec) throw Error(Errc::unavailable, "reading airlockd's answer failed: " + ec.message());
    return p.release();
  }

  // Reads a streamed response, passing body bytes to `sink` as they come.
  // Non-200 answers are read whole and thrown. A connection that breaks
  // after the request was sent throws ConnectionLost (what arrived before
  // has already gone to `sink`).
  void read_stream(const std::function<void(std::string_view)>& sink) {
    http::response_parser<http::buffer_body> p;
    p.body_limit(std::numeric_limits<std::uint64_t>::max());
    beast::error_code ec;
    http::read_header(sock, buf, p, ec);
    if (ec)
      throw ConnectionLost("lost the connection to airlockd before it answered (" + ec.message() +
                           ")");
    int status = p.get().result_int();
    std::string error_text;
    char chunk[64 * 1024];
    while (!p.is_done()) {
      p.get().body().data = chunk;
      p.get().body().size = sizeof chunk;
      // read_some, not read: read() returns only once the 64 KiB buffer is
      // full or the body ends, which held back a slow command's output
      // (`echo a; sleep 5; echo b` showed nothing for 5 s).
      http::read_some(sock, buf, p, ec);
      if (ec == http::error::need_buffer) ec = {};
      if (ec)
        throw ConnectionLost("lost the connection to airlockd mid-stream (" + ec.message() +
                             "); the output above is what arrived");
      size_t n = sizeof chunk - p.get().body().size;
      if (n == 0) continue;
      if (status == 200) {
        sink(std::string_view(chunk, n));
      } else if (error_text.size() < (1 << 20)) {
        error_text.append(chunk, n);
      }
    }
    if (status != 200) throw_answer(status, error_text);
  }
};

namespace {
using detail::Conn;
}  // namespace

std::optional<Remote> parse_remote(const std::string& url) {
  std::string rest;
  Remote r;
  if (url.rfind("http://", 0) == 0) {
    rest = url.substr(7);
  } else if (url.rfind("https://", 0) == 0) {
    rest = url.substr(8);
    r.tls = true;
  } else {
    return std::nullopt;
  }
  rest = rest.substr(0, rest.find('/'));
  auto colon = rest.rfind(':');
  if (!rest.empty() && rest.front() == '[') {  // [v6]:port
    auto close = rest.find(']');
    if (close == std::string::npos) colon = std::string::npos;
    r.host = rest.substr(1, close == std::string::npos ? 0 : close - 1);
    if (colon != std::string::npos && colon < close) colon = std::string::npos;
  } else {
    r.host = rest.substr(0, colon);
  }
  r.port = colon == std::string::npos ? (r.tls ? "443" : "80") : rest.substr(colon + 1);
  if (r.host.empty() || r.port.empty() ||
      r.port.find_first_not_of("0123456789") != std::string::npos)
    throw Error(Errc::invalid_argument,
                "AIRLOCK_URL must be http://HOST:PORT or https://HOST:PORT, got " + url,
                "AIRLOCK_URL");
  return r;
}

void check_token_transport(const Remote& r, const std::string& token, const std::string& url) {
  if (r.tls || token.empty()) return;
  bool loopback = r.host == "localhost" || (r.host.size() > 10 && r.host.ends_with(".localhost"));
  if (!loopback) {
    boost::system::error_code ec;
    auto addr = net::ip::make_address(r.host, ec);
    loopback = !ec && addr.is_loopback();
  }
  if (!loopback)
    throw Error(Errc::invalid_argument,
                "refusing to send AIRLOCK_TOKEN over plain http to " + url +
                    ": use https:// (airlockd --tls-cert/--tls-key) or a loopback address "
                    "(127.0.0.1, ::1, localhost)",
                "AIRLOCK_URL");
}

int errc_from_string(const std::string& code) { return static_cast<int>(errc_of(code)); }

struct Client::Spare {
  std::mutex mu;  // `airlock run`'s signal thread calls too
  std::unique_ptr<Conn> conn;
  std::chrono::steady_clock::time_point made;
};

Client::Client(std::filesystem::path socket) : socket_(std::move(socket)) {}
Client::~Client() = default;
Client::Client(const Client& other) : socket_(other.socket_) {}
Client& Client::operator=(const Client& other) {
  socket_ = other.socket_;
  spare_.reset();
  return *this;
}
Client::Client(Client&&) noexcept = default;
Client& Client::operator=(Client&&) noexcept = default;

bool Client::listening() const {
  std::unique_ptr<Conn> c;
  try {
    c = std::make_unique<Conn>(socket_);
  } catch (const Error&) {
    return false;
  }
  if (!spare_) spare_ = std::make_unique<Spare>();
  std::lock_guard lock(spare_->mu);
  spare_->conn = std::move(c);
  spare_->made = std::chrono::steady_clock::now();
  return true;
}

std::unique_ptr<Conn> Client::open() const {
  if (spare_) {
    std::unique_ptr<Conn> c;
    std::chrono::steady_clock::time_point made;
    {
      std::lock_guard lock(spare_->mu);
      c = std::move(spare_->conn);
      made = spare_->made;
    }
    // Far below the daemon's idle timeout (--idle-timeout, 60 s by default).
    if (c && std::chrono::steady_clock::now() - made < std::chrono::seconds(2)) return c;
  }
  return std::make_unique<Conn>(socket_);
}

bool Client::ping() const {
  try {
    Conn c(socket_);
    http::request<http::empty_body> req{http::verb::get, "/v1/info", 11};
    req.keep_alive(false);
    c.send(req);
    // Any answer is a daemon, also a 503 at its connection cap: starting
    // another one then would only fail on the lock and mislead the user.
    c.read_all();
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

json Client::call(const std::string& method, const std::string& target, const json& body) const {
  auto conn = open();
  Conn& c = *conn;
  http::request<http::string_body> req{http::string_to_verb(method), target, 11};
  if (!body.is_null()) {
    req.set(http::field::content_type, "application/json");
    req.body() = body.dump();
  }
  req.keep_alive(false);
  c.send(req);
  auto res = c.read_all();
  int status = res.result_int();
  if (status < 200 || status >= 300) throw_answer(status, res.body());
  if (res.body().empty()) return nullptr;
  json j = json::parse(res.body(), nullptr, false);
  if (j.is_discarded()) throw Error(Errc::internal, "airlockd sent malformed JSON");
  return j;
}

namespace {
// Splits NDJSON bytes into lines as they arrive.
class LineSplitter {
 public:
  explicit LineSplitter(std::function<void(std::string_view)> on_line)
      : on_line_(std::move(on_line)) {}
  void feed(std::string_view bytes) {
    pending_.append(bytes);
    size_t start = 0;
    for (size_t nl; (nl = pending_.find('\n', start)) != std::string::npos; start = nl + 1)
      on_line_(std::string_view(pending_).substr(start, nl - start));
    pending_.erase(0, start);
  }
  void finish() { on_line_(pending_); }

 private:
  std::function<void(std::string_view)> on_line_;
  std::string pending_;  // bytes of an unfinished line
};
}  // namespace

void Client::stream_lines(const std::string& target,
                          const std::function<void(const json&)>& on_event,
                          const json& post_body) const {
  auto conn = open();
  Conn& c = *conn;
  http::request<http::string_body> req{post_body.is_null() ? http::verb::get : http::verb::post,
                                       target, 11};
  if (!post_body.is_null()) {
    req.set(http::field::content_type, "application/json");
    req.body() = post_body.dump();
    req.prepare_payload();
  }
  req.keep_alive(false);
  c.send(req);
  LineSplitter lines([&](std::string_view line) {
    if (line.empty()) return;
    json ev = json::parse(line, nullptr, false);
    if (ev.is_discarded() || !ev.is_object())
      throw Error(Errc::internal, "airlockd sent a malformed event line");
    if (ev.contains("error") && ev["error"].is_object()) {
      const json& e = ev["error"];
      throw Error(errc_of(e.value("code", "internal")), e.value("message", "stream failed"),
                  e.value("field", ""));
    }
    on_event(ev);
  });
  c.read_stream([&](std::string_view bytes) { lines.feed(bytes); });
  lines.finish();
}

json Client::exec(const std::string& id, const json& body,
                  const std::function<void(const json&)>& on_event) const {
  auto conn = open();
  Conn& c = *conn;
  http::request<http::string_body> req{http::verb::post, "/v1/sandboxes/" + id + "/exec", 11};
  req.set(http::field::content_type, "application/json");
  req.body() = body.dump();
  req.keep_alive(false);
  c.send(req);
  std::string pending;  // bytes of an unfinished line
  json exit_event;
  auto handle_line = [&](std::string_view line) {
    if (line.empty()) return;
    json ev = json::parse(line, nullptr, false);
    if (ev.is_discarded() || !ev.is_object())
      throw Error(Errc::internal, "airlockd sent a malformed exec event");
    std::string type = ev.value("type", "");
    if (type == "exit") {
      exit_event = ev;
    } else if (type == "error") {
      const json& e = ev.value("error", json::object());
      throw Error(errc_of(e.value("code", "internal")), e.value("message", "exec failed"),
                  e.value("field", ""));
    } else {
      on_event(ev);
    }
  };
  c.read_stream([&](std::string_view bytes) {
    pending.append(bytes);
    size_t start = 0;
    for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1)
      handle_line(std::string_view(pending).substr(start, nl - start));
    pending.erase(0, start);
  });
  handle_line(pending);
  if (exit_event.is_null()) throw Error(Errc::internal, "exec stream ended without an exit event");
  return exit_event;
}

namespace {

// Streams `fd` to the daemon as the chunked body of `method target` and
// returns the 2xx answer's JSON (Error from the answer otherwise).
json send_chunked(Conn& c, http::verb method, const std::string& target,
                  const std::string& content_type, int fd) {
  http::request<http::empty_body> req{method, target, 11};
  req.set(http::field::host, "localhost");
  if (!c.token.empty()) req.set(http::field::authorization, "Bearer " + c.token);
  req.set(http::field::content_type, content_type);
  req.keep_alive(false);
  req.chunked(true);
  http::request_serializer<http::empty_body> sr{req};
  beast::error_code ec;
  http::write_header(c.sock, sr, ec);
  std::string buf(256 * 1024, '\0');
  while (!ec) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno("reading the upload source");
    if (n == 0) {
      net::write(c.sock, http::make_chunk_last(), ec);
      break;
    }
    net::write(c.sock, http::make_chunk(net::buffer(buf.data(), size_t(n))), ec);
  }
  // A write error usually means the daemon refused early and closed: its
  // answer (e.g. 404) is still readable and says why.
  http::response<http::string_body> res;
  try {
    res = c.read_all();
  } catch (const Error&) {
    if (ec) throw Error(Errc::unavailable, "upload to airlockd failed: " + ec.message());
    throw;
  }
  if (res.result_int() < 200 || res.result_int() >= 300) throw_answer(res.result_int(), res.body());
  return json::parse(res.body(), nullptr, false);
}

}  // namespace

uint64_t Client::upload(const std::string& id, const std::string& path, uint32_t mode,
                        int fd) const {
  auto conn = open();
  Conn& c = *conn;
  char mode_text[16];
  std::snprintf(mode_text, sizeof mode_text, "%04o", mode);
  json j =
      send_chunked(c, http::verb::put,
                   "/v1/sandboxes/" + id + "/files?path=" + url_encode(path) + "&mode=" + mode_text,
                   "application/octet-stream", fd);
  return j.is_object() ? j.value("bytes", uint64_t(0)) : 0;
}

json Client::post_stream(const std::string& target, int fd) const {
  auto conn = open();
  Conn& c = *conn;
  return send_chunked(c, http::verb::post, target, "application/x-tar", fd);
}

struct StdinSender::Impl {
  std::filesystem::path socket;
  std::string target;
  std::unique_ptr<Conn> conn;
};

StdinSender::StdinSender(std::filesystem::path socket, std::string id, std::string exec_id)
    : impl_(std::make_unique<Impl>()) {
  impl_->socket = std::move(socket);
  impl_->target = "/v1/sandboxes/" + id + "/exec/" + exec_id + "/stdin";
}

StdinSender::~StdinSender() = default;

json StdinSender::send(std::string_view bytes, bool eof) {
  http::request<http::string_body> req{http::verb::post, impl_->target + (eof ? "?eof=true" : ""),
                                       11};
  req.set(http::field::content_type, "application/octet-stream");
  req.body().assign(bytes.data(), bytes.size());
  req.keep_alive(true);
  http::response<http::string_body> res;
  for (int attempt = 0;; ++attempt) {
    bool reused = static_cast<bool>(impl_->conn);
    if (!impl_->conn) impl_->conn = std::make_unique<Conn>(impl_->socket);
    try {
      impl_->conn->send(req);
      res = impl_->conn->read_all();
      break;
    } catch (const Error& e) {
      impl_->conn.reset();  // unusable now
      // A kept-alive connection the daemon closed meanwhile (its idle
      // timeout while nobody typed) fails before any answer: the request
      // was not handled, so it is sent again on a fresh one.
      if (!reused || attempt > 0 || e.code() != Errc::unavailable) throw;
    }
  }
  if (!res.keep_alive()) impl_->conn.reset();
  int status = res.result_int();
  if (status < 200 || status >= 300) throw_answer(status, res.body());
  json j = json::parse(res.body(), nullptr, false);
  if (!j.is_object()) throw Error(Errc::internal, "airlockd sent malformed JSON");
  return j;
}

uint64_t Client::download(const std::string& id, const std::string& path, int fd) const {
  auto conn = open();
  Conn& c = *conn;
  http::request<http::empty_body> req{
      http::verb::get, "/v1/sandboxes/" + id + "/files?path=" + url_encode(path), 11};
  req.keep_alive(false);
  c.send(req);
  uint64_t total = 0;
  c.read_stream([&](std::string_view bytes) {
    while (!bytes.empty()) {
      ssize_t n = ::write(fd, bytes.data(), bytes.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw_errno("writing the download");
      bytes.remove_prefix(size_t(n));
      total += size_t(n);
    }
  });
  return total;
}

}  // namespace airlock::client

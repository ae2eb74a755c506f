#include "daemon/listener.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <boost/asio/ip/address.hpp>
#include <charconv>

#include "common/error.h"

namespace airlock::daemon {

namespace net = boost::asio;
namespace ssl = boost::asio::ssl;
using tcp = net::ip::tcp;

ListenSpec parse_listen(const std::string& text) {
  auto bad = [&](const std::string& why) {
    return Error(Errc::invalid_argument, "--listen " + text + ": " + why + " (want HOST:PORT)",
                 "listen");
  };
  auto colon = text.rfind(':');
  if (colon == std::string::npos) throw bad("no port");
  std::string host = text.substr(0, colon), port_text = text.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  else if (host.find(':') != std::string::npos)
    throw bad("an IPv6 address must be in brackets, e.g. [::1]:8080");
  unsigned port = 0;
  auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (port_text.empty() || ec != std::errc() || end != port_text.data() + port_text.size() ||
      port > 65535)
    throw bad("port must be 0..65535");
  ListenSpec spec;
  spec.text = text;
  if (host.empty()) host = "0.0.0.0";
  boost::system::error_code aec;
  auto addr = net::ip::make_address(host, aec);
  if (!aec) {
    spec.endpoints.emplace_back(addr, static_cast<uint16_t>(port));
  } else {
    // A name: every address it resolves to is listened on.
    net::io_context io;
    tcp::resolver r(io);
    auto results = r.resolve(host, port_text, tcp::resolver::passive, aec);
    if (aec || results.empty()) throw bad("cannot resolve " + host);
    for (const auto& e : results) spec.endpoints.push_back(e.endpoint());
  }
  spec.loopback = true;
  for (const auto& e : spec.endpoints)
    if (!e.address().is_loopback()) spec.loopback = false;
  return spec;
}

void check_listen(const ListenSpec& spec, bool tls) {
  if (!spec.loopback && !tls)
    throw Error(Errc::invalid_argument,
                "--listen " + spec.text +
                    " is not a loopback address: serving it needs TLS (--tls-cert and "
                    "--tls-key); plain HTTP is only allowed on 127.0.0.0/8 and ::1",
                "listen");
}

namespace {
std::string openssl_reason() {
  unsigned long e = ERR_get_error();
  char buf[256] = "unknown error";
  if (e) ERR_error_string_n(e, buf, sizeof buf);
  ERR_clear_error();
  return buf;
}
}  // namespace

std::shared_ptr<ssl::context> make_tls_context(const std::string& cert_file,
                                               const std::string& key_file) {
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_server);
  SSL_CTX* c = ctx->native_handle();
  SSL_CTX_set_min_proto_version(c, TLS1_2_VERSION);
  SSL_CTX_set_options(c, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
  ERR_clear_error();
  if (SSL_CTX_use_certificate_chain_file(c, cert_file.c_str()) != 1)
    throw Error(Errc::invalid_argument,
                "--tls-cert " + cert_file + ": cannot load a PEM certificate: " + openssl_reason(),
                "tls-cert");
  if (SSL_CTX_use_PrivateKey_file(c, key_file.c_str(), SSL_FILETYPE_PEM) != 1)
    throw Error(Errc::invalid_argument,
                "--tls-key " + key_file + ": cannot load a PEM private key: " + openssl_reason(),
                "tls-key");
  if (SSL_CTX_check_private_key(c) != 1)
    throw Error(Errc::invalid_argument,
                "--tls-key " + key_file + " does not match the certificate in " + cert_file,
                "tls-key");
  return ctx;
}

namespace {
// The accepted socket's fd moved onto `io` (the protocol read before the
// release: the order of a call's arguments is unspecified).
tcp::socket adopt(net::io_context& io, tcp::socket& accepted) {
  auto protocol = accepted.local_endpoint().protocol();
  return tcp::socket(io, protocol, accepted.release());
}
}  // namespace

TlsStream::TlsStream(tcp::socket&& accepted, ssl::context& ctx) : ssl_(adopt(io_, accepted), ctx) {
  network = true;
  tls = true;
}

bool TlsStream::handshake(Activity& activity) {
  // Watched like a read: a client that connects and says nothing is cut by
  // the idle timeout like any other.
  activity.reading = true;
  activity.op_since_ms = steady_ms();
  boost::system::error_code ec;
  ssl_.handshake(ssl::stream_base::server, ec);
  activity.op_since_ms = 0;
  if (ec) spdlog::debug("TLS handshake with {} failed: {}", peer, ec.message());
  return !ec;
}

size_t TlsStream::read_some(net::mutable_buffer b, boost::system::error_code& ec) {
  size_t n = ssl_.read_some(b, ec);
  // A peer that closes without close_notify: an ordinary end of stream for
  // HTTP (every message has its own length).
  if (ec == ssl::error::stream_truncated) ec = net::error::eof;
  return n;
}

size_t TlsStream::write_some(std::span<const net::const_buffer> b, boost::system::error_code& ec) {
  // ssl::stream writes only the first buffer of a sequence: join small ones
  // into one record instead of a record per chunk header.
  size_t total = 0;
  for (const auto& x : b) total += x.size();
  if (b.size() <= 1 || b.front().size() >= 16384)
    return b.empty() ? 0 : ssl_.write_some(b.front(), ec);
  std::string joined(std::min<size_t>(total, 16384), '\0');
  size_t n = net::buffer_copy(net::buffer(joined), b);
  return ssl_.write_some(net::buffer(joined.data(), n), ec);
}

void TlsStream::shutdown() {
  boost::system::error_code ignored;
  ssl_.lowest_layer().shutdown(tcp::socket::shutdown_both, ignored);
}

void TlsStream::finish() {
  // One close_notify, without waiting for the peer's (it may never come).
  SSL_shutdown(ssl_.native_handle());
  shutdown();
}

}  // namespace airlock::daemon

// airlockd's TCP listeners (internal to airlockd): `--listen HOST:PORT`,
// plain HTTP only on a loopback address, TLS (OpenSSL through Asio's
// ssl::stream) required on any other; and the TLS connection as a Stream.
//
//   ListenSpec l = parse_listen("0.0.0.0:8443");      // Error naming --listen
//   check_listen(l, tls_configured);                  // non-loopback without TLS: refused
//   auto ctx = make_tls_context("cert.pem", "key.pem");
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <memory>
#include <string>
#include <vector>

#include "daemon/connection.h"

namespace airlock::daemon {

struct ListenSpec {
  std::string text;                                       // as given, for messages
  std::vector<boost::asio::ip::tcp::endpoint> endpoints;  // what HOST resolved to
  bool loopback = false;                                  // every endpoint is loopback
};

// "127.0.0.1:8080", "[::1]:8080", "localhost:8080", "0.0.0.0:8443", ":8443"
// (= every address). Throws Error(invalid_argument, field "listen") for a
// malformed spec, a bad port or a host that does not resolve.
ListenSpec parse_listen(const std::string& text);

// Plain HTTP is for loopback only: anyone on the network could read the
// tokens. Throws Error(invalid_argument, "listen") otherwise.
void check_listen(const ListenSpec& spec, bool tls);

// A server context from PEM files (the certificate file may hold the chain).
// TLS 1.2 at least. Throws Error(invalid_argument, field "tls-cert"/"tls-key")
// naming the file and OpenSSL's reason.
std::shared_ptr<boost::asio::ssl::context> make_tls_context(const std::string& cert_file,
                                                            const std::string& key_file);

// A TLS connection. It has an io_context of its own (idle for the sync
// HTTP exchanges), so that the pty route can run its WebSocket's
// asynchronous operations over the same TLS session.
class TlsStream final : public Stream {
 public:
  using Ssl = boost::asio::ssl::stream<boost::asio::ip::tcp::socket>;
  // Takes over the accepted socket's fd.
  TlsStream(boost::asio::ip::tcp::socket&& accepted, boost::asio::ssl::context& ctx);
  // The server side of the handshake; false (and logged at debug) if it failed.
  bool handshake(Activity& activity);

  size_t read_some(boost::asio::mutable_buffer b, boost::system::error_code& ec) override;
  size_t write_some(std::span<const boost::asio::const_buffer> b,
                    boost::system::error_code& ec) override;
  void shutdown() override;
  void finish() override;
  int native_handle() override { return ssl_.lowest_layer().native_handle(); }

  boost::asio::io_context& io() { return io_; }
  Ssl& ssl() { return ssl_; }

 private:
  boost::asio::io_context io_;
  Ssl ssl_;
};

}  // namespace airlock::daemon

// One HTTP request/response exchange on a connection (internal to airlockd).
// Wraps Beast's sync API: body reading with limits (JSON strings or streamed
// chunks), JSON/error responses, and chunked streaming responses.
#pragma once

#include <boost/asio/local/stream_protocol.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <cstdint>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "common/error.h"
#include "daemon/connection.h"

namespace airlock::daemon {

namespace http = boost::beast::http;
using RequestParser = http::request_parser<http::buffer_body>;

class Exchange {
 public:
  Exchange(WatchedSocket& socket, boost::beast::flat_buffer& buffer, RequestParser& parser);

  const http::request<http::buffer_body>& request() const { return parser_.get(); }
  std::string_view method() const { return method_; }
  std::string_view path() const { return path_; }
  std::string_view query() const { return query_; }
  // Declared Content-Length, if any (a chunked body has none).
  std::optional<uint64_t> content_length() const {
    auto len = parser_.content_length();
    return len ? std::optional<uint64_t>(*len) : std::nullopt;
  }

  // Whole body as a string; Error(payload_too_large) above `limit`.
  std::string read_body(uint64_t limit);
  // Reads the rest of the body and drops it (the server caps uploads at
  // kMaxUploadBody), so a refused upload's client reads the answer rather
  // than a broken pipe.
  void discard_body();
  // Next piece of the body (up to `max` bytes, fewer only at the end);
  // std::nullopt once the body is complete.
  std::optional<std::string> read_chunk(size_t max);
  // Like read_chunk, but returns as soon as some body bytes arrived (1..max),
  // without waiting for `max` of them: for input a person types.
  std::optional<std::string> read_some(size_t max);

  // `header` (if not empty): one extra response header, e.g. a pagination
  // token (the E2B list's x-next-token).
  void send_json(int status, const nlohmann::json& body, std::string_view header = {},
                 std::string_view value = {});
  void send_empty(int status);
  // A non-JSON body (GET /metrics: the Prometheus text format).
  void send_text(int status, std::string_view content_type, std::string body);
  void send_error(const Error& error);
  void send_error(int status, std::string_view code, std::string_view message,
                  std::string_view allow = {});

  // Chunked streaming response. write_chunk returns false once the client
  // is gone. All three are serialized by an internal mutex, so engine
  // callbacks on other threads may call them.
  void begin_stream(std::string_view content_type);
  bool write_chunk(std::string_view data);
  void end_stream();
  // Abandons a stream mid-way: the connection is closed without the
  // terminating chunk.
  void abort_stream();
  bool streaming() const { return streaming_; }
  // A stream began and was neither ended nor aborted: its client is still
  // waiting for the terminating chunk.
  bool stream_open() const { return streaming_ && !stream_done_; }
  // The connection was handed to another protocol (a WebSocket, pty.h):
  // the exchange counts as answered with 101 and the connection is not
  // reused for HTTP afterwards.
  void mark_upgraded() {
    status_ = 101;
    close_ = true;
    answering();
  }

  // Runs `hook` once with the status, just before the first byte of the
  // answer leaves: a record of the call (E2B's audit) is then on disk before
  // the caller can see the answer. Pass nullptr to drop a hook unused.
  void before_answer(std::function<void(int status)> hook) { before_answer_ = std::move(hook); }

  // Whether the connection may carry another request afterwards.
  bool keep_alive() const;
  int status() const { return status_; }
  bool responded() const { return status_ != 0; }
  int native_handle() { return socket_.stream().native_handle(); }
  // The connection's stream (the pty route takes it over for a WebSocket).
  Stream& stream() { return socket_.stream(); }

 private:
  void continue_100();
  void answering();
  std::optional<std::string> read_body_bytes(size_t max, bool some);
  template <class Response>
  void write(Response& res);

  WatchedSocket& socket_;
  boost::beast::flat_buffer& buffer_;
  RequestParser& parser_;
  std::string method_, path_, query_;
  int status_ = 0;
  bool close_ = false;  // set when the connection cannot be reused
  bool continued_ = false;
  bool streaming_ = false;
  bool stream_done_ = false;  // end_stream() or abort_stream() ran
  std::mutex write_mu_;
  std::function<void(int)> before_answer_;
};

// {"error": {"code", "message", "field"?}}
nlohmann::json error_body(std::string_view code, std::string_view message,
                          std::string_view field = {});

}  // namespace airlock::daemon

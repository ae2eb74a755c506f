#include "daemon/exchange.h"

#include <boost/asio/write.hpp>
#include <vector>

namespace airlock::daemon {

namespace net = boost::asio;
namespace beast = boost::beast;

nlohmann::json error_body(std::string_view code, std::string_view message, std::string_view field) {
  nlohmann::json e = {{"code", code}, {"message", message}};
  if (!field.empty()) e["field"] = field;
  return {{"error", e}};
}

Exchange::Exchange(WatchedSocket& socket, beast::flat_buffer& buffer, RequestParser& parser)
    : socket_(socket), buffer_(buffer), parser_(parser) {
  method_ = std::string(parser_.get().method_string());
  auto t = parser_.get().target();
  std::string_view target(t.data(), t.size());
  auto q = target.find('?');
  path_ = std::string(target.substr(0, q));
  if (q != std::string_view::npos) query_ = std::string(target.substr(q + 1));
}

void Exchange::continue_100() {
  // curl and others wait for this before sending a large body.
  if (continued_) return;
  continued_ = true;
  auto expect = parser_.get()[http::field::expect];
  if (beast::iequals(expect, "100-continue")) {
    beast::error_code ec;
    net::write(socket_, net::buffer(std::string_view("HTTP/1.1 100 Continue\r\n\r\n")), ec);
  }
}

std::optional<std::string> Exchange::read_chunk(size_t max) { return read_body_bytes(max, false); }

std::optional<std::string> Exchange::read_some(size_t max) { return read_body_bytes(max, true); }

std::optional<std::string> Exchange::read_body_bytes(size_t max, bool some) {
  if (parser_.is_done()) return std::nullopt;
  continue_100();
  std::string out(max, '\0');
  size_t filled = 0;
  while (filled < max && !parser_.is_done() && !(some && filled > 0)) {
    parser_.get().body().data = out.data() + filled;
    parser_.get().body().size = max - filled;
    beast::error_code ec;
    // read_some returns after what one socket read brought (perhaps only a
    // chunk header); read() waits for the buffer to fill or the body to end.
    if (some)
      http::read_some(socket_, buffer_, parser_, ec);
    else
      http::read(socket_, buffer_, parser_, ec);
    filled = max - parser_.get().body().size;
    if (ec == http::error::need_buffer) continue;
    if (ec == http::error::body_limit) {
      close_ = true;
      throw Error(Errc::payload_too_large, "request body is too large", "body");
    }
    if (ec) {
      close_ = true;
      if (socket_.activity().timed_out)
        throw Error(Errc::timeout, "the request body stalled past the idle timeout", "body");
      throw Error(Errc::invalid_argument, "reading the request body failed: " + ec.message(),
                  "body");
    }
  }
  out.resize(filled);
  if (filled == 0 && parser_.is_done()) return std::nullopt;
  return out;
}

void Exchange::discard_body() {
  while (read_chunk(1 << 20)) {
  }
}

std::string Exchange::read_body(uint64_t limit) {
  if (auto len = parser_.content_length(); len && *len > limit) {
    close_ = true;  // the unread body makes the connection unusable
    throw Error(Errc::payload_too_large,
                "request body of " + std::to_string(*len) + " bytes is over the limit of " +
                    std::to_string(limit),
                "body");
  }
  std::string body;
  while (auto chunk = read_chunk(64 * 1024)) {
    body += *chunk;
    if (body.size() > limit) {
      close_ = true;
      throw Error(Errc::payload_too_large,
                  "request body is over the limit of " + std::to_string(limit) + " bytes", "body");
    }
  }
  return body;
}

bool Exchange::keep_alive() const {
  return !close_ && parser_.is_done() && parser_.get().keep_alive();
}

void Exchange::answering() {
  if (!before_answer_) return;
  auto hook = std::move(before_answer_);
  before_answer_ = nullptr;
  hook(status_);
}

template <class Response>
void Exchange::write(Response& res) {
  answering();
  res.keep_alive(keep_alive());
  res.set(http::field::server, "airlockd/" AIRLOCK_VERSION);
  res.prepare_payload();
  beast::error_code ec;
  http::write(socket_, res, ec);
  if (ec) close_ = true;
}

void Exchange::send_json(int status, const nlohmann::json& body, std::string_view header,
                         std::string_view value) {
  status_ = status;
  http::response<http::string_body> res{static_cast<http::status>(status), 11};
  res.set(http::field::content_type, "application/json");
  if (!header.empty()) res.set(std::string(header), std::string(value));
  res.body() = body.dump() + "\n";
  write(res);
}

void Exchange::send_text(int status, std::string_view content_type, std::string body) {
  status_ = status;
  http::response<http::string_body> res{static_cast<http::status>(status), 11};
  res.set(http::field::content_type, std::string(content_type));
  res.body() = std::move(body);
  write(res);
}

void Exchange::send_empty(int status) {
  status_ = status;
  http::response<http::empty_body> res{static_cast<http::status>(status), 11};
  write(res);
}

void Exchange::send_error(const Error& error) {
  status_ = http_status(error.code());
  http::response<http::string_body> res{static_cast<http::status>(status_), 11};
  res.set(http::field::content_type, "application/json");
  res.body() = error_body(to_string(error.code()), error.what(), error.field()).dump() + "\n";
  write(res);
}

void Exchange::send_error(int status, std::string_view code, std::string_view message,
                          std::string_view allow) {
  status_ = status;
  http::response<http::string_body> res{static_cast<http::status>(status), 11};
  res.set(http::field::content_type, "application/json");
  if (!allow.empty()) res.set(http::field::allow, beast::string_view(allow.data(), allow.size()));
  res.body() = error_body(code, message).dump() + "\n";
  write(res);
}

void Exchange::begin_stream(std::string_view content_type) {
  std::lock_guard lock(write_mu_);
  if (streaming_) return;  // one response head per exchange, whoever asks twice
  status_ = 200;
  streaming_ = true;
  answering();
  http::response<http::empty_body> res{http::status::ok, 11};
  res.set(http::field::content_type, beast::string_view(content_type.data(), content_type.size()));
  res.set(http::field::server, "airlockd/" AIRLOCK_VERSION);
  res.set(http::field::cache_control, "no-store");
  res.keep_alive(keep_alive());
  res.chunked(true);
  http::response_serializer<http::empty_body> sr{res};
  beast::error_code ec;
  http::write_header(socket_, sr, ec);
  if (ec) close_ = true;
}

bool Exchange::write_chunk(std::string_view data) {
  std::lock_guard lock(write_mu_);
  if (close_) return false;
  if (data.empty()) return true;  // an empty chunk would end the stream
  beast::error_code ec;
  net::write(socket_, http::make_chunk(net::const_buffer(data.data(), data.size())), ec);
  if (ec) close_ = true;
  return !ec;
}

void Exchange::end_stream() {
  std::lock_guard lock(write_mu_);
  stream_done_ = true;
  if (close_) return;
  beast::error_code ec;
  net::write(socket_, http::make_chunk_last(), ec);
  if (ec) close_ = true;
}

void Exchange::abort_stream() {
  std::lock_guard lock(write_mu_);
  stream_done_ = true;
  close_ = true;
  socket_.stream().shutdown();
}

}  // namespace airlock::daemon

// The Connect protocol (connectrpc.com/docs/protocol), JSON codec only, as
// E2B's SDK speaks it to envd (connect-es with useBinaryFormat: false):
//
//   unary:          POST /pkg.Service/Method, Content-Type application/json,
//                   body = one JSON message; the answer is 200 + a JSON
//                   message, or the Connect error JSON {"code", "message"}
//                   with the HTTP status of its code (http_status()).
//   server stream:  POST, Content-Type application/connect+json, body = one
//                   enveloped message; the answer is always 200 with
//                   enveloped messages, the last one flagged end-of-stream
//                   (0x02) carrying {} or {"error": {"code", "message"}}.
//
// An envelope is 1 flag byte (0x01 compressed, 0x02 end of stream), a 4-byte
// big-endian length and that many bytes. Compression is never negotiated
// here, so a compressed request envelope is refused. Pure functions, no I/O:
// unit-tested in connect_test.cc, served by envd.cc.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>

#include "common/error.h"

namespace airlock::e2b::connect {

enum class Code {
  canceled,
  unknown,
  invalid_argument,
  deadline_exceeded,
  not_found,
  already_exists,
  permission_denied,
  resource_exhausted,
  failed_precondition,
  aborted,
  out_of_range,
  unimplemented,
  internal,
  unavailable,
  data_loss,
  unauthenticated,
};

std::string_view code_name(Code code);  // "not_found"
int http_status(Code code);             // Connect's mapping for unary errors: 404

// An error to answer a call with (thrown by handlers, or built from an
// airlock::Error by from_error()).
class RpcError : public std::runtime_error {
 public:
  RpcError(Code code, const std::string& message) : std::runtime_error(message), code_(code) {}
  Code code() const { return code_; }

 private:
  Code code_;
};

// airlock's error codes as Connect codes (not_found -> not_found,
// conflict -> failed_precondition, timeout -> deadline_exceeded, ...).
RpcError from_error(const Error& error);

// {"code": "not_found", "message": "..."}: the unary error body and the
// "error" member of an end-of-stream message.
nlohmann::json error_json(const RpcError& error);

// The largest message accepted in a request (after the envelope header).
inline constexpr size_t kMaxRequestMessage = 4u << 20;

inline constexpr uint8_t kFlagCompressed = 0x01;
inline constexpr uint8_t kFlagEndStream = 0x02;

std::string envelope(uint8_t flags, std::string_view payload);
// A message of a server stream.
std::string message_envelope(const nlohmann::json& message);
// The end-of-stream envelope: {} on success, {"error": ...} otherwise.
std::string end_stream_envelope(const RpcError* error);

// The request message of a server-streaming call: exactly one uncompressed
// envelope holding a JSON object of at most `max` bytes. RpcError
// invalid_argument naming what is wrong otherwise (short header, length
// beyond the body or beyond `max`, trailing bytes, compression, bad JSON).
// A body longer than `max` + 5 must be refused before reading it all.
nlohmann::json parse_stream_request(std::string_view body, size_t max = kMaxRequestMessage);
// The request message of a unary call: a JSON object (an empty body is {}).
nlohmann::json parse_unary_request(std::string_view body);

// Protobuf JSON helpers for the messages' fields.
// bytes fields are base64 (standard or URL-safe, padding optional).
std::string decode_bytes(const nlohmann::json& value, std::string_view field);
std::string encode_bytes(std::string_view bytes);
// A uint32 field: a JSON number or a decimal string (proto3 JSON allows both).
uint32_t get_uint32(const nlohmann::json& msg, std::string_view field, uint32_t fallback = 0);

}  // namespace airlock::e2b::connect

#include "e2b/connect.h"

#include "daemon/base64.h"

namespace airlock::e2b::connect {

using nlohmann::json;

std::string_view code_name(Code code) {
  switch (code) {
    case Code::canceled:
      return "canceled";
    case Code::unknown:
      return "unknown";
    case Code::invalid_argument:
      return "invalid_argument";
    case Code::deadline_exceeded:
      return "deadline_exceeded";
    case Code::not_found:
      return "not_found";
    case Code::already_exists:
      return "already_exists";
    case Code::permission_denied:
      return "permission_denied";
    case Code::resource_exhausted:
      return "resource_exhausted";
    case Code::failed_precondition:
      return "failed_precondition";
    case Code::aborted:
      return "aborted";
    case Code::out_of_range:
      return "out_of_range";
    case Code::unimplemented:
      return "unimplemented";
    case Code::internal:
      return "internal";
    case Code::unavailable:
      return "unavailable";
    case Code::data_loss:
      return "data_loss";
    case Code::unauthenticated:
      return "unauthenticated";
  }
  return "unknown";
}

// The table of the Connect protocol specification ("Error Codes").
int http_status(Code code) {
  switch (code) {
    case Code::canceled:
      return 499;
    case Code::invalid_argument:
      return 400;
    case Code::deadline_exceeded:
      return 504;
    case Code::not_found:
      return 404;
    case Code::already_exists:
      return 409;
    case Code::permission_denied:
      return 403;
    case Code::resource_exhausted:
      return 429;
    case Code::failed_precondition:
      return 400;
    case Code::aborted:
      return 409;
    case Code::out_of_range:
      return 400;
    case Code::unimplemented:
      return 501;
    case Code::unavailable:
      return 503;
    case Code::unauthenticated:
      return 401;
    case Code::unknown:
    case Code::internal:
    case Code::data_loss:
      return 500;
  }
  return 500;
}

RpcError from_error(const Error& error) {
  Code c = Code::internal;
  switch (error.code()) {
    case Errc::invalid_argument:
      c = Code::invalid_argument;
      break;
    case Errc::not_found:
      c = Code::not_found;
      break;
    case Errc::conflict:
      c = Code::failed_precondition;
      break;
    case Errc::payload_too_large:
      c = Code::resource_exhausted;
      break;
    case Errc::timeout:
      c = Code::deadline_exceeded;
      break;
    case Errc::unavailable:
      c = Code::unavailable;
      break;
    case Errc::guest_error:
    case Errc::protocol_error:
    case Errc::internal:
      c = Code::internal;
      break;
    case Errc::unauthenticated:
      c = Code::unauthenticated;
      break;
    case Errc::quota_exceeded:
    case Errc::rate_limited:
      c = Code::resource_exhausted;
      break;
  }
  return RpcError(c, error.what());
}

json error_json(const RpcError& error) {
  return {{"code", code_name(error.code())}, {"message", error.what()}};
}

std::string envelope(uint8_t flags, std::string_view payload) {
  std::string out;
  out.reserve(5 + payload.size());
  uint32_t n = static_cast<uint32_t>(payload.size());
  out.push_back(static_cast<char>(flags));
  out.push_back(static_cast<char>(n >> 24));
  out.push_back(static_cast<char>(n >> 16));
  out.push_back(static_cast<char>(n >> 8));
  out.push_back(static_cast<char>(n));
  out.append(payload);
  return out;
}

std::string message_envelope(const json& message) { return envelope(0, message.dump()); }

std::string end_stream_envelope(const RpcError* error) {
  json end = json::object();
  if (error) end["error"] = error_json(*error);
  return envelope(kFlagEndStream, end.dump());
}

static json parse_object(std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw RpcError(Code::invalid_argument, "request message is not valid JSON");
  if (!j.is_object())
    throw RpcError(Code::invalid_argument, "request message is not a JSON object");
  return j;
}

json parse_stream_request(std::string_view body, size_t max) {
  if (body.size() < 5)
    throw RpcError(Code::invalid_argument,
                   "request is not a Connect envelope: " + std::to_string(body.size()) +
                       " bytes, the header alone is 5");
  auto b = [&](size_t i) { return static_cast<uint32_t>(static_cast<uint8_t>(body[i])); };
  uint8_t flags = static_cast<uint8_t>(b(0));
  uint32_t len = (b(1) << 24) | (b(2) << 16) | (b(3) << 8) | b(4);
  if (flags & kFlagCompressed)
    throw RpcError(Code::invalid_argument,
                   "compressed request message, but no Connect-Content-Encoding was agreed");
  if (flags != 0)
    throw RpcError(Code::invalid_argument,
                   "request envelope has flags " + std::to_string(flags) + ", want 0");
  if (len > max)
    throw RpcError(Code::resource_exhausted, "request message of " + std::to_string(len) +
                                                 " bytes exceeds the limit of " +
                                                 std::to_string(max));
  if (body.size() - 5 < len)
    throw RpcError(Code::invalid_argument, "request envelope announces " + std::to_string(len) +
                                               " bytes but carries " +
                                               std::to_string(body.size() - 5));
  if (body.size() - 5 > len)
    throw RpcError(Code::invalid_argument,
                   "more than one request message on a server-streaming call");
  return parse_object(body.substr(5, len));
}

json parse_unary_request(std::string_view body) {
  if (body.empty()) return json::object();
  return parse_object(body);
}

std::string decode_bytes(const json& value, std::string_view field) {
  if (!value.is_string())
    throw RpcError(Code::invalid_argument, std::string(field) + " must be base64 bytes");
  std::string s = value.get<std::string>();
  for (char& c : s) {
    if (c == '-') c = '+';
    if (c == '_') c = '/';
  }
  while (s.size() % 4) s.push_back('=');
  auto out = daemon::base64_decode(s);
  if (!out) throw RpcError(Code::invalid_argument, std::string(field) + " is not valid base64");
  return *out;
}

std::string encode_bytes(std::string_view bytes) { return daemon::base64_encode(bytes); }

uint32_t get_uint32(const json& msg, std::string_view field, uint32_t fallback) {
  auto it = msg.find(std::string(field));
  if (it == msg.end() || it->is_null()) return fallback;
  if (it->is_number_integer() && it->get<int64_t>() >= 0 && it->get<int64_t>() <= UINT32_MAX)
    return static_cast<uint32_t>(it->get<int64_t>());
  if (it->is_string()) {
    const std::string& s = it->get_ref<const std::string&>();
    if (!s.empty() && s.size() <= 10 && s.find_first_not_of("0123456789") == std::string::npos) {
      uint64_t v = std::stoull(s);
      if (v <= UINT32_MAX) return static_cast<uint32_t>(v);
    }
  }
  throw RpcError(Code::invalid_argument,
                 std::string(field) + " must be an unsigned 32-bit integer");
}

}  // namespace airlock::e2b::connect

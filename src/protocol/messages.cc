#include "protocol/messages.h"

#include <cerrno>
#include <climits>
#include <cmath>

namespace airlock::protocol {

using nlohmann::json;

const char* code_for_errno(int err) {
  switch (err) {
    case ENOENT:
      return code::not_found;
    case EACCES:
    case EPERM:
    case EROFS:
      return code::permission_denied;
    case EEXIST:
      return code::exists;
    case ENOTDIR:
      return code::not_a_directory;
    case EISDIR:
      return code::is_a_directory;
    case ENOTEMPTY:
      return code::not_empty;
    case ENOSPC:
    case EDQUOT:
      return code::no_space;
    case EINVAL:
    case ENAMETOOLONG:
    case ELOOP:
      return code::invalid_argument;
    default:
      return code::io_error;
  }
}

Errc errc_from_guest_code(std::string_view c) {
  if (c == code::invalid_argument || c == code::permission_denied || c == code::not_a_directory ||
      c == code::is_a_directory)
    return Errc::invalid_argument;
  if (c == code::not_found) return Errc::not_found;
  if (c == code::exists || c == code::not_empty) return Errc::conflict;
  if (c == code::no_space) return Errc::unavailable;
  if (c == code::protocol_error) return Errc::protocol_error;
  return Errc::guest_error;
}

json error_json(std::string_view c, std::string_view message) {
  return json{{"error", {{"code", std::string(c)}, {"message", std::string(message)}}}};
}

bool is_error(const json& response) { return response.is_object() && response.contains("error"); }

void throw_if_error(const json& response) {
  if (!is_error(response)) return;
  const json& e = response["error"];
  std::string c = code::internal, message = "guest reported an error without a message";
  if (e.is_object()) {
    if (e.contains("code") && e["code"].is_string()) c = e["code"].get<std::string>();
    if (e.contains("message") && e["message"].is_string())
      message = e["message"].get<std::string>();
  }
  throw Error(errc_from_guest_code(c), "guest: " + message);
}

Frame json_frame(Type type, uint32_t stream, const json& body) {
  Frame f;
  f.type = type;
  f.stream = stream;
  // Replace invalid UTF-8 (e.g. a file name with odd bytes) instead of throwing.
  f.payload = body.dump(-1, ' ', false, json::error_handler_t::replace);
  if (f.payload.size() > kMaxPayload)
    throw Error(Errc::protocol_error, "JSON message of " + std::to_string(f.payload.size()) +
                                          " bytes exceeds the frame maximum of " +
                                          std::to_string(kMaxPayload));
  return f;
}

bool json_too_deep(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;  // the escaped character cannot end the string
      else if (c == '"')
        in_string = false;
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        break;
      case '[':
      case '{':
        if (++depth > max_depth) return true;
        break;
      case ']':
      case '}':
        --depth;
        break;
      default:
        break;
    }
  }
  return false;
}

json parse_json(const Frame& frame) {
  const std::string where = " (frame type " + std::to_string(static_cast<int>(frame.type)) +
                            ", stream " + std::to_string(frame.stream) + ")";
  // The decoder already bounds payloads; this keeps the helper safe for
  // frames built any other way.
  if (frame.payload.size() > kMaxPayload)
    throw Error(Errc::protocol_error, "payload of " + std::to_string(frame.payload.size()) +
                                          " bytes exceeds the frame maximum of " +
                                          std::to_string(kMaxPayload) + where);
  if (json_too_deep(frame.payload))
    throw Error(Errc::protocol_error,
                "payload nests deeper than " + std::to_string(kMaxJsonDepth) + " levels" + where);
  json j = json::parse(frame.payload, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw Error(Errc::protocol_error, "payload is not valid JSON" + where);
  if (!j.is_object()) throw Error(Errc::protocol_error, "payload is not a JSON object" + where);
  return j;
}

std::string require_string(const json& j, const char* field) {
  auto v = optional_string(j, field);
  if (!v) throw Error(Errc::invalid_argument, std::string(field) + " is required", field);
  return *v;
}

std::optional<std::string> optional_string(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_string())
    throw Error(Errc::invalid_argument, std::string(field) + " must be a string", field);
  return it->get<std::string>();
}

bool optional_bool(const json& j, const char* field, bool fallback) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean())
    throw Error(Errc::invalid_argument, std::string(field) + " must be a boolean", field);
  return it->get<bool>();
}

int64_t optional_int(const json& j, const char* field, int64_t fallback, int64_t min, int64_t max) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return fallback;
  int64_t v = 0;
  if (it->is_number_integer()) {
    if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      v = INT64_MAX;
    else
      v = it->get<int64_t>();
  } else if (it->is_number_float()) {
    double d = it->get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || d < -9.2e18 || d > 9.2e18)
      throw Error(Errc::invalid_argument, std::string(field) + " must be an integer", field);
    v = static_cast<int64_t>(d);
  } else {
    throw Error(Errc::invalid_argument, std::string(field) + " must be an integer", field);
  }
  if (v < min || v > max)
    throw Error(Errc::invalid_argument,
                std::string(field) + " must be between " + std::to_string(min) + " and " +
                    std::to_string(max),
                field);
  return v;
}

std::string to_hex(std::string_view bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

std::string from_hex(std::string_view hex) {
  if (hex.size() % 2) throw Error(Errc::invalid_argument, "hex string has an odd number of digits");
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    throw Error(Errc::invalid_argument, std::string("invalid hex digit '") + c + "'");
  };
  std::string out;
  out.reserve(hex.size() / 2);
  for (size_t i = 0; i < hex.size(); i += 2)
    out.push_back(static_cast<char>(digit(hex[i]) << 4 | digit(hex[i + 1])));
  return out;
}

}  // namespace airlock::protocol

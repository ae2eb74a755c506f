#include "common/error.h"

#include <cerrno>
#include <cstring>

namespace airlock {

std::string_view to_string(Errc code) {
  switch (code) {
    case Errc::invalid_argument:
      return "invalid_argument";
    case Errc::not_found:
      return "not_found";
    case Errc::conflict:
      return "conflict";
    case Errc::payload_too_large:
      return "payload_too_large";
    case Errc::timeout:
      return "timeout";
    case Errc::unavailable:
      return "unavailable";
    case Errc::guest_error:
      return "guest_error";
    case Errc::protocol_error:
      return "protocol_error";
    case Errc::internal:
      return "internal";
    case Errc::unauthenticated:
      return "unauthenticated";
    case Errc::quota_exceeded:
      return "quota_exceeded";
    case Errc::rate_limited:
      return "rate_limited";
  }
  return "internal";
}

int http_status(Errc code) {
  switch (code) {
    case Errc::invalid_argument:
      return 400;
    case Errc::not_found:
      return 404;
    case Errc::conflict:
      return 409;
    case Errc::payload_too_large:
      return 413;
    case Errc::timeout:
      return 504;
    case Errc::unavailable:
      return 503;
    case Errc::guest_error:
      return 502;
    case Errc::protocol_error:
      return 502;
    case Errc::internal:
      return 500;
    case Errc::unauthenticated:
      return 401;
    case Errc::quota_exceeded:
      return 429;
    case Errc::rate_limited:
      return 429;
  }
  return 500;
}

void throw_errno(const std::string& what) {
  throw Error(Errc::internal, what + ": " + std::strerror(errno));
}

}  // namespace airlock

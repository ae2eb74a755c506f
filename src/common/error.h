// One error style for all of airlock: throw airlock::Error.
//
// An Error carries a machine-readable code, a human message that names what
// was wrong, and (for caller mistakes) the offending field. The daemon turns
// it into {"error": {"code", "message", "field"}} with the HTTP status from
// http_status(); the CLI prints the message and exits non-zero.
//
//   if (spec.memory_mb < 64)
//     throw Error(Errc::invalid_argument, "memory_mb must be at least 64", "memory_mb");
//
// Crash (abort) only on the impossible; everything untrusted input (API
// callers, the guest) can cause is an Error.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace airlock {

enum class Errc {
  invalid_argument,   // 400: the caller sent something malformed or out of range
  not_found,          // 404: no such sandbox, image, file
  conflict,           // 409: the action does not fit the sandbox's current state
  payload_too_large,  // 413
  timeout,            // 504: a deadline passed (boot, exec, guest reply)
  unavailable,        // 503: a resource is missing or exhausted (e.g. image not built)
  guest_error,        // 502: the guest agent failed or broke the protocol
  protocol_error,     // malformed frame or message on the guest channel
  internal,           // 500: airlock's own bug or host failure
  unauthenticated,    // 401: no valid credential (never says which part failed)
  quota_exceeded,     // 429: a tenant's quota (max_sandboxes, max_memory_mb, ...) is reached
  rate_limited,       // 429: too many requests of a kind (auth failures, creates per minute)
};

std::string_view to_string(Errc code);
int http_status(Errc code);

class Error : public std::runtime_error {
 public:
  Error(Errc code, const std::string& message, std::string field = {})
      : std::runtime_error(message), code_(code), field_(std::move(field)) {}

  Errc code() const { return code_; }
  // The request field the error is about, or empty.
  const std::string& field() const { return field_; }

 private:
  Errc code_;
  std::string field_;
};

// Throws Error(internal) naming `what` and strerror(errno). For syscalls.
[[noreturn]] void throw_errno(const std::string& what);

}  // namespace airlock

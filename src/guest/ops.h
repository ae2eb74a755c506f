// The operations of api/guest-protocol.md §5, as the server dispatches them.
// Streaming operations return a Stream; the others return their response.
// Failures throw GuestError (a protocol error code + message) or
// airlock::Error (invalid_argument from the field accessors).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "guest/server.h"

namespace airlock::guest {

class GuestError : public std::runtime_error {
 public:
  GuestError(const char* code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  const char* code() const { return code_; }

 private:
  const char* code_;
};

// Throws GuestError(code_for_errno(errno), what + ": " + strerror(errno)).
[[noreturn]] void throw_sys(const std::string& what);

// Request path field: required, absolute, no NUL. Throws invalid_argument.
std::string require_path(const nlohmann::json& req);

// exec.cc
std::unique_ptr<Stream> start_exec(Server& server, uint32_t id, const nlohmann::json& req);
// files.cc
std::unique_ptr<Stream> start_write_file(Server& server, uint32_t id, const nlohmann::json& req);
std::unique_ptr<Stream> start_read_file(Server& server, uint32_t id, const nlohmann::json& req);
nlohmann::json op_list(const nlohmann::json& req);
nlohmann::json op_stat(const nlohmann::json& req);
nlohmann::json op_move(const nlohmann::json& req);
nlohmann::json op_mkdir(const nlohmann::json& req);
nlohmann::json op_remove(const nlohmann::json& req);
nlohmann::json op_info(const nlohmann::json& req);
nlohmann::json op_sync(const nlohmann::json& req);  // sync(2): {} once flushed
// watch.cc
std::unique_ptr<Stream> start_watch(Server& server, uint32_t id, const nlohmann::json& req);
// {"watches", "watched_dirs", "max_watches", "max_watched_dirs"} (for info).
nlohmann::json watch_info();

}  // namespace airlock::guest

// GET /v1/sandboxes/{id}/exec/{exec_id}?offset=N: attach to a foreground
// exec that outlived its client (daemon restart) and stream its output from
// byte N as NDJSON (api/openapi.yaml, "Attach"; exec/attach.cc).
#include <poll.h>

#include <cstdlib>

#include "daemon/base64.h"
#include "daemon/handlers.h"

namespace airlock::daemon {

using nlohmann::json;

namespace {

uint64_t parse_offset(const std::string& s) {
  bool ok = !s.empty() && s.size() <= 19;
  for (char c : s) ok = ok && c >= '0' && c <= '9';
  if (!ok)
    throw Error(Errc::invalid_argument, "offset must be a byte count (0 or more digits 0-9)",
                "offset");
  return std::strtoull(s.c_str(), nullptr, 10);
}

}  // namespace

void handle_attach_exec(engine::SandboxService& engine, Exchange& ex, const std::string& id,
                        const std::string& exec_id, const std::string& offset_text) {
  const uint64_t offset = parse_offset(offset_text);
  auto line = [&](const json& j) { return ex.write_chunk(j.dump() + "\n"); };
  engine::AttachCallbacks cb;
  cb.on_attached = [&](const json& a) {
    json j = a;
    j["type"] = "attach";
    j["exec_id"] = exec_id;
    ex.begin_stream("application/x-ndjson");
    line(j);
  };
  cb.on_output = [&](int channel, std::string_view bytes) {
    return line({{"type", channel == 2 ? "stderr" : "stdout"}, {"data", base64_encode(bytes)}});
  };
  // A client that hangs up detaches (the exec runs on; unlike the first
  // client of an exec, whose hang-up kills it).
  const int fd = ex.native_handle();
  cb.cancelled = [fd] {
    pollfd p{fd, 0, 0};
    return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLERR));
  };
  try {
    std::optional<engine::ExecResult> r = engine.attach_exec(id, exec_id, offset, cb);
    if (!r) return;  // detached: the client is gone
    json exit = engine::to_json(*r);
    exit["type"] = "exit";
    line(exit);
    ex.end_stream();
  } catch (const Error& e) {
    if (!ex.streaming()) throw;
    end_stream_with_error(ex, error_body(to_string(e.code()), e.what(), e.field()));
  }
}

}  // namespace airlock::daemon

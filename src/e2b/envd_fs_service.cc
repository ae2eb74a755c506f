// Registers envd's filesystem.Filesystem service and the /files routes
// (envd_fs.h, envd_files.h) on the envd routing table (envd.h).
#include "e2b/envd.h"
#include "e2b/envd_files.h"
#include "e2b/envd_fs.h"

namespace airlock::e2b {
namespace {

using connect::Code;
using nlohmann::json;

connect::RpcError rpc_of(const FsError& e) {
  static const std::pair<const char*, Code> codes[] = {
      {"not_found", Code::not_found},
      {"already_exists", Code::already_exists},
      {"invalid_argument", Code::invalid_argument},
      {"failed_precondition", Code::failed_precondition},
      {"deadline_exceeded", Code::deadline_exceeded},
      {"resource_exhausted", Code::resource_exhausted},
      {"unauthenticated", Code::unauthenticated},
      {"unavailable", Code::unavailable},
      {"out_of_range", Code::out_of_range},
      {"unimplemented", Code::unimplemented},
  };
  for (const auto& [name, code] : codes)
    if (e.code() == name) return connect::RpcError(code, e.what());
  return connect::RpcError(Code::internal, e.what());
}

FsCall fs_call(Call& c) { return FsCall{c.engine, c.sandbox.id, c.user, c.sandbox.spec.tenant}; }

}  // namespace

void register_filesystem(Envd& envd) {
  auto fs = std::make_shared<Filesystem>();
  // Watchers run engine calls on their own threads: they end first.
  envd.on_shutdown([fs] { fs->stop_all(); });
  for (const char* method : {"Stat", "ListDir", "MakeDir", "Move", "Remove", "CreateWatcher",
                             "GetWatcherEvents", "RemoveWatcher"}) {
    envd.unary(std::string("/filesystem.Filesystem/") + method,
               [fs, method](Call& c, const json& req) {
                 try {
                   return fs->unary(fs_call(c), method, req);
                 } catch (const FsError& e) {
                   throw rpc_of(e);
                 }
               });
  }
  envd.stream("/filesystem.Filesystem/WatchDir", [fs](Call& c, const json& req, StreamWriter& out) {
    try {
      fs->watch_dir(
          fs_call(c), req, [&](const json& m) { return out.send(m); },
          std::chrono::milliseconds(c.timeout_ms.value_or(0)), std::chrono::seconds(c.keepalive_s));
    } catch (const FsError& e) {
      throw rpc_of(e);
    }
  });
  envd.http("GET", "/files", [](Call& c) { files_get(c.engine, c.ex, c.sandbox.id, c.user); });
  envd.http("POST", "/files", [](Call& c) { files_post(c.engine, c.ex, c.sandbox.id, c.user); });
}

}  // namespace airlock::e2b

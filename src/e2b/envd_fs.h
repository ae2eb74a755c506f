// envd's filesystem service (filesystem.Filesystem of E2B's
// filesystem.proto) over the engine's file operations: Stat, ListDir with
// depth, MakeDir, Move, Remove, WatchDir (a server stream) and the watcher
// trio CreateWatcher / GetWatcherEvents / RemoveWatcher, with envd's answers
// and error codes as E2B's SDK reads them (docs/e2b.md). Messages are the
// proto3 JSON forms (camelCase fields, enums by name, int64 as strings).
//
// Paths are resolved as envd does (relative and "~" against the user's
// home) and then checked by the engine and the guest: the host never touches
// a guest path. What MakeDir and Move create belongs to the call's user.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>

#include "common/error.h"
#include "engine/api/service.h"

namespace airlock::e2b {

class Envd;
// Registers filesystem.Filesystem and GET/POST /files on `envd`
// (envd_fs_service.cc).
void register_filesystem(Envd& envd);

// A Connect error of the filesystem service: `code` is its wire name
// ("not_found", "already_exists", "invalid_argument", ...).
class FsError : public std::runtime_error {
 public:
  FsError(std::string code, const std::string& message)
      : std::runtime_error(message), code_(std::move(code)) {}
  const std::string& code() const { return code_; }

 private:
  std::string code_;
};

// An engine error as envd reports the same failure.
FsError fs_error(const Error& e);

// "~", "~/x" and relative paths against the user's home (`home()`, asked
// only for such a path), "." and ".." folded; absolute paths as they are.
// "~other" is invalid_argument.
std::string resolve_path(std::string_view path, const std::function<std::string()>& home);
// The home directory of `user` in `sandbox`: the guest's answer
// (Engine::guest_home, its passwd entry), so "~" here is the $HOME a process
// of that user gets. FsError as envd reports the failure.
std::string guest_home(engine::SandboxService& engine, const std::string& sandbox, const std::string& user);

// Go's os.FileMode.String() of an entry ("-rw-r--r--", "drwxr-xr-x",
// "Lrwxrwxrwx", "dtrwxrwxrwx"), which envd returns as "permissions".
std::string permissions_string(const std::string& type, uint32_t mode);
// The engine's entry (file_entry.h) as envd's EntryInfo: a symlink is typed
// and moded as its target (UNSPECIFIED if it dangles), with symlinkTarget.
nlohmann::json entry_info(const nlohmann::json& entry);
// A watch event of the engine as FilesystemEvents (name relative to the
// watched directory): renamed gives RENAME (old name) and CREATE (new);
// overflow gives none.
std::vector<nlohmann::json> fs_events(const nlohmann::json& event, const std::string& root);

// Who and where: the sandbox (already resolved and visible to the caller)
// and the user the call runs as.
struct FsCall {
  engine::SandboxService& engine;
  std::string sandbox;
  std::string user;
  std::string tenant;  // the sandbox's owner ("" = the operator's): whose watcher cap
};

class Filesystem {
 public:
  // How a watcher watches: Engine::watch_files unless a test gives another.
  using WatchFn = std::function<engine::WatchEnd(engine::SandboxService&, const std::string& sandbox,
                                                 const std::string& path, bool recursive,
                                                 const engine::WatchCallbacks&)>;
  explicit Filesystem(WatchFn watch = {});
  ~Filesystem() { stop_all(); }
  // Stops and joins every watcher (before the engine goes away).
  void stop_all();
  Filesystem(const Filesystem&) = delete;
  Filesystem& operator=(const Filesystem&) = delete;

  // Whether `method` (e.g. "Stat") is one of the unary methods.
  static bool is_unary(std::string_view method);
  // Answers a unary call with its response message; throws FsError.
  nlohmann::json unary(const FsCall& call, std::string_view method, const nlohmann::json& request);
  // WatchDir: `send` gets {"start": {}}, then {"filesystem": event} and
  // {"keepalive": {}} every `keepalive`; returns when `send` returns false,
  // `timeout` (zero = none) passed (FsError deadline_exceeded), or the
  // watch ended in the guest (FsError when it failed). Errors before the
  // start are thrown (nothing sent).
  void watch_dir(const FsCall& call, const nlohmann::json& request,
                 const std::function<bool(const nlohmann::json&)>& send,
                 std::chrono::milliseconds timeout, std::chrono::milliseconds keepalive);

  // Bounds of the watcher trio: watchers per tenant (one tenant at its cap
  // leaves the others theirs), events buffered per watcher (beyond:
  // dropped), and how long a watcher nobody polls lives.
  static constexpr size_t kMaxWatchersPerTenant = 64;
  static constexpr size_t kMaxBufferedEvents = 4096;
  static constexpr auto kWatcherIdle = std::chrono::minutes(10);

 private:
  struct Watcher;
  nlohmann::json create_watcher(const FsCall& call, const nlohmann::json& request);
  nlohmann::json watcher_events(const FsCall& call, const nlohmann::json& request);
  void remove_watcher(const FsCall& call, const nlohmann::json& request);
  std::shared_ptr<Watcher> find_watcher(const FsCall& call, const nlohmann::json& request);

  WatchFn watch_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Watcher>> watchers_;  // by watcher id
};

}  // namespace airlock::e2b

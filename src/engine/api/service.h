// The engine as its clients see it: every operation airlockd's HTTP layer,
// the E2B surface (control plane and envd), the MCP server (through the
// daemon) and the recipe builder ask of it, and nothing else. engine::Engine
// (engine.h) implements it; the clients hold a SandboxService& and include
// this header, never engine.h, so they compile without the engine's inside
// and their tests run against daemon::FakeSandboxService
// (src/daemon/fake_service_test_support.h), which the compiler keeps in step
// with this class.
//
// Each operation's contract (errors, bounds, what it leaves behind) is
// documented once, at its declaration in engine.h; the groups below follow
// that file's order.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/api/types.h"
#include "engine/audit/journal.h"  // RecordFollower

namespace airlock::metrics {
class Writer;  // common/metrics/metrics.h
}
namespace airlock::storage {
class ImageStore;  // engine/storage/image_store.h
struct Image;
}  // namespace airlock::storage

namespace airlock::engine {

class SandboxService {
 public:
  virtual ~SandboxService() = default;

  // Sandboxes: create, look up, end.
  virtual SandboxInfo create(const SandboxSpec& spec) = 0;
  virtual std::vector<SandboxInfo> list(const std::map<std::string, std::string>& filter = {},
                                        bool all = false) = 0;
  virtual SandboxInfo get(const std::string& id) = 0;
  virtual void destroy(const std::string& id) = 0;
  virtual void destroy_and_wait(const std::string& id) = 0;
  virtual SandboxInfo set_timeout(const std::string& id, int seconds) = 0;

  // Execs: streaming, stdin, attach, signals, terminals, background jobs.
  virtual ExecResult exec(const std::string& id, const ExecRequest& request,
                          const ExecCallbacks& callbacks) = 0;
  virtual StdinWrite write_stdin(const std::string& id, const std::string& exec_id,
                                 const ChunkSource& source, bool eof,
                                 const std::function<bool()>& cancelled = {}) = 0;
  virtual std::optional<ExecResult> attach_exec(const std::string& id, const std::string& exec_id,
                                                uint64_t offset,
                                                const AttachCallbacks& callbacks) = 0;
  virtual void kill_exec(const std::string& id, const std::string& exec_id, int signal = 9) = 0;
  virtual void pty_input(const std::string& id, const std::string& exec_id,
                         std::string_view bytes) = 0;
  virtual void pty_resize(const std::string& id, const std::string& exec_id, int cols,
                          int rows) = 0;
  virtual ExecStatus exec_background(const std::string& id, const ExecRequest& request) = 0;
  virtual std::vector<ExecStatus> list_execs(const std::string& id) = 0;
  virtual ExecStatus wait_exec(const std::string& id, const std::string& exec_id,
                               double timeout_s = 0) = 0;

  // Files in the guest, and what the guest reports about itself.
  virtual uint64_t write_file(const std::string& id, const std::string& path, uint32_t mode,
                              const ChunkSource& source) = 0;
  virtual uint64_t read_file(const std::string& id, const std::string& path,
                             const ChunkSink& sink) = 0;
  virtual nlohmann::json list_files(const std::string& id, const std::string& path) = 0;
  virtual nlohmann::json stat_file(const std::string& id, const std::string& path) = 0;
  virtual void make_dir(const std::string& id, const std::string& path, bool parents) = 0;
  virtual void remove_file(const std::string& id, const std::string& path, bool recursive) = 0;
  virtual nlohmann::json guest_info(const std::string& id) = 0;
  virtual std::string guest_home(const std::string& id, const std::string& user) = 0;
  // As E2B's filesystem service needs them: owned by a guest user, deep
  // listings, renames, watches.
  virtual uint64_t write_file_as(const std::string& id, const std::string& path, uint32_t mode,
                                 const ChunkSource& source, const std::string& owner) = 0;
  virtual nlohmann::json list_files(const std::string& id, const std::string& path, int depth) = 0;
  virtual nlohmann::json move_file(const std::string& id, const std::string& from,
                                   const std::string& to, const std::string& owner = {}) = 0;
  virtual void make_dir_as(const std::string& id, const std::string& path,
                           const std::string& owner) = 0;
  virtual WatchEnd watch_files(const std::string& id, const std::string& path, bool recursive,
                               const WatchCallbacks& callbacks) = 0;
  virtual nlohmann::json posture(const std::string& id) = 0;

  // The audit journal and the disk's changes.
  virtual std::vector<nlohmann::json> audit(const std::string& id) = 0;
  virtual nlohmann::json verify_journal(const std::string& id) = 0;
  virtual std::unique_ptr<RecordFollower> follow_journal(const std::string& id) = 0;
  virtual nlohmann::json changes(const std::string& id, const std::string& since, bool content) = 0;

  // Network: egress policy, its events, inbound port forwards.
  virtual nlohmann::json set_network(const std::string& id, const nlohmann::json& policy) = 0;
  virtual std::unique_ptr<RecordFollower> follow_network_events(const std::string& id) = 0;
  virtual nlohmann::json add_port(const std::string& id, int guest_port, int host_port = 0) = 0;
  virtual nlohmann::json list_ports(const std::string& id) = 0;
  virtual void remove_port(const std::string& id, int host_port) = 0;

  // The warm pool.
  virtual nlohmann::json set_pool(const std::string& image, int size,
                                  const nlohmann::json& shape = nlohmann::json()) = 0;
  virtual nlohmann::json pool_info() = 0;

  // Pause, resume, snapshots, fork.
  virtual SandboxInfo pause(const std::string& id) = 0;
  virtual SandboxInfo resume(const std::string& id) = 0;
  virtual nlohmann::json snapshot(const std::string& id, const std::string& name, bool memory) = 0;
  virtual nlohmann::json list_snapshots() = 0;
  virtual nlohmann::json get_snapshot(const std::string& name) = 0;
  virtual void delete_snapshot(const std::string& name) = 0;
  virtual nlohmann::json save_snapshot_image(const std::string& snapshot,
                                             const std::string& name) = 0;
  virtual std::vector<SandboxInfo> fork(const std::string& id, int count) = 0;

  // The daemon's own state: info, metrics, readiness.
  virtual nlohmann::json info() = 0;
  virtual void write_metrics(metrics::Writer& out) = 0;
  virtual nlohmann::json readiness() = 0;

  // Images: the store, the operator's management calls, disk use.
  virtual storage::ImageStore& images() = 0;
  virtual nlohmann::json list_images() = 0;
  virtual nlohmann::json inspect_image(const std::string& name) = 0;
  virtual nlohmann::json import_image(const std::string& name, const std::filesystem::path& archive,
                                      bool replace) = 0;
  virtual void remove_image(const std::string& name) = 0;
  virtual nlohmann::json disk_usage() = 0;
  virtual nlohmann::json prune(bool dry_run) = 0;
  virtual nlohmann::json stats(const std::string& id) = 0;

  // What the recipe builder (src/recipes) needs beyond the above: a sandbox
  // booted on a build layer, its disk, and the directories a layer's
  // backing chain may stay in.
  virtual SandboxInfo create_on_image(const SandboxSpec& spec, const storage::Image& image) = 0;
  virtual std::filesystem::path disk_path(const std::string& id) = 0;
  virtual std::vector<std::filesystem::path> disk_roots() = 0;
};

}  // namespace airlock::engine

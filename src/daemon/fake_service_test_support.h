// A fake of the engine's interface (engine/api/service.h) for the tests of
// its clients: the daemon's HTTP layer, E2B, MCP and the CLI's client, run
// against the real server over a real socket with no VM. Sandboxes and files
// live in memory; exec runs a few scripted commands (listed in
// fake_service_test_support.cc). What needs a VM's state (background execs,
// pause, snapshots, port forwards, ...) is refused with Error(unavailable),
// never faked success: those paths are tested against the real engine.
//
// It overrides every operation of SandboxService and is final, so an
// operation added to the interface and not here fails to compile.
//
//   daemon::FakeSandboxService engine;
//   server.run(engine);
#pragma once

#include <memory>

#include "engine/api/service.h"

namespace airlock::daemon {

class FakeSandboxService final : public engine::SandboxService {
 public:
  FakeSandboxService();
  ~FakeSandboxService() override;
  FakeSandboxService(const FakeSandboxService&) = delete;
  FakeSandboxService& operator=(const FakeSandboxService&) = delete;

  engine::SandboxInfo create(const engine::SandboxSpec& spec) override;
  std::vector<engine::SandboxInfo> list(const std::map<std::string, std::string>& filter = {},
                                        bool all = false) override;
  engine::SandboxInfo get(const std::string& id) override;
  void destroy(const std::string& id) override;
  void destroy_and_wait(const std::string& id) override;
  engine::SandboxInfo set_timeout(const std::string& id, int seconds) override;
  engine::ExecResult exec(const std::string& id, const engine::ExecRequest& request,
                          const engine::ExecCallbacks& callbacks) override;
  engine::StdinWrite write_stdin(const std::string& id, const std::string& exec_id,
                                 const engine::ChunkSource& source, bool eof,
                                 const std::function<bool()>& cancelled = {}) override;
  std::optional<engine::ExecResult> attach_exec(const std::string& id, const std::string& exec_id,
                                                uint64_t offset,
                                                const engine::AttachCallbacks& callbacks) override;
  void kill_exec(const std::string& id, const std::string& exec_id, int signal = 9) override;
  void pty_input(const std::string& id, const std::string& exec_id,
                 std::string_view bytes) override;
  void pty_resize(const std::string& id, const std::string& exec_id, int cols, int rows) override;
  engine::ExecStatus exec_background(const std::string& id,
                                     const engine::ExecRequest& request) override;
  std::vector<engine::ExecStatus> list_execs(const std::string& id) override;
  engine::ExecStatus wait_exec(const std::string& id, const std::string& exec_id,
                               double timeout_s = 0) override;
  uint64_t write_file(const std::string& id, const std::string& path, uint32_t mode,
                      const engine::ChunkSource& source) override;
  uint64_t read_file(const std::string& id, const std::string& path,
                     const engine::ChunkSink& sink) override;
  nlohmann::json list_files(const std::string& id, const std::string& path) override;
  nlohmann::json stat_file(const std::string& id, const std::string& path) override;
  void make_dir(const std::string& id, const std::string& path, bool parents) override;
  void remove_file(const std::string& id, const std::string& path, bool recursive) override;
  nlohmann::json guest_info(const std::string& id) override;
  std::string guest_home(const std::string& id, const std::string& user) override;
  uint64_t write_file_as(const std::string& id, const std::string& path, uint32_t mode,
                         const engine::ChunkSource& source, const std::string& owner) override;
  nlohmann::json list_files(const std::string& id, const std::string& path, int depth) override;
  nlohmann::json move_file(const std::string& id, const std::string& from, const std::string& to,
                           const std::string& owner = {}) override;
  void make_dir_as(const std::string& id, const std::string& path,
                   const std::string& owner) override;
  engine::WatchEnd watch_files(const std::string& id, const std::string& path, bool recursive,
                               const engine::WatchCallbacks& callbacks) override;
  nlohmann::json posture(const std::string& id) override;
  std::vector<nlohmann::json> audit(const std::string& id) override;
  nlohmann::json verify_journal(const std::string& id) override;
  std::unique_ptr<engine::RecordFollower> follow_journal(const std::string& id) override;
  nlohmann::json changes(const std::string& id, const std::string& since, bool content) override;
  nlohmann::json set_network(const std::string& id, const nlohmann::json& policy) override;
  std::unique_ptr<engine::RecordFollower> follow_network_events(const std::string& id) override;
  nlohmann::json add_port(const std::string& id, int guest_port, int host_port = 0) override;
  nlohmann::json list_ports(const std::string& id) override;
  void remove_port(const std::string& id, int host_port) override;
  nlohmann::json set_pool(const std::string& image, int size,
                          const nlohmann::json& shape = nlohmann::json()) override;
  nlohmann::json pool_info() override;
  engine::SandboxInfo pause(const std::string& id) override;
  engine::SandboxInfo resume(const std::string& id) override;
  nlohmann::json snapshot(const std::string& id, const std::string& name, bool memory) override;
  nlohmann::json list_snapshots() override;
  nlohmann::json get_snapshot(const std::string& name) override;
  void delete_snapshot(const std::string& name) override;
  nlohmann::json save_snapshot_image(const std::string& snapshot, const std::string& name) override;
  std::vector<engine::SandboxInfo> fork(const std::string& id, int count) override;
  nlohmann::json info() override;
  void write_metrics(metrics::Writer& out) override;
  nlohmann::json readiness() override;
  storage::ImageStore& images() override;
  nlohmann::json list_images() override;
  nlohmann::json inspect_image(const std::string& name) override;
  nlohmann::json import_image(const std::string& name, const std::filesystem::path& archive,
                              bool replace) override;
  void remove_image(const std::string& name) override;
  nlohmann::json disk_usage() override;
  nlohmann::json prune(bool dry_run) override;
  nlohmann::json stats(const std::string& id) override;
  engine::SandboxInfo create_on_image(const engine::SandboxSpec& spec,
                                      const storage::Image& image) override;
  std::filesystem::path disk_path(const std::string& id) override;
  std::vector<std::filesystem::path> disk_roots() override;

 private:
  // The network events of the in-memory journal, from the `skip`th on.
  std::vector<nlohmann::json> network_events(const std::string& id, size_t skip);

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace airlock::daemon

// libairlock: the sandbox engine. airlockd is a thin HTTP layer over this.
//
// Thread-safe; every call blocks until done. Actions that do not fit a
// sandbox's state are refused with Error(conflict), never half-done; bad
// specs are refused with Error(invalid_argument, ..., field) before anything
// is created.
//
//   Engine engine(Config{.data_dir = "/var/lib/airlock"});
//   SandboxInfo sb = engine.create({.image = "minimal"});
//   ExecResult r = engine.exec(sb.id, {.argv = {"sh", "-c", "echo hi"}},
//                              {.on_output = [](int ch, std::string_view b) { ...; return true;
//                              }});
//   engine.destroy(sb.id);
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

#include "engine/api/service.h"
#include "engine/api/types.h"
#include "engine/audit/journal.h"
#include "engine/storage/image_store.h"
#include "engine/vmm/jail_ids.h"

namespace airlock::metrics {
class Writer;  // common/metrics/metrics.h
}

namespace airlock::engine {

class Launcher;  // launcher.h: how VMs are started (the VMM seam)

struct Config {
  std::filesystem::path data_dir;     // registry.db, sandboxes/, audit/
  std::filesystem::path image_dir;    // default: data_dir / "images"
  std::filesystem::path share_dir;    // default: <exe dir>/../share/airlock
  std::filesystem::path guest_agent;  // default: <exe dir>/airlock-guest
  int boot_timeout_s = 60;            // agent must answer within this, else retry once
  // The host ports (on 127.0.0.1) a port forward may bind, the operator's
  // choice at daemon start: no forward, the operator's own included, binds
  // any other host port (add_port).
  int port_forward_min = 40000, port_forward_max = 40999;
  std::string accel;  // "", "kvm" or "tcg": "" = probe (cached)
  // TCG translation cache cap per QEMU, MiB (vmm::VmConfig::tcg_tb_size_mb); 0 = QEMU's 1 GiB.
  int tcg_tb_size_mb = 128;
  // The uids/gids QEMU jails get (as root); checked at start against
  // /etc/subuid, /etc/subgid, passwd and group: Error(field "jail_ids").
  vmm::JailIdRange jail_ids;
  // Templates (docs/design.md, "Templates and clones"): a create whose shape
  // has a template starts as a copy-on-write clone of it instead of booting.
  bool templates = true;
  std::filesystem::path template_dir;  // default: data_dir / "templates"
  // default: $AIRLOCK_TEMPLATE_RAM_DIR, else /dev/shm/airlock-<hash of data_dir>
  std::filesystem::path template_ram_dir;
  size_t max_templates = 8;  // least recently used ones beyond are removed
  // Warm pool: image name -> sandboxes kept cloned and ready (default shape,
  // no network). Changeable at runtime with Engine::set_pool.
  std::map<std::string, int> pool;
  // The learned pool (docs/design.md, "Warm pool"): a create that finds no
  // ready member of its shape gets that shape a learned slot (1 member, up
  // to 2 while misses keep coming), at most pool_learn_shapes shapes whose
  // members' memory_mb add up to at most pool_learn_memory_mb (least
  // recently used evicted), each forgotten after pool_learn_idle_s unused.
  // 0 shapes = off (the engine's default; airlockd's --pool-learn is 4).
  int pool_learn_shapes = 0;
  int pool_learn_memory_mb = 1024;
  int pool_learn_idle_s = 300;
  // The pool thread's period: it looks at its slots (dead members, memory
  // pressure, learned shapes gone idle) and starts refilling this long after
  // a hand-out; a refill then goes on member after member until the slots
  // are full.
  int pool_tick_ms = 500;
  // A member's cpu weight until its hand-out (vmm::CgroupLimits::cpu_weight:
  // 1..10000, 100 = a sandbox in use): cloning and warming a member yields
  // the CPU to sandboxes in use, so a refill never slows their execs or the
  // next create. 100 = no difference.
  int pool_cpu_weight = 10;
  // Agent liveness (docs/design.md, "Failure states"): the reaper pings each
  // running sandbox's agent every agent_ping_interval_ms; one unanswered
  // for agent_ping_timeout_ms fails the sandbox as `agent_lost`.
  int agent_ping_interval_ms = 5000;
  int agent_ping_timeout_ms = 30000;
  // How VMs are started; null = QEMU (qemu_launcher()). Tests inject the
  // fake launcher (fake_launcher.h).
  std::shared_ptr<Launcher> launcher;
  // The wall clock for timestamps shown to users (created_at_ms,
  // expires_at_ms, ms since the epoch); null = system_clock. Deadlines
  // never use it (steady clock). Tests step it.
  std::function<int64_t()> wall_clock_ms;
  // Free MiB of the data dir's filesystem for disk admission; null =
  // statvfs. Tests fix it (and may block in it to hold a call there).
  std::function<int64_t()> disk_free_mb;
  // Audit journal cap per sandbox (audit/journal.h, JournalLimits): past
  // journal_max_bytes - journal_reserve_bytes ordinary records are dropped
  // and counted; the reserve is for lifecycle records. 0 = no cap.
  uint64_t journal_max_bytes = 64ull << 20;
  uint64_t journal_reserve_bytes = 1ull << 20;
  // How long the head of a buffered journal record (an exec's, a pool
  // hand-out's) may wait for its anchor (AuditJournal); sync records are
  // anchored at once. 0 = every record at once.
  int journal_anchor_lag_ms = 50;
  // Per foreground exec, the output the guest keeps so a client can attach
  // again after a daemon restart (airlockd --exec-buffer-bytes; 64 KiB ..
  // 1 GiB). Beyond it the oldest bytes go, counted (exec/attach.cc).
  uint64_t exec_buffer_bytes = 1ull << 20;
  // On (the default; airlockd --sync-delete turns it off): destroy()
  // answers once the sandbox is `stopping` and out of service; its VM and
  // files go on the reclaim thread (engine_reclaim.cc), and whoever needs
  // them gone (DELETE ?wait=true, the recipe builder, snapshot and image
  // removal) waits with destroy_and_wait() or settle_reclaim(). Off:
  // destroy() returns when all is gone.
  bool background_delete = true;
};

class Engine : public SandboxService {
 public:
  explicit Engine(Config config);
  ~Engine();  // stops background threads; running sandboxes are left running
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates, builds a built-in image on demand, boots (watchdog: one retry)
  // and returns the running sandbox. Errors: invalid_argument + field (bad
  // spec; unknown image -> field "image"; disk_mb below the image size),
  // timeout (the agent never answered; message has the console tail),
  // internal (QEMU failed). A failed create leaves no QEMU and no files; its
  // registry row is `failed` with the reason.
  SandboxInfo create(const SandboxSpec& spec) override;
  // Live sandboxes whose metadata contains every pair in `filter`
  // (all = also deleted/failed/timed-out ones still in the registry).
  std::vector<SandboxInfo> list(const std::map<std::string, std::string>& filter = {},
                                bool all = false) override;
  // Any sandbox still in the registry (also deleted ones); not_found if none.
  SandboxInfo get(const std::string& id) override;
  // Kills the VM, removes its files, state `deleted`. not_found for an
  // unknown id; conflict if it is already deleted/timed_out/failed (nothing
  // left to remove) or still starting.
  void destroy(const std::string& id) override;
  // As destroy, returning once this sandbox's VM and files are gone (DELETE
  // ?wait=true; the recipe builder keeps a step sandbox's disk as a layer at
  // once). Error(timeout) if the teardown takes longer than 60 s.
  void destroy_and_wait(const std::string& id) override;
  // Moves a running sandbox's expiry to `seconds` (1 .. 604800) from now,
  // earlier or later; persisted, the reaper ends it then (timed_out).
  // invalid_argument field "timeout"; not_found; conflict unless running.
  SandboxInfo set_timeout(const std::string& id, int seconds) override;

  // conflict unless running (also if the sandbox is stopped during the
  // call); guest errors (no such binary/cwd/user) keep the guest's Errc.
  ExecResult exec(const std::string& id, const ExecRequest& request,
                  const ExecCallbacks& callbacks) override;
  // Appends `source` to the stdin of a running exec started with
  // stdin_stream (a streaming exec() on its stream; a background one, or a
  // foreground one of a previous daemon, through the guest's job_stdin by
  // exec_id, so its stdin outlives a daemon restart),
  // then closes it if `eof`. Memory is bounded: a chunk is
  // pulled from `source` only once the previous one went to the guest within
  // its credit window, so a process that does not read blocks the call.
  // not_found: no such exec; conflict: its stdin is closed (eof sent, or the
  // exec ended, also during the call) or it was not started with
  // stdin_stream. Concurrent calls on one exec run one after the other.
  // `cancelled`, if given, is asked every 200 ms while a streaming exec's
  // process does not read; true ends the call with Error(unavailable).
  StdinWrite write_stdin(const std::string& id, const std::string& exec_id,
                         const ChunkSource& source, bool eof,
                         const std::function<bool()>& cancelled = {}) override;
  // Attaches to a foreground exec that outlived its client (the daemon was
  // restarted, or the client detached) from byte `offset` of its output
  // (stdout and stderr as one sequence, counted from 0; exec/attach.cc).
  // Returns the result once it ended (its journal record is written then,
  // once), nullopt if the caller detached again. Errors: not_found (no such
  // exec waiting for a client: unknown, finished and collected, or still
  // streaming to its first client: conflict), invalid_argument field
  // "offset" (beyond what it produced), conflict (not running).
  std::optional<ExecResult> attach_exec(const std::string& id, const std::string& exec_id,
                                        uint64_t offset, const AttachCallbacks& callbacks) override;
  // Sends `signal` to a running exec's process (tree); for a background
  // exec, 9 kills its whole tree even after its main process ended. A
  // foreground exec of a previous daemon is reached by exec_id; with no
  // client attached its end is collected (journal `exec`; up to 10 s).
  void kill_exec(const std::string& id, const std::string& exec_id, int signal = 9) override;
  // Terminal input of a running pty exec (exec() with request.pty), e.g.
  // keystrokes; Ctrl-C is byte 3, which the guest pty turns into SIGINT.
  // Blocks while the guest's window is full (the program does not read its
  // terminal). not_found if no such exec is running (any more).
  void pty_input(const std::string& id, const std::string& exec_id,
                 std::string_view bytes) override;
  // New window size of a running pty exec (the program gets SIGWINCH).
  // invalid_argument + field "cols"/"rows" outside 1..4096; not_found as above.
  void pty_resize(const std::string& id, const std::string& exec_id, int cols, int rows) override;
  // Starts request.background-style: returns once the process runs. Errors
  // as exec(). The exec's output goes nowhere (redirect it in the command).
  ExecStatus exec_background(const std::string& id, const ExecRequest& request) override;
  // The sandbox's background execs, oldest first (finished ones included,
  // the guest keeps the last 128).
  std::vector<ExecStatus> list_execs(const std::string& id) override;
  // A background exec, once it ended or after `timeout_s` (0 = now).
  // not_found for an unknown exec_id.
  ExecStatus wait_exec(const std::string& id, const std::string& exec_id,
                       double timeout_s = 0) override;

  uint64_t write_file(const std::string& id, const std::string& path, uint32_t mode,
                      const ChunkSource& source) override;
  uint64_t read_file(const std::string& id, const std::string& path,
                     const ChunkSink& sink) override;
  // {"entries": [{"name","type","size","mode","mtime"}, ...]}
  nlohmann::json list_files(const std::string& id, const std::string& path) override;
  nlohmann::json stat_file(const std::string& id, const std::string& path) override;
  void make_dir(const std::string& id, const std::string& path, bool parents) override;
  void remove_file(const std::string& id, const std::string& path, bool recursive) override;
  nlohmann::json guest_info(const std::string& id) override;  // kernel, uptime, memory, disk
  // The home directory of guest user `user` (name or uid; "" = root): the
  // $HOME an exec as that user gets, from the guest's passwd (guest op
  // "user"). not_found field "user" for an unknown user; guest_error if the
  // guest answers something that is not an absolute path.
  std::string guest_home(const std::string& id, const std::string& user) override;
  // File operations as E2B's filesystem service needs them (engine_files.cc).
  // Entries are checked and rebuilt by the host (file_entry.h) and carry
  // "path", "owner", "group" and a symlink's "target". `owner` (a guest user
  // name; empty = root): what the call creates (the file, missing parent
  // directories) belongs to that user, as the files envd writes for the user
  // a call runs as; an unknown user is not_found field "user".
  uint64_t write_file_as(const std::string& id, const std::string& path, uint32_t mode,
                         const ChunkSource& source, const std::string& owner) override;
  // `depth` levels below `path` (1..64; 1 = its entries), depth first, each
  // directory's entries by name; {"entries": [...], "truncated"?: true}
  // (the guest answers in pages; "truncated" past 100000 entries).
  nlohmann::json list_files(const std::string& id, const std::string& path, int depth) override;
  // rename(2) `from` to `to` in the guest (missing parents of `to` made,
  // owned by `owner`); the entry now at `to`. not_found (field "path") if
  // `from` does not exist; conflict if `to` is a non-empty directory.
  nlohmann::json move_file(const std::string& id, const std::string& from, const std::string& to,
                           const std::string& owner = {}) override;
  void make_dir_as(const std::string& id, const std::string& path,
                   const std::string& owner) override;
  // Streams changes under the guest directory `path` (inotify in the guest;
  // recursive: every directory below it too, new ones included) to
  // `callbacks` on this thread until a callback returns false, the watch
  // ends in the guest or the sandbox stops. Errors before the start:
  // invalid_argument field "path" (relative, not a directory), not_found
  // field "path", unavailable (the sandbox's watch caps), conflict (not
  // running). Memory is bounded on both sides (the guest drops and counts
  // past its queue: an "overflow" event). Audited as a "file" op "watch".
  WatchEnd watch_files(const std::string& id, const std::string& path, bool recursive,
                       const WatchCallbacks& callbacks) override;
  // The running sandbox's QEMU jail as read back from /proc and its cgroup
  // (vmm/posture.h), plus "isolation": "kvm"|"tcg" with a "note" (under TCG
  // QEMU is not a security boundary by its own policy: the jail is what
  // protects the host), "jail": full|userns|none and "missing": the
  // protections not in force. conflict unless running (engine_posture.cc).
  nlohmann::json posture(const std::string& id) override;

  // The sandbox's audit journal (kept after delete), oldest first.
  std::vector<nlohmann::json> audit(const std::string& id) override;
  // Its size and what the cap dropped (counted since this engine started;
  // the sandbox's end record carries the final count as "journal_dropped").
  JournalStats journal_stats(const std::string& id);
  // The journal's hash chain checked against the head anchored in the
  // registry and its signature (audit/chain.h; VerifyReport::to_json):
  // {"ok", "records", "head", "anchor", "unanchored", "breaks", "first_break",
  // ...}. Error(not_found) if the sandbox has no journal (engine_journal.cc).
  nlohmann::json verify_journal(const std::string& id) override;
  // A follower of every record of the journal from the first (GET
  // .../events); not_found like follow_network_events.
  std::unique_ptr<RecordFollower> follow_journal(const std::string& id) override;
  // Paths added, modified and deleted in the sandbox's disk since `since`
  // ("start": its base image or template), read on the host from the disk
  // layers (storage/fsdiff.h; engine_changes.cc). `content`: unified diffs
  // of text files. Error(invalid_argument, field since) for anything else.
  nlohmann::json changes(const std::string& id, const std::string& since, bool content) override;

  // Replaces a running sandbox's egress policy; flows no longer allowed are
  // cut. Returns {"policy": <normalised>, "flows_cut": N}. A sandbox created
  // with mode "none" has no NIC: changing it is Error(conflict).
  nlohmann::json set_network(const std::string& id, const nlohmann::json& policy) override;
  // The sandbox's network events (net_dns, net_flow, net_flow_end, ...) from
  // its journal, oldest first, skipping the first `skip` of them (for polling).
  std::vector<nlohmann::json> network_events(const std::string& id, size_t skip = 0);
  // A follower of those events from the first one: next() returns only the
  // ones appended since its last call, wait() sleeps until the journal grows
  // (follow=true streams). not_found like network_events.
  std::unique_ptr<RecordFollower> follow_network_events(const std::string& id) override;
  // Inbound port forwards (off by default): host 127.0.0.1:host_port (0 = a
  // free port) to the guest's TCP guest_port, through the network helper;
  // recorded as net_port events, connections through it as inbound flows.
  // host_port must lie in Config::port_forward_min..max; 0 picks a free one
  // there. Returns {"host": "127.0.0.1", "host_port", "guest_port"}. Errors:
  // invalid_argument + field (port out of range; host_port outside the
  // forward range), unavailable (no free port left in the range),
  // conflict (mode "none": no NIC; host port in use; guest port already
  // forwarded), not_found (remove: no such forward).
  nlohmann::json add_port(const std::string& id, int guest_port, int host_port = 0) override;
  nlohmann::json list_ports(
      const std::string& id) override;  // [{"host", "host_port", "guest_port"}]
  void remove_port(const std::string& id, int host_port) override;

  // Warm pool: keep `size` sandboxes of `image` in one shape cloned and
  // ready (0..64; 0 removes that shape's slot). `shape` may set cpus,
  // memory_mb, disk_mb (default: the SandboxSpec defaults) and network
  // (members with a NIC); each shape has its own slot, configured (never
  // changed by learning; a learned slot set here becomes configured). A
  // create of exactly that image and shape takes a member (start "pool").
  // Returns pool_info().
  nlohmann::json set_pool(const std::string& image, int size,
                          const nlohmann::json& shape = nlohmann::json()) override;
  // [{"image", "shape", "learned", "target", "ready", "members", "hits",
  //   "misses", "replaced", "shed"}, ...], one per shape
  nlohmann::json pool_info() override;

  // Pause and resume (engine_pause.cc; docs/design.md "Snapshots, fork,
  // pause"). pause() saves the whole VM (RAM, devices; the disk stays) under
  // data_dir/paused/<id> and ends QEMU: `paused` holds no CPU and no RAM;
  // the `timeout` clock keeps running (a paused sandbox past its timeout is
  // ended, timed_out). A foreground (streaming) exec in flight is killed
  // before the save and its call ends with Error(conflict) ("paused during
  // the call"); background execs are frozen with the VM and continue after
  // resume. resume() restores it with every other process intact; works
  // after a daemon restart.
  // conflict unless running (pause) / paused (resume); not_found.
  SandboxInfo pause(const std::string& id) override;
  SandboxInfo resume(const std::string& id) override;
  // Snapshots (engine_snapshots.cc): the disk of a running or paused
  // sandbox (with `memory`, its whole VM too) as a read-only snapshot
  // `name`. invalid_argument field "name" (empty, '/', "..", NUL, ...);
  // conflict (name taken, sandbox not running/paused); unavailable (host
  // disk full: nothing of it is left). Returns the snapshot's JSON.
  nlohmann::json snapshot(const std::string& id, const std::string& name, bool memory) override;
  nlohmann::json list_snapshots() override;
  nlohmann::json get_snapshot(const std::string& name) override;
  // conflict naming the sandboxes and snapshots that use it.
  void delete_snapshot(const std::string& name) override;
  // `airlock image save`: snapshot `snapshot`'s disk (its whole layer chain,
  // flattened) becomes the installed image `name`, with the exec defaults
  // of the snapshot's image (config.base names that image). The snapshot is
  // verified first and held (not deletable) meanwhile. not_found field
  // "snapshot"; conflict if image `name` exists or is a built-in recipe;
  // unavailable if the snapshot is damaged or the host's disk is full
  // (nothing of the image is left). Returns the image's JSON.
  nlohmann::json save_snapshot_image(const std::string& snapshot, const std::string& name) override;
  // `count` (1..16) new running sandboxes continuing from `id`'s memory and
  // disk now (copy-on-write), each with its own identity; `id` keeps
  // running after a short stop. All or nothing.
  std::vector<SandboxInfo> fork(const std::string& id, int count) override;

  // version, accelerator + why, images, templates, pool.
  nlohmann::json info() override;
  // The engine's metric families (engine_metrics.cc: sandboxes by state,
  // creates and execs with latency histograms, failures by typed reason,
  // pool, network flows and bytes, journal bytes, QEMU memory).
  void write_metrics(metrics::Writer& out) override;
  // Can a create succeed now? {"ready": bool, "missing": ["..."]}: at
  // least one image is built and the accelerator probe is done (run now,
  // once, if it was not).
  nlohmann::json readiness() override;
  storage::ImageStore& images() override;
  // The directories a host-read disk chain may stay in (images, templates,
  // snapshots: storage/disk_chain.h); a build's layers are backed by them.
  std::vector<std::filesystem::path> disk_roots() override;
  // Image recipes (src/recipes/builder.cc; engine_build.cc): a sandbox booted on
  // `image` as given, never a clone or a pool member: a build step runs on
  // the previous step's layer (image.rootfs a *.qcow2 file). Errors as create().
  SandboxInfo create_on_image(const SandboxSpec& spec, const storage::Image& image) override;
  // The qcow2 overlay of a running sandbox (a build step keeps it as a layer).
  std::filesystem::path disk_path(const std::string& id) override;

  // Images (engine_images.cc; docs/design.md, "Images: import and
  // management"). The operator's business: the daemon serves them only over
  // the unix socket. list_images/inspect_image: storage::to_json(Image) +
  // "used_by" (["sandbox:ID", "pool:ID", "template:KEY", ...]).
  nlohmann::json list_images() override;
  nlohmann::json inspect_image(const std::string& name) override;  // + "versions"
  // An OCI layout / docker save archive becomes image `name` (oci_import.h).
  nlohmann::json import_image(const std::string& name, const std::filesystem::path& archive,
                              bool replace) override;
  // Error(conflict) naming every user while anything uses it.
  void remove_image(const std::string& name) override;
  // {"bytes": {"images", "layers", "snapshots", "templates", "overlays", "journals", "total"}}
  nlohmann::json disk_usage() override;
  // Frees what nothing uses: old image versions, orphaned cached layers,
  // leftovers of interrupted imports. {"dry_run", "freed_bytes", "removed": [...]}
  nlohmann::json prune(bool dry_run) override;
  std::vector<std::string> image_users(const std::string& name);
  // A sandbox's resource use now (engine_stats.cc): {"cpu_seconds" (QEMU's
  // user+system time), "memory_bytes" (QEMU's resident set), "disk_bytes"
  // (allocated bytes of its overlay), "net_rx_bytes", "net_tx_bytes" (its
  // network flows), "age_s"}. Error(not_found) for an unknown id.
  nlohmann::json stats(const std::string& id) override;

  // The engine's services (engine_impl.h); opaque outside the engine.
  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace airlock::engine

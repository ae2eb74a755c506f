// Engine construction, queries, the reaper thread and re-adoption after a
// daemon restart. create/destroy live in engine_lifecycle.cc, exec and file
// operations in exec/ (execs) and engine_files.cc.
#include "engine/engine.h"

#include <spdlog/spdlog.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "common/error.h"
#include "engine/engine_impl.h"
#include "engine/storage/digest.h"
#include "engine/types_json.h"
#include "engine/validate.h"
#include "protocol/messages.h"

#ifndef AIRLOCK_VERSION
#define AIRLOCK_VERSION "0.0.0"
#endif

namespace airlock::engine {

namespace fs = std::filesystem;

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

namespace {

// Fills in the defaults documented on Config and creates the data layout.
// Absolute, without "." or ".." parts or a trailing separator.
fs::path normal_dir(const fs::path& p) {
  fs::path n = fs::absolute(p).lexically_normal();
  if (n.filename().empty() && n.has_parent_path() && n != n.root_path()) n = n.parent_path();
  return n;
}

Config with_defaults(Config c) {
  if (c.data_dir.empty()) throw Error(Errc::invalid_argument, "data_dir must be set", "data_dir");
  c.data_dir = normal_dir(c.data_dir);
  std::error_code ec;
  fs::path exe_dir = fs::read_symlink("/proc/self/exe", ec).parent_path();
  if (c.image_dir.empty()) {
    const char* env = std::getenv("AIRLOCK_IMAGE_DIR");
    c.image_dir = env && *env ? fs::path(env) : c.data_dir / "images";
  }
  // The jail binds the lexically normal form of every path QEMU opens; QEMU
  // must be given that same form, or "images/x/../vmlinuz" is not there.
  c.image_dir = normal_dir(c.image_dir);
  if (c.share_dir.empty()) c.share_dir = (exe_dir / ".." / "share" / "airlock").lexically_normal();
  if (c.guest_agent.empty()) {
    // Binaries live in build/bin, test binaries in build/tests: look beside
    // the executable first, then in its sibling bin/.
    c.guest_agent = exe_dir / "airlock-guest";
    if (!fs::exists(c.guest_agent, ec))
      c.guest_agent = (exe_dir / ".." / "bin" / "airlock-guest").lexically_normal();
  }
  if (!c.accel.empty() && c.accel != "kvm" && c.accel != "tcg")
    throw Error(Errc::invalid_argument, "accel must be \"kvm\", \"tcg\" or empty (probe)", "accel");
  // As root every QEMU runs under a leased uid of this range: refuse to
  // start if any local user could become one (jail_ids.h).
  if (::geteuid() == 0) vmm::set_jail_ids(c.jail_ids);
  if (c.boot_timeout_s < 1 || c.boot_timeout_s > 3600)
    throw Error(Errc::invalid_argument, "boot_timeout_s must be between 1 and 3600",
                "boot_timeout_s");
  if (c.pool_cpu_weight < 1 || c.pool_cpu_weight > 10000)
    throw Error(
        Errc::invalid_argument,
        "pool_cpu_weight must be between 1 and 10000, not " + std::to_string(c.pool_cpu_weight),
        "pool_cpu_weight");
  if (c.journal_anchor_lag_ms < 0 || c.journal_anchor_lag_ms > 10000)
    throw Error(Errc::invalid_argument,
                "journal_anchor_lag_ms must be between 0 and 10000, not " +
                    std::to_string(c.journal_anchor_lag_ms),
                "journal_anchor_lag_ms");
  if (c.template_dir.empty()) c.template_dir = c.data_dir / "templates";
  if (c.template_ram_dir.empty()) {
    const char* env = std::getenv("AIRLOCK_TEMPLATE_RAM_DIR");
    if (env && *env) c.template_ram_dir = fs::absolute(env);
  }
  if (c.template_ram_dir.empty()) {
    // RAM files belong on tmpfs: their pages are then page cache that every
    // clone maps, never written back to a disk.
    std::string tag = storage::sha256_hex({c.data_dir.string()}).substr(0, 12);
    c.template_ram_dir = fs::is_directory("/dev/shm", ec)
                             ? fs::path("/dev/shm") / ("airlock-" + tag)
                             : c.template_dir / "ram";
  }
  // 0700: the registry holds env values, journals what sandboxes did, run
  // dirs their sockets. Existing ones made by older versions are tightened.
  for (const fs::path& d : {c.data_dir, c.data_dir / "sandboxes", c.data_dir / "audit"}) {
    fs::create_directories(d, ec);
    if (ec) throw Error(Errc::internal, "cannot create " + d.string() + ": " + ec.message());
    if (::chmod(d.c_str(), 0700) != 0)
      throw Error(Errc::internal, "cannot make " + d.string() + " 0700: " + std::strerror(errno));
  }
  return c;
}

}  // namespace

Engine::Impl::Impl(Config c)
    : cfg(with_defaults(std::move(c))),
      launcher(cfg.launcher ? cfg.launcher : qemu_launcher()),
      registry(cfg.data_dir / "registry.db"),
      // Heads anchored in the registry, signed with the host's key (made on
      // first start, 0600 like the data dir it is in).
      journal(cfg.data_dir / "audit", {cfg.journal_max_bytes, cfg.journal_reserve_bytes}, &registry,
              HostKey::load_or_create(cfg.data_dir / "journal-key.pem"),
              std::chrono::milliseconds(cfg.journal_anchor_lag_ms)),
      images(cfg.image_dir, cfg.share_dir / "images", cfg.guest_agent),
      admission([this] { return disk_free_mb(); }),
      starts(std::max(2, static_cast<int>(std::thread::hardware_concurrency()))),
      table(registry),
      templates(cfg, *launcher, journal, [this] { return disk_roots(); }) {
  snaps.emplace(cfg.data_dir / "snapshots");
  if (!cfg.accel.empty()) {
    accel = vmm::AccelVerdict{cfg.accel == "kvm" ? vmm::Accel::kvm : vmm::Accel::tcg,
                              "configured (accel=" + cfg.accel + ")", false};
  }
}

int64_t Engine::Impl::disk_free_mb() const {
  if (cfg.disk_free_mb) return cfg.disk_free_mb();
  struct statvfs st {};
  if (::statvfs(cfg.data_dir.c_str(), &st) != 0) return -1;  // unknown: do not refuse on it
  return static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize) / (1024 * 1024);
}

std::vector<fs::path> Engine::Impl::disk_roots() const {
  std::vector<fs::path> roots{cfg.image_dir};
  if (auto* t = templates.store()) roots.push_back(t->root());
  if (snaps) roots.push_back(snaps->store().root());
  return roots;
}

vmm::AccelVerdict Engine::Impl::resolve_accel(const storage::Image& img) {
  std::lock_guard lock(accel_mu);
  if (accel) return *accel;
  // The probe boots a real VM, so it needs a kernel and a disk: it runs at
  // startup if an image exists, else with the first image a create uses.
  fs::path work = cfg.data_dir / "probe";
  std::error_code ec;
  fs::create_directories(work, ec);
  fs::path disk = work / "probe-disk.qcow2";
  fs::remove(disk, ec);
  storage::create_overlay(img.rootfs, disk, static_cast<uint64_t>(min_disk_mb(img.rootfs_bytes)));
  vmm::AccelVerdict v;
  try {
    v = vmm::probe_accel({.kernel = img.kernel,
                          .initrd = img.initrd,
                          .disk = disk,
                          .work_dir = work,
                          .cache_file = cfg.data_dir / "accel.json"});
  } catch (...) {
    fs::remove(disk, ec);
    throw;
  }
  fs::remove(disk, ec);
  spdlog::info("accelerator: {} ({})", vmm::to_string(v.accel), v.reason);
  accel = v;
  return v;
}

bool Engine::Impl::teardown(Sandbox& sb, State state, const std::string& reason,
                            const std::string& event, const std::string& failure,
                            const nlohmann::json& details, std::optional<State> only_from) {
  const std::string id = sb.id();
  // Never under a running pause/resume/snapshot: wait for it to finish.
  std::lock_guard op(sb.op_mu);
  if (only_from && sb.state() != *only_from) return false;
  // The one owner of the stop: whoever moves the sandbox to `stopping`.
  // Everyone else (destroy racing the reaper, a pool drain) backs off.
  try {
    if (!sb.transition_any(State::stopping, {.reason = reason})) return false;
  } catch (const Error& e) {
    if (e.code() == Errc::conflict) return false;
    // The registry could not be written: the VM still must not outlive this.
    spdlog::error("sandbox {}: {}; stopping it anyway", id, e.what());
  } catch (const std::exception& e) {
    spdlog::error("sandbox {}: {}; stopping it anyway", id, e.what());
  }
  finish_stop(sb, state, reason, event, failure, details);
  return true;
}

void Engine::Impl::finish_stop(Sandbox& sb, State state, const std::string& reason,
                               const std::string& event, const std::string& failure,
                               const nlohmann::json& details) noexcept {
  const std::string id = sb.id();
  // Close first: every call waiting on the guest fails at once instead of
  // noticing the dead socket later.
  if (sb.channel) sb.channel->close("sandbox " + id + " is being stopped: " + reason);
  close_detached_execs(sb, reason);
  // The helper before the VM: it runs in the VM's cgroup, which the VM's
  // kill removes (and cannot while a process is in it).
  pid_t net_pid;
  {
    std::lock_guard lock(sb.mu);
    net_pid = sb.net_pid;
    sb.net_pid = 0;
  }
  if (sb.networked || net_pid > 0) nethost::stop(net_pid, sb.run_dir());
  sb.net_events.reset();  // after the kill: takes what the helper still wrote
  try {
    if (sb.vm) sb.vm->kill();
  } catch (const std::exception& e) {
    spdlog::error("sandbox {}: killing the VM failed: {}", id, e.what());
  }
  std::error_code ec;
  fs::remove_all(sb.run_dir(), ec);
  if (ec)
    spdlog::error("sandbox {}: removing {} failed: {}", id, sb.run_dir().string(), ec.message());
  fs::remove_all(paused_dir(id), ec);  // a paused sandbox's saved VM
  if (!sb.rec.info.spec.from.empty()) release_internal_snapshot(sb.rec.info.spec.from, id);
  {
    // Its disk is gone: the admission goes before the record that says the
    // teardown is complete (a background delete's end, engine_reclaim.cc).
    admission.release(id);
  }
  try {
    sb.transition(State::stopping, state,
                  {.reason = reason, .failure = failure, .event = event, .details = details});
  } catch (const std::exception& e) {
    spdlog::error("sandbox {}: recording {} failed: {}", id, to_string(state), e.what());
  }
  if (state == State::failed) metrics.failure(failure);
  {
    std::lock_guard lock(sb.mu);
    sb.execs.clear();
  }
  table.erase(id, &sb);
}

void Engine::Impl::stop_reaper() {
  {
    std::lock_guard lock(reaper_mu);
    reaper_stopping = true;
  }
  reaper_wake.notify_all();
  if (reaper.joinable()) reaper.join();
}

void Engine::Impl::reaper_loop() {
  std::unique_lock lock(reaper_mu);
  while (!reaper_stopping) {
    lock.unlock();
    // A snapshot of the table; every check (/proc, cgroups, sockets) runs
    // outside its lock, so no engine call waits for the reaper.
    std::vector<std::shared_ptr<Sandbox>> snapshot = table.all();
    int64_t now = steady_ms();
    // Wake at the earliest expiry, and at least every second to notice QEMU
    // processes that died on their own.
    int64_t next = now + 1000;
    // Every check is in check_health (engine_failure.cc): expiry, idle,
    // QEMU gone, channel closed, network helper, agent ping.
    std::vector<std::pair<std::shared_ptr<Sandbox>, Verdict>> victims;
    for (auto& sb : snapshot) {
      // A paused sandbox's timeout clock keeps running (engine.h, pause()).
      if (sb->state() == State::paused && now >= sb->expires_steady_ms.load()) {
        victims.emplace_back(sb, Verdict{State::timed_out, "", "timeout reached while paused",
                                         "timed_out", nlohmann::json::object()});
        continue;
      }
      if (sb->state() == State::paused)
        next = std::min<int64_t>(next, sb->expires_steady_ms.load());
      if (sb->state() != State::running) continue;
      std::optional<Verdict> v;
      try {
        v = check_health(sb, now);
      } catch (const std::exception& e) {
        spdlog::error("sandbox {}: health check failed: {}", sb->id(), e.what());
      }
      if (!v) {
        next = std::min<int64_t>(next, sb->expires_steady_ms.load());
        continue;
      }
      victims.emplace_back(sb, std::move(*v));
    }
    for (auto& [sb, v] : victims) {
      try {
        if (v.details.value("classify", false))
          v = classify_death(sb->run_dir(), sb->vm ? sb->vm->pid() : sb->rec.info.pid,
                             sb->memory_cgroup);
      } catch (const std::exception& e) {
        v = Verdict{State::failed, "vmm_died", std::string("the VM is gone: ") + e.what(), "failed",
                    nlohmann::json::object()};
      }
      spdlog::info("sandbox {}: {}{}", sb->id(), v.failure.empty() ? "" : v.failure + ": ",
                   v.reason);
      if (v.details.value("pause", false)) {
        // idle_timeout with on_idle "pause".
        std::lock_guard op(sb->op_mu);
        if (sb->state() != State::running) continue;
        try {
          pause_locked(*sb, v.reason);
        } catch (const std::exception& e) {
          spdlog::error("sandbox {}: idle pause failed: {}", sb->id(), e.what());
        }
        continue;
      }
      // Only if still in the state it was judged in (a pause may have begun).
      State seen = v.reason == "timeout reached while paused" ? State::paused : State::running;
      teardown(*sb, v.state, v.reason, v.event, v.failure, v.details, seen);
    }
    snapshot.clear();
    lock.lock();
    if (!victims.empty()) continue;  // re-evaluate: time has passed
    if (reaper_stopping) break;
    reaper_wake.wait_for(lock, std::chrono::milliseconds(std::max<int64_t>(next - steady_ms(), 1)));
  }
}

std::map<std::string, nlohmann::json> Engine::Impl::open_execs(const std::string& id) {
  std::vector<nlohmann::json> recs;
  try {
    recs = journal.read(id);
  } catch (const std::exception&) {
    return {};  // no journal yet
  }
  std::map<std::string, nlohmann::json> open;  // exec_id -> its start record
  for (const auto& r : recs) {
    if (!r.is_object() || !r.contains("exec_id") || !r["exec_id"].is_string()) continue;
    std::string ev = r.value("event", "");
    if (ev == "exec_start")
      open[r["exec_id"]] = r;
    else if (ev == "exec")
      open.erase(r["exec_id"].get<std::string>());
  }
  return open;
}

void Engine::Impl::close_interrupted_execs(const std::string& id) {
  for (const auto& [exec_id, start] : open_execs(id)) {
    nlohmann::json end{
        {"exec_id", exec_id},
        {"argv", start.value("argv", nlohmann::json::array())},
        {"reason", "interrupted"},
        {"interrupted", true},
        {"error", "the daemon stopped while the exec ran; its result was never seen"}};
    try {
      journal.append(id, "exec", end, Durability::sync);
    } catch (const std::exception& e) {
      spdlog::error("sandbox {}: audit: {}", id, e.what());
    }
  }
}

void Engine::Impl::close_detached_execs(Sandbox& sb, const std::string& why) {
  std::map<std::string, nlohmann::json> left;
  {
    std::lock_guard lock(sb.mu);
    left.swap(sb.detached_execs);
  }
  for (const auto& [exec_id, start] : left) {
    nlohmann::json end{{"exec_id", exec_id},
                       {"argv", start.value("argv", nlohmann::json::array())},
                       {"reason", "interrupted"},
                       {"interrupted", true},
                       {"error",
                        "it outlived a daemon restart and no client collected its "
                        "result before the sandbox ended (" +
                            why + ")"}};
    try {
      journal.append(sb.id(), "exec", end, Durability::sync);
    } catch (const std::exception& e) {
      spdlog::error("sandbox {}: audit: {}", sb.id(), e.what());
    }
  }
}

void Engine::Impl::recover_one(SandboxRecord rec) {
  const std::string id = rec.info.id;
  // Execs in flight when the previous daemon died: if the sandbox is
  // re-adopted they keep running in the guest, waiting for a client to
  // attach (attach_exec); otherwise they are closed as interrupted below.
  std::map<std::string, nlohmann::json> in_flight = open_execs(id);
  auto img = images.find(rec.info.spec.image);
  vmm::VmConfig vc;
  // The QEMU's name: its run dir's (a handed-out pool member keeps its
  // internal name there).
  vc.id = rec.run_dir.filename().string();
  vc.run_dir = rec.run_dir;
  if (img) {
    vc.kernel = img->kernel;
    vc.initrd = img->initrd;
  }
  vc.disk = rec.run_dir / "disk.qcow2";
  std::unique_ptr<VmHandle> vm;
  if (rec.info.pid > 0) {
    try {
      vm = launcher->adopt(vc, rec.info.pid);
    } catch (const std::exception& e) {
      spdlog::warn("sandbox {}: cannot adopt pid {}: {}", id, rec.info.pid, e.what());
    }
  }
  const State was = rec.info.state;
  auto sb = std::make_shared<Sandbox>(rec, registry, journal);
  if (img) {
    sb->image_env = img->config.env;
    sb->image_workdir = img->config.workdir;
    sb->image_user = img->config.user;
    sb->image_argv = img->config.entrypoint;
    sb->image_argv.insert(sb->image_argv.end(), img->config.cmd.begin(), img->config.cmd.end());
  }
  std::string reason, failure;
  nlohmann::json details = nlohmann::json::object();
  auto clean = [&](State state, const std::string& why, const std::string& event,
                   const std::string& fail) {
    sb->vm = std::move(vm);
    // A sandbox the previous daemon was already stopping is finished here.
    if (was == State::stopping)
      finish_stop(*sb, state, why, event, fail, details);
    else
      teardown(*sb, state, why, event, fail, details);
  };
  if (was == State::paused) {
    // Its VM is saved on disk (pause): it stays paused, resumable.
    adopt_paused(rec);
    return;
  }
  if (rec.info.spec.metadata.count(kPoolMarker)) {
    // An idle pool member of the previous daemon: nobody's sandbox.
    clean(State::deleted, "warm pool member dropped at daemon restart", "deleted", "");
    return;
  }
  if (was != State::running) {
    reason = "the daemon stopped while the sandbox was " + std::string(to_string(was));
  } else if (!vm || !vm->alive()) {
    // What the console and qemu.log say (its cgroup is not known here).
    Verdict v = classify_death(rec.run_dir, rec.info.pid, "");
    failure = v.failure;
    reason = v.reason + " (while the daemon was down)";
    details = v.details;
  } else {
    try {
      auto deadline = channel::Clock::now() + std::chrono::seconds(cfg.boot_timeout_s);
      sb->channel = channel::GuestChannel::connect(vm->agent_socket(), deadline);
      // resync: the previous daemon may have died in the middle of a frame.
      sb->channel->hello({.hostname = id, .resync = true, .network = nullptr}, deadline);
      sb->vm = std::move(vm);
      nlohmann::json adopted{{"pid", sb->vm->pid()}};
      if (sb->networked) {
        // Keep the helper if it survived with its VM; without it the VM
        // simply has a dead NIC (nothing gets out), which is recorded.
        pid_t np = nethost::read_pid(rec.run_dir);
        if (nethost::is_ours(np, rec.run_dir)) {
          sb->net_pid = np;
          adopted["net_pid"] = np;
          // Re-attach to its event stream: it queued what happened meanwhile.
          sb->net_events = nethost::attach_events(journal, id, rec.run_dir, np, &metrics);
        } else {
          adopted["net_pid"] = nullptr;
          spdlog::warn("sandbox {}: network helper is gone; the VM has no egress", id);
        }
      }
      // Deadlines continue on the steady clock from what is left of the life.
      sb->expires_steady_ms =
          steady_ms() + std::max<int64_t>(rec.info.expires_at_ms - wall_ms(), 0);
      if (!in_flight.empty()) adopted["detached_execs"] = in_flight.size();
      sb->detached_execs = std::move(in_flight);
      journal.append(id, "adopted", adopted, Durability::sync);
      spdlog::info("sandbox {}: re-adopted (pid {})", id, sb->vm->pid());
      admission.admit(id, rec.info.spec.disk_mb);
      table.put(id, sb);
      return;
    } catch (const std::exception& e) {
      reason = std::string("guest agent unreachable after daemon restart: ") + e.what();
      failure = "agent_lost";
      sb->channel.reset();
      if (sb->vm) vm = std::move(sb->vm);
    }
  }
  spdlog::warn("sandbox {}: cleaning up: {}", id, reason);
  close_interrupted_execs(id);
  clean(State::failed, reason, "failed", failure);
}

void Engine::Impl::recover() {
  // Concurrently: each re-adoption waits for its agent's hello (up to
  // boot_timeout_s), and one slow or dead guest must not hold up the rest.
  std::vector<SandboxRecord> recs = registry.list(/*all=*/false);
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i; (i = next++) < recs.size();) {
      try {
        recover_one(recs[i]);
      } catch (const std::exception& e) {
        spdlog::error("sandbox {}: recovery failed: {}", recs[i].info.id, e.what());
      }
    }
  };
  std::vector<std::thread> workers;
  size_t n = std::min<size_t>(recs.size(), 32);
  for (size_t i = 0; i < n; ++i) workers.emplace_back(worker);
  for (auto& t : workers) t.join();
}

Engine::Engine(Config config) : impl_(std::make_unique<Impl>(std::move(config))) {
  // The configured pool is checked before any thread runs: a bad image
  // name is an Error for the caller (airlockd exits with it), not a
  // std::terminate from a joinable thread unwinding.
  for (const auto& [image, size] : impl_->cfg.pool) set_pool(image, size);
  impl_->recover();
  // Probe now if an image exists, so info() can say which accelerator and
  // why; otherwise the first create() probes.
  if (!impl_->accel) {
    try {
      for (const auto& img : impl_->images.list()) {
        impl_->resolve_accel(img);
        break;
      }
    } catch (const std::exception& e) {
      spdlog::warn("accelerator probe deferred: {}", e.what());
    }
  }
  impl_->reaper = std::thread([this] { impl_->reaper_loop(); });
  try {
    impl_->pool.start();
  } catch (...) {
    impl_->stop_reaper();
    throw;
  }
}

Engine::~Engine() {
  // Pool members are nobody's sandboxes yet: they do not outlive the engine.
  impl_->pool.stop();
  // Deletes already answered finish before the engine goes.
  impl_->reclaimer.drain();
  impl_->stop_reaper();
  // Sandboxes keep running: Vm's destructor detaches, the next Engine on
  // this data_dir re-adopts them.
  impl_->table.close_all("engine shut down");
}

std::vector<SandboxInfo> Engine::list(const std::map<std::string, std::string>& filter, bool all) {
  std::vector<SandboxInfo> out;
  for (auto& rec : impl_->registry.list(all)) {
    if (rec.info.spec.metadata.count(kPoolMarker)) continue;  // not handed out: nobody's
    if (impl_->reclaimer.deleted_view(rec.info) && !all) continue;
    bool match = true;
    for (const auto& [k, v] : filter) {
      auto it = rec.info.spec.metadata.find(k);
      if (it == rec.info.spec.metadata.end() || it->second != v) match = false;
    }
    if (match) out.push_back(std::move(rec.info));
  }
  return out;
}

SandboxInfo Engine::get(const std::string& id) {
  auto rec = impl_->registry.get(id);
  if (!rec) throw Error(Errc::not_found, "no sandbox " + id, "id");
  impl_->reclaimer.deleted_view(rec->info);
  return rec->info;
}

std::vector<nlohmann::json> Engine::audit(const std::string& id) { return impl_->journal.read(id); }
JournalStats Engine::journal_stats(const std::string& id) { return impl_->journal.stats(id); }

storage::ImageStore& Engine::images() { return impl_->images; }

std::vector<fs::path> Engine::disk_roots() { return impl_->disk_roots(); }

nlohmann::json Engine::info() {
  nlohmann::json j{{"version", AIRLOCK_VERSION}};
  j["data_dir"] = impl_->cfg.data_dir.string();  // `airlock probe` checks run dirs under it
  auto imgs = impl_->images.list();
  if (!impl_->accel && !imgs.empty()) {
    try {
      impl_->resolve_accel(imgs.front());
    } catch (const std::exception& e) {
      spdlog::warn("accelerator probe failed: {}", e.what());
    }
  }
  {
    std::lock_guard lock(impl_->accel_mu);
    if (impl_->accel) {
      j["accelerator"] = vmm::to_string(impl_->accel->accel);
      j["accelerator_reason"] = impl_->accel->reason;
    } else {
      j["accelerator"] = nullptr;
      j["accelerator_reason"] = "not probed yet: no image is built";
    }
  }
  j["images"] = nlohmann::json::array();
  for (const auto& img : imgs) {
    j["images"].push_back({{"name", img.name},
                           {"key", img.key},
                           {"kernel_release", img.kernel_release},
                           {"rootfs_bytes", img.rootfs_bytes},
                           {"built_at", img.built_at}});
  }
  j["recipes"] = impl_->images.recipes();
  j["templates"] = nlohmann::json::array();
  if (auto* store = impl_->templates.store())
    for (const auto& t : store->list()) j["templates"].push_back(templates::to_json(t));
  j["templates_enabled"] = impl_->cfg.templates;
  j["pool"] = pool_info();
  j["pool_learn"] = {{"shapes", impl_->cfg.pool_learn_shapes},
                     {"memory_mb", impl_->cfg.pool_learn_memory_mb},
                     {"idle_s", impl_->cfg.pool_learn_idle_s}};
  return j;
}

// Execs: the exec room (exec/service.h) does the work.
ExecResult Engine::exec(const std::string& id, const ExecRequest& request,
                        const ExecCallbacks& callbacks) {
  return impl_->execs.run(id, request, callbacks);
}
ExecStatus Engine::exec_background(const std::string& id, const ExecRequest& request) {
  return impl_->execs.start_background(id, request);
}
void Engine::kill_exec(const std::string& id, const std::string& exec_id, int signal) {
  impl_->execs.kill(id, exec_id, signal);
}
std::vector<ExecStatus> Engine::list_execs(const std::string& id) { return impl_->execs.list(id); }
ExecStatus Engine::wait_exec(const std::string& id, const std::string& exec_id, double timeout_s) {
  return impl_->execs.wait(id, exec_id, timeout_s);
}
std::optional<ExecResult> Engine::attach_exec(const std::string& id, const std::string& exec_id,
                                              uint64_t offset, const AttachCallbacks& callbacks) {
  return impl_->execs.attach_exec(id, exec_id, offset, callbacks);
}
StdinWrite Engine::write_stdin(const std::string& id, const std::string& exec_id,
                               const ChunkSource& source, bool eof,
                               const std::function<bool()>& cancelled) {
  return impl_->execs.write_stdin(id, exec_id, source, eof, cancelled);
}
void Engine::pty_input(const std::string& id, const std::string& exec_id, std::string_view bytes) {
  impl_->execs.pty_input(id, exec_id, bytes);
}
void Engine::pty_resize(const std::string& id, const std::string& exec_id, int cols, int rows) {
  impl_->execs.pty_resize(id, exec_id, cols, rows);
}

}  // namespace airlock::engine

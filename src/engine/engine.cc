// Engine construction, queries, the reaper thread and re-adoption after a
// daemon restart. create/destroy live in engine_lifecycle.cc, exec and file
// operations in engine_ops.cc.
#include "engine/engine.h"

#include <spdlog/spdlog.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>

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

std::string random_id(const std::string& prefix) {
  char bytes[6];
  size_t got = 0;
  while (got < sizeof bytes) {
    ssize_t n = ::getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno("getrandom");
    got += static_cast<size_t>(n);
  }
  return prefix + protocol::to_hex(std::string_view(bytes, sizeof bytes));
}

namespace {

// Fills in the defaults documented on Config and creates the data layout.
Config with_defaults(Config c) {
  if (c.data_dir.empty()) throw Error(Errc::invalid_argument, "data_dir must be set", "data_dir");
  c.data_dir = fs::absolute(c.data_dir);
  std::error_code ec;
  fs::path exe_dir = fs::read_symlink("/proc/self/exe", ec).parent_path();
  if (c.image_dir.empty()) {
    const char* env = std::getenv("AIRLOCK_IMAGE_DIR");
    c.image_dir = env && *env ? fs::path(env) : c.data_dir / "images";
  }
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
  if (c.boot_timeout_s < 1 || c.boot_timeout_s > 3600)
    throw Error(Errc::invalid_argument, "boot_timeout_s must be between 1 and 3600",
                "boot_timeout_s");
  if (c.template_dir.empty()) c.template_dir = c.data_dir / "templates";
  if (c.template_ram_dir.empty()) {
    const char* env = std::getenv("AIRLOCK_TEMPLATE_RAM_DIR");
    if (env && *env) c.template_ram_dir = fs::absolute(env);
  }
  if (c.template_ram_dir.empty()) {
    // RAM files belong on tmpfs: their pages are then page cache that every
    // clone maps, never written back to a disk.
    std::string tag = storage::sha256_hex({c.data_dir.string()}).substr(0, 12);
    c.template_ram_dir = fs::is_directory("/dev/shm", ec) ? fs::path("/dev/shm") / ("airlock-" + tag)
                                                          : c.template_dir / "ram";
  }
  for (const fs::path& d : {c.data_dir, c.data_dir / "sandboxes", c.data_dir / "audit"}) {
    fs::create_directories(d, ec);
    if (ec) throw Error(Errc::internal, "cannot create " + d.string() + ": " + ec.message());
  }
  return c;
}

}  // namespace

Engine::Impl::Impl(Config c)
    : cfg(with_defaults(std::move(c))),
      registry(cfg.data_dir / "registry.db"),
      journal(cfg.data_dir / "audit", {cfg.journal_max_bytes, cfg.journal_reserve_bytes}),
      images(cfg.image_dir, cfg.share_dir / "images", cfg.guest_agent) {
  if (cfg.templates) templates.emplace(cfg.template_dir, cfg.template_ram_dir);
  if (!cfg.accel.empty()) {
    accel = vmm::AccelVerdict{cfg.accel == "kvm" ? vmm::Accel::kvm : vmm::Accel::tcg,
                              "configured (accel=" + cfg.accel + ")", false};
  }
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

std::shared_ptr<Live> Engine::Impl::running(const std::string& id) {
  {
    std::lock_guard lock(mu);
    auto it = live.find(id);
    if (it != live.end()) {
      std::lock_guard sl(it->second->mu);
      if (it->second->state == State::running) {
        it->second->last_activity_ms = now_ms();  // any call counts for idle_timeout
        return it->second;
      }
      throw Error(Errc::conflict,
                  "sandbox " + id + " is " + to_string(it->second->state) + ", not running");
    }
  }
  auto rec = registry.get(id);
  if (!rec) throw Error(Errc::not_found, "no sandbox " + id, "id");
  std::string why = rec->info.reason.empty() ? "" : " (" + rec->info.reason + ")";
  if (!rec->info.failure.empty()) why = " (" + rec->info.failure + ": " + rec->info.reason + ")";
  // "running" in the registry but not live: the reaper or destroy() is
  // tearing it down right now.
  std::string state = rec->info.state == State::running ? "stopping" : to_string(rec->info.state);
  throw Error(Errc::conflict, "sandbox " + id + " is " + state + why + ", not running");
}

void Engine::Impl::teardown(Live& sb, State state, const std::string& reason,
                            const std::string& event, const std::string& failure,
                            const nlohmann::json& details) {
  const std::string& id = sb.rec.info.id;
  {
    std::lock_guard lock(sb.mu);
    sb.state = State::stopping;
  }
  // Close first: every call waiting on the guest fails at once instead of
  // noticing the dead socket later.
  if (sb.channel) sb.channel->close("sandbox " + id + " is being stopped: " + reason);
  try {
    if (sb.vm) sb.vm->kill();
  } catch (const std::exception& e) {
    spdlog::error("sandbox {}: killing QEMU failed: {}", id, e.what());
  }
  // The helper exits by itself once QEMU's connection closes; killing it
  // explicitly also covers a helper whose QEMU never connected.
  if (network_enabled(sb.rec.info.spec.network) || sb.net_pid > 0)
    kill_net_helper(sb.net_pid, sb.rec.run_dir);
  sb.net_pid = 0;
  std::error_code ec;
  fs::remove_all(sb.rec.run_dir, ec);
  if (ec)
    spdlog::error("sandbox {}: removing {} failed: {}", id, sb.rec.run_dir.string(), ec.message());
  try {
    registry.set_state(id, state, reason, failure);
  } catch (const std::exception& e) {
    spdlog::error("sandbox {}: registry update failed: {}", id, e.what());
  }
  try {
    nlohmann::json ev = details.is_object() ? details : nlohmann::json::object();
    ev["reason"] = reason;
    if (!failure.empty()) ev["failure"] = failure;
    journal.append(id, event, ev, Durability::sync);
  } catch (const std::exception& e) {
    spdlog::error("sandbox {}: audit append failed: {}", id, e.what());
  }
  {
    std::lock_guard lock(sb.mu);
    sb.state = state;
    sb.failure = state == State::failed ? failure : std::string();
    sb.end_reason = reason;
    sb.execs.clear();
  }
  sb.ended.notify_all();  // calls that lost the guest name the cause (engine_ops.cc)
}

void Engine::Impl::reaper_loop() {
  std::unique_lock lock(mu);
  while (!stopping) {
    int64_t now = now_ms();
    // Wake at the earliest expiry, and at least every second to notice QEMU
    // processes that died on their own.
    int64_t next = now + 1000;
    // Every check is in check_health (engine_failure.cc): expiry, idle,
    // QEMU gone, channel closed, network helper, agent ping.
    std::vector<std::pair<std::shared_ptr<Live>, Verdict>> victims;
    for (auto it = live.begin(); it != live.end();) {
      auto& sb = it->second;
      std::optional<Verdict> v;
      try {
        v = check_health(sb, now);
      } catch (const std::exception& e) {
        spdlog::error("sandbox {}: health check failed: {}", it->first, e.what());
      }
      if (!v) {
        next = std::min(next, sb->rec.info.expires_at_ms);
        ++it;
        continue;
      }
      victims.emplace_back(sb, std::move(*v));
      it = live.erase(it);
    }
    if (!victims.empty()) {
      lock.unlock();
      for (auto& [sb, v] : victims) {
        if (v.details.value("classify", false))
          v = classify_death(sb->rec.run_dir, sb->vm ? sb->vm->pid() : sb->rec.info.pid,
                             sb->memory_cgroup);
        spdlog::info("sandbox {}: {}{}", sb->rec.info.id,
                     v.failure.empty() ? "" : v.failure + ": ", v.reason);
        teardown(*sb, v.state, v.reason, v.event, v.failure, v.details);
      }
      lock.lock();
      continue;  // re-evaluate: time has passed
    }
    wake.wait_for(lock, std::chrono::milliseconds(std::max<int64_t>(next - now_ms(), 1)));
  }
}

void Engine::Impl::recover() {
  for (auto& rec : registry.list(/*all=*/false)) {
    const std::string& id = rec.info.id;
    auto img = images.find(rec.info.spec.image);
    vmm::VmConfig vc;
    vc.id = id;
    vc.run_dir = rec.run_dir;
    if (img) {
      vc.kernel = img->kernel;
      vc.initrd = img->initrd;
    }
    vc.disk = rec.run_dir / "disk.qcow2";
    std::unique_ptr<vmm::Vm> vm;
    if (rec.info.pid > 0) {
      try {
        vm = vmm::Vm::adopt(vc, rec.info.pid);
      } catch (const std::exception& e) {
        spdlog::warn("sandbox {}: cannot adopt pid {}: {}", id, rec.info.pid, e.what());
      }
    }
    auto sb = std::make_shared<Live>();
    sb->rec = rec;
    std::string reason, failure;
    nlohmann::json details = nlohmann::json::object();
    if (rec.info.spec.metadata.count(kPoolMarker)) {
      // An idle pool member of the previous daemon: nobody's sandbox.
      sb->vm = std::move(vm);
      teardown(*sb, State::deleted, "warm pool member dropped at daemon restart", "deleted");
      continue;
    }
    if (rec.info.state != State::running) {
      reason = "the daemon stopped while the sandbox was " + std::string(to_string(rec.info.state));
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
        if (network_enabled(rec.info.spec.network)) {
          // Keep the helper if it survived with its VM; without it the VM
          // simply has a dead NIC (nothing gets out), which is recorded.
          pid_t np = read_net_pid(rec.run_dir);
          if (is_our_net_helper(np, rec.run_dir)) {
            sb->net_pid = np;
            adopted["net_pid"] = np;
          } else {
            adopted["net_pid"] = nullptr;
            spdlog::warn("sandbox {}: network helper is gone; the VM has no egress", id);
          }
        }
        journal.append(id, "adopted", adopted, Durability::sync);
        spdlog::info("sandbox {}: re-adopted (pid {})", id, sb->vm->pid());
        std::lock_guard lock(mu);
        live[id] = sb;
        continue;
      } catch (const std::exception& e) {
        reason = std::string("guest agent unreachable after daemon restart: ") + e.what();
        failure = "agent_lost";
        sb->channel.reset();
      }
    }
    sb->vm = std::move(vm);
    spdlog::warn("sandbox {}: cleaning up: {}", id, reason);
    teardown(*sb, State::failed, reason, "failed", failure, details);
  }
}

Engine::Engine(Config config) : impl_(std::make_unique<Impl>(std::move(config))) {
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
  for (const auto& [image, size] : impl_->cfg.pool) set_pool(image, size);
  impl_->pool_thread = std::thread([this] { impl_->pool_loop(); });
}

Engine::~Engine() {
  {
    std::lock_guard lock(impl_->pool_mu);
    impl_->pool_stopping = true;
  }
  impl_->pool_wake.notify_all();
  if (impl_->pool_thread.joinable()) impl_->pool_thread.join();
  // Pool members are nobody's sandboxes yet: they do not outlive the engine.
  impl_->drain_pool();
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->wake.notify_all();
  if (impl_->reaper.joinable()) impl_->reaper.join();
  // Sandboxes keep running: Vm's destructor detaches, the next Engine on
  // this data_dir re-adopts them.
  std::lock_guard lock(impl_->mu);
  for (auto& [id, sb] : impl_->live) {
    if (sb->channel) sb->channel->close("engine shut down");
  }
  impl_->live.clear();
}

std::vector<SandboxInfo> Engine::list(const std::map<std::string, std::string>& filter, bool all) {
  std::vector<SandboxInfo> out;
  for (auto& rec : impl_->registry.list(all)) {
    if (rec.info.spec.metadata.count(kPoolMarker)) continue;  // not handed out: nobody's
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
  return rec->info;
}

std::vector<nlohmann::json> Engine::audit(const std::string& id) { return impl_->journal.read(id); }
JournalStats Engine::journal_stats(const std::string& id) { return impl_->journal.stats(id); }

storage::ImageStore& Engine::images() { return impl_->images; }

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
  if (impl_->templates)
    for (const auto& t : impl_->templates->list()) j["templates"].push_back(templates::to_json(t));
  j["templates_enabled"] = impl_->cfg.templates;
  j["pool"] = pool_info();
  return j;
}

}  // namespace airlock::engine

// Pause and resume (docs/design.md, "Snapshots, fork, pause"): a paused
// sandbox is its disk (still in its run dir) plus its whole VM state saved
// under data_dir/paused/<id>, with no QEMU, no CPU and no RAM. The paused
// dir is the daemon's own (0700), never the jail-writable run dir, so the
// state QEMU later loads is one QEMU could not have swapped.
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <chrono>
#include <csignal>
#include <fstream>
#include <thread>

#include "common/error.h"
#include "engine/engine_impl.h"
#include "engine/storage/digest.h"

namespace airlock::engine {

namespace fs = std::filesystem;

void Engine::Impl::kill_foreground_execs(Sandbox& sb, std::chrono::milliseconds wait) {
  std::vector<uint32_t> streams;
  {
    std::lock_guard lock(sb.mu);
    for (const auto& [exec_id, stream] : sb.execs) streams.push_back(stream);
  }
  if (streams.empty() || !sb.channel) return;
  for (uint32_t stream : streams) {
    try {
      sb.channel->signal(stream, SIGKILL);
    } catch (const std::exception& e) {
      spdlog::warn("sandbox {}: kill of an exec before pause: {}", sb.id(), e.what());
    }
  }
  auto until = std::chrono::steady_clock::now() + wait;
  while (std::chrono::steady_clock::now() < until) {
    {
      std::lock_guard lock(sb.mu);
      if (sb.execs.empty()) return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // Not reported in time: closing the channel ends those calls (typed). A
  // detachable exec the SIGKILL did not end is parked by the guest (not
  // killed) and continues after resume, re-attachable by its exec_id.
  spdlog::warn("sandbox {}: execs did not end within {} ms of SIGKILL before pause", sb.id(),
               wait.count());
}

void Engine::Impl::pause_locked(Sandbox& sb, const std::string& reason) {
  const std::string id = sb.id();
  auto t0 = std::chrono::steady_clock::now();
  sb.transition(State::running, State::pausing, {.reason = reason, .event = "pausing"});
  fs::path dir = paused_dir(id);
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir, ec);
  ::chmod(dir.parent_path().c_str(), 0700);
  ::chmod(dir.c_str(), 0700);
  // A foreground exec does not survive a pause (docs/design.md): its
  // stream cannot outlive this channel (the guest aborts a pty exec, and
  // parks a detachable one, when the host goes). So it is ended here, before
  // the save, where it is seen: SIGKILL, then wait for its call to return
  // (exec() turns the result into the typed conflict "paused during the
  // call"). Background execs are the guest's jobs: frozen and continued.
  kill_foreground_execs(sb, std::chrono::seconds(10));
  // Other calls on the guest end now, typed (sandbox.h rethrow_guest_failure).
  if (sb.channel) sb.channel->close("sandbox " + id + " is being paused");
  uint64_t bytes = 0;
  std::string sha;
  try {
    if (ec) throw Error(Errc::internal, "cannot create " + dir.string() + ": " + ec.message());
    try {
      bytes = sb.vm->save_memory(dir / "mem.state", std::chrono::seconds(120));
    } catch (const Error&) {
      rethrow_if_disk_full(dir, (dir / "mem.state").string(), 0);
      throw;
    }
    sha = storage::sha256_file(dir / "mem.state");
    nlohmann::json meta{{"size", bytes},
                        {"sha256", sha},
                        {"ram_block", sb.vm->ram_block()},
                        {"saved_at_ms", wall_ms()}};
    std::ofstream out(dir / "paused.json", std::ios::trunc);
    out << meta.dump() << "\n";
    out.close();
    if (!out) throw Error(Errc::unavailable, "cannot write " + (dir / "paused.json").string());
  } catch (const std::exception& e) {
    // Nothing is paused: the VM continues where it stopped, with a new channel.
    fs::remove_all(dir, ec);
    std::string why = e.what();
    Errc code = Errc::internal;
    if (auto* err = dynamic_cast<const Error*>(&e)) code = err->code();
    try {
      sb.vm->resume_cpus();
      auto deadline = channel::Clock::now() + std::chrono::seconds(cfg.boot_timeout_s);
      auto ch = channel::GuestChannel::connect(sb.vm->agent_socket(), deadline);
      ch->hello({.hostname = id, .resync = true, .network = nullptr}, deadline);
      sb.old_channels.push_back(std::move(sb.channel));
      sb.channel = std::move(ch);
      sb.transition(State::pausing, State::running,
                    {.event = "pause_failed", .details = {{"error", why}}});
    } catch (const std::exception& e2) {
      teardown(sb, State::failed,
               "pause failed (" + why + ") and the VM could not continue: " + e2.what(), "failed",
               "agent_lost");
    }
    throw Error(code == Errc::timeout ? Errc::timeout : code,
                "pausing sandbox " + id + " failed: " + why);
  }
  // The NIC's helper goes with QEMU (QEMU connects to it once); resume
  // starts a new one.
  pid_t np;
  {
    std::lock_guard lock(sb.mu);
    np = sb.net_pid;
    sb.net_pid = 0;
  }
  if (sb.networked || np > 0) nethost::stop(np, sb.run_dir());
  sb.net_events.reset();
  try {
    sb.vm->kill();
  } catch (const std::exception& e) {
    spdlog::error("sandbox {}: kill after pause: {}", id, e.what());
  }
  sb.vm.reset();
  int64_t took = ms_since(t0);
  sb.transition(State::pausing, State::paused,
                {.reason = reason,
                 .event = "paused",
                 .details = {{"state_bytes", bytes}, {"took_ms", took}},
                 .pid = 0});
  metrics.snapshot_op("pause", took / 1000.0);
}

SandboxInfo Engine::pause(const std::string& id) {
  auto& impl = *impl_;
  auto sb = impl.table.live(id);
  std::lock_guard op(sb->op_mu);
  State st = sb->state();
  if (st != State::running)
    throw Error(Errc::conflict, "sandbox " + id + " is " + to_string(st) + ", not running");
  impl.pause_locked(*sb, "paused by request");
  return sb->info();
}

SandboxInfo Engine::resume(const std::string& id) {
  auto& impl = *impl_;
  auto sb = impl.table.live(id);
  std::lock_guard op(sb->op_mu);
  State st = sb->state();
  if (st != State::paused)
    throw Error(Errc::conflict, "sandbox " + id + " is " + to_string(st) + ", not paused");
  auto t0 = std::chrono::steady_clock::now();
  fs::path dir = impl.paused_dir(id);
  nlohmann::json meta;
  {
    std::ifstream in(dir / "paused.json");
    try {
      meta = nlohmann::json::parse(in);
    } catch (const std::exception& e) {
      throw Error(Errc::unavailable,
                  "sandbox " + id + ": its saved VM is damaged (paused.json: " + e.what() + ")");
    }
  }
  // Checked before QEMU sees it: a truncated or altered state is refused.
  std::error_code ec;
  uint64_t size = fs::file_size(dir / "mem.state", ec);
  if (ec || size != meta.value("size", uint64_t{0}) ||
      storage::sha256_file(dir / "mem.state") != meta.value("sha256", ""))
    throw Error(Errc::unavailable, "sandbox " + id +
                                       ": its saved VM state (mem.state) is missing, truncated "
                                       "or altered; it cannot be resumed");
  const SandboxInfo info = sb->info();
  auto img = impl.images.find(info.spec.image);
  if (!img && !info.spec.from.empty()) {
    if (auto snap = impl.snaps->store().find(info.spec.from)) img = impl.images.find(snap->image);
  }
  if (!img)
    throw Error(Errc::unavailable, "sandbox " + id + ": image " + info.spec.image + " is gone");
  vmm::VmConfig vc;
  vc.id = sb->run_name();  // a handed-out pool member's QEMU keeps its internal name
  vc.run_dir = sb->run_dir();
  vc.kernel = img->kernel;
  vc.initrd = img->initrd;
  vc.disk = sb->run_dir() / "disk.qcow2";
  vc.disk_roots = impl_->disk_roots();
  vc.cpus = info.spec.cpus;
  vc.memory_mb = info.spec.memory_mb;
  vc.accel = info.accel == "kvm" ? vmm::Accel::kvm : vmm::Accel::tcg;
  vc.tcg_tb_size_mb = impl.cfg.tcg_tb_size_mb;
  vc.incoming_state = dir / "mem.state";
  vc.incoming_full = true;
  vc.ram_block = meta.value("ram_block", "");
  std::unique_ptr<VmHandle> vm;
  std::unique_ptr<channel::GuestChannel> ch;
  pid_t np = 0;
  std::shared_ptr<nethost::EventReader> events;
  ScopeGuard undo([&] {
    ch.reset();
    if (np > 0) nethost::stop(np, sb->run_dir());
    events.reset();
    if (vm) {
      try {
        vm->kill();
      } catch (const std::exception& e) {
        spdlog::error("sandbox {}: kill after failed resume: {}", id, e.what());
      }
    }
  });
  if (sb->networked) {
    np = nethost::start(impl.cfg.guest_agent, sb->run_dir(), sb->network());
    events = nethost::attach_events(impl.journal, id, sb->run_dir(), np, &impl.metrics);
    vc.net_socket = sb->run_dir() / "net.sock";
    vc.net_mac = nethost::mac_for(id);
  }
  vm = impl.launcher->start(vc);
  auto deadline = channel::Clock::now() + std::chrono::seconds(impl.cfg.boot_timeout_s);
  ch = channel::GuestChannel::connect(vm->agent_socket(), deadline);
  channel::HelloParams hello;
  hello.hostname = id;
  hello.resync = true;  // saved with its channel open
  if (sb->networked) hello.network = nethost::hello_network(id);
  ch->hello(hello, deadline);
  impl.registry.set_pid(id, vm->pid());
  if (sb->channel) sb->old_channels.push_back(std::move(sb->channel));
  sb->channel = std::move(ch);
  sb->vm = std::move(vm);
  {
    std::lock_guard lock(sb->mu);
    sb->net_pid = np;
  }
  sb->net_events = std::move(events);
  np = 0;
  int64_t took = ms_since(t0);
  try {
    sb->transition(State::paused, State::running,
                   {.event = "resumed", .details = {{"took_ms", took}}, .pid = sb->vm->pid()});
  } catch (...) {
    // Not committed: give the VM back to the guard.
    vm = std::move(sb->vm);
    ch = std::move(sb->channel);
    throw;
  }
  undo.dismiss();
  sb->last_activity_ms = steady_ms();
  sb->last_ping_ms = 0;
  fs::remove_all(dir, ec);
  impl.metrics.snapshot_op("resume", took / 1000.0);
  impl.reaper_wake.notify_all();
  return sb->info();
}

void Engine::Impl::adopt_paused(const SandboxRecord& rec) {
  auto sb = std::make_shared<Sandbox>(rec, registry, journal);
  sb->expires_steady_ms = steady_ms() + std::max<int64_t>(rec.info.expires_at_ms - wall_ms(), 0);
  try {
    journal.append(rec.info.id, "adopted", {{"state", "paused"}}, Durability::sync);
  } catch (const std::exception& e) {
    spdlog::error("sandbox {}: audit: {}", rec.info.id, e.what());
  }
  admission.admit(rec.info.id, rec.info.spec.disk_mb);
  table.put(rec.info.id, sb);
  spdlog::info("sandbox {}: re-adopted, paused", rec.info.id);
}

}  // namespace airlock::engine

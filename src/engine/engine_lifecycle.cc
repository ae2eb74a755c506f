// create() and destroy(): the boot watchdog and the guarantee that a failed
// create leaves nothing behind (no QEMU, no run dir, no overlay).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <fstream>

#include "common/error.h"
#include "common/phases.h"
#include "engine/engine.h"
#include "engine/engine_impl.h"
#include "engine/trace.h"
#include "engine/types_json.h"
#include "engine/validate.h"
#include "engine/vmm/cgroup.h"

namespace airlock::engine {

namespace fs = std::filesystem;

namespace {

constexpr int kBootAttempts = 2;  // the watchdog retries a failed boot once

// The network helper joins its sandbox's cgroup (the jail's, named after
// the id), so its memory, cpu and pids count against the sandbox's limits.
// Without a jail cgroup (e.g. no cgroup delegation) it stays where it is.
void move_net_helper_to_cgroup(Sandbox& sb) {
  pid_t np;
  {
    std::lock_guard lock(sb.mu);
    np = sb.net_pid;
  }
  if (np <= 0 || !sb.vm) return;
  try {
    nlohmann::json paths = vmm::read_cgroup_limits(sb.vm->pid()).value("paths", nlohmann::json());
    if (!paths.is_object()) return;
    for (const auto& [controller, p] : paths.items()) {
      if (!p.is_string()) continue;
      std::string dir = p.get<std::string>();
      if (dir.find("/airlock/" + sb.id()) == std::string::npos) continue;
      std::ofstream procs(dir + "/cgroup.procs");
      procs << np << "\n";
      procs.flush();
      if (!procs) spdlog::warn("sandbox {}: cannot move the network helper into {}", sb.id(), dir);
    }
  } catch (const std::exception& e) {
    spdlog::warn("sandbox {}: network helper cgroup: {}", sb.id(), e.what());
  }
}

// The boot's disk: a clone's copy of its template's empty overlay (backing:
// the template's frozen disk), a fresh overlay over a snapshot's read-only
// layer, or over the image's rootfs; and what QEMU loads with it (a
// template's or a memory snapshot's state and RAM). Returns the sealed RAM
// QEMU maps, if any: held until QEMU has its own copy of the fd.
std::shared_ptr<vmm::SealedRam> prepare_disk(Engine::Impl& impl, vmm::VmConfig& vc,
                                             const storage::Image& img,
                                             const templates::Template* tpl,
                                             const snapshots::Snapshot* from, const fs::path& disk,
                                             int disk_mb) {
  std::shared_ptr<vmm::SealedRam> sealed;
  if (tpl) {
    // A clone: the template's empty overlay (backing: the template's
    // frozen disk), its RAM mapped copy-on-write, its device state loaded.
    fs::copy_file(tpl->clone, disk);
    fs::permissions(disk, fs::perms::owner_read | fs::perms::owner_write);
    vc.memory_file = tpl->ram;
    vc.memory_shared = false;
    sealed = impl.templates.sealed_ram(*tpl);
    vc.memory_fd = sealed->fd();
    vc.incoming_state = tpl->state;
  } else if (from) {
    // A snapshot: a fresh overlay over its read-only layer; a memory
    // snapshot also brings the whole VM (its own RAM, no template).
    storage::create_overlay(from->layer(), disk, static_cast<uint64_t>(disk_mb), "qcow2");
    if (from->memory) {
      vc.incoming_state = from->mem_state();
      vc.incoming_full = true;
      vc.ram_block = from->ram_block;
      if (from->files.contains("dev.state")) {
        // A fork: the source's RAM mapped copy-on-write, device state only.
        sealed = impl.snaps->fork_ram(from->name);
        if (!sealed)
          throw Error(Errc::unavailable, "the memory of fork snapshot " + from->name + " is gone");
        vc.memory_fd = sealed->fd();
        vc.incoming_state = from->dir / "dev.state";
      }
    }
  } else {
    // A build layer (recipes/builder.cc) is a qcow2 file; images are raw.
    storage::create_overlay(img.rootfs, disk, static_cast<uint64_t>(disk_mb),
                            img.rootfs.extension() == ".qcow2" ? "qcow2" : "raw");
  }
  return sealed;
}

// The hello of a new boot: its hostname and a fresh machine id; a memory
// snapshot was saved with its channel open, so the guest may be in the
// middle of a frame (resync). No resync for a clone: the template's host
// closed its channel after a complete hello exchange, so the saved guest is
// between frames. The network: slirp's fixed addresses (v4 and v6) and this
// sandbox's own MAC (a clone would otherwise keep the template's).
channel::HelloParams hello_for(const std::string& id, const snapshots::Snapshot* from,
                               bool networked) {
  channel::HelloParams hello;
  hello.hostname = id;
  hello.resync = from && from->memory;
  hello.machine_id = random_id("") + random_id("") + random_id("").substr(0, 8);
  if (networked) hello.network = nethost::hello_network(id);
  return hello;
}

}  // namespace

std::optional<Engine::Impl::BootFailure> Engine::Impl::boot_once(Sandbox& sb,
                                                                 const storage::Image& img,
                                                                 vmm::Accel accel,
                                                                 const templates::Template* tpl,
                                                                 const snapshots::Snapshot* from) {
  auto& impl = *this;
  const auto& info = sb.rec.info;
  const fs::path& dir = sb.run_dir();
  std::error_code ec;
  fs::path disk = dir / "disk.qcow2";
  fs::remove(disk, ec);  // a retry starts from a pristine disk
  vmm::VmConfig vc;
  std::shared_ptr<vmm::SealedRam> sealed;  // a clone's template RAM (sealed_ram.h)
  vc.id = info.id;
  vc.run_dir = dir;
  vc.kernel = img.kernel;
  vc.initrd = img.initrd;
  vc.disk = disk;
  vc.disk_roots = impl.disk_roots();
  vc.cpus = info.spec.cpus;
  vc.memory_mb = info.spec.memory_mb;
  vc.accel = accel;
  vc.tcg_tb_size_mb = impl.cfg.tcg_tb_size_mb;
  // A pool member yields the CPU to sandboxes in use until its hand-out.
  if (info.spec.metadata.count(kPoolMarker)) vc.cpu_weight = impl.cfg.pool_cpu_weight;
  const bool networked = sb.networked;
  auto deadline = channel::Clock::now() + std::chrono::seconds(impl.cfg.boot_timeout_s);
  // Everything this attempt acquires (overlay, helper, VM, channel) goes
  // when it fails, whatever it throws; dismissed only on success.
  bool vm_exited = false;
  std::string console;
  ScopeGuard attempt([&] {
    if (sb.vm) {
      vm_exited = !sb.vm->alive();
      console = sb.vm->console_tail(20);
    }
    sb.channel.reset();
    // The helper first: it is in the VM's cgroup, which the VM's kill removes.
    pid_t np;
    {
      std::lock_guard lock(sb.mu);
      np = sb.net_pid;
      sb.net_pid = 0;
    }
    if (networked || np > 0) nethost::stop(np, dir);
    sb.net_events.reset();  // after the kill: takes what the helper still wrote
    if (sb.vm) {
      try {
        sb.vm->kill();
      } catch (const std::exception& k) {
        spdlog::error("sandbox {}: kill after failed boot: {}", info.id, k.what());
      }
    }
    sb.vm.reset();
    sb.rec.info.pid = 0;
    std::error_code e2;
    fs::remove(disk, e2);
  });
  Phases ph("boot " + info.id);
  try {
    sealed = prepare_disk(impl, vc, img, tpl, from, disk, info.spec.disk_mb);
    ph.mark("overlay");
    if (networked) {
      // The helper listens before QEMU starts: QEMU connects its NIC once,
      // at start-up, and never reconnects. One helper per boot attempt (it
      // accepts a single QEMU connection).
      pid_t np = nethost::start(impl.cfg.guest_agent, dir, sb.network());
      {
        std::lock_guard lock(sb.mu);
        sb.net_pid = np;
      }
      sb.net_events = nethost::attach_events(impl.journal, info.id, dir, np, &impl.metrics);
      vc.net_socket = dir / "net.sock";
      vc.net_mac = nethost::mac_for(info.id);
    }
    ph.mark("net");
    sb.vm = impl.launcher->start(vc);
    ph.mark("vm start");
    // Recorded at once so a daemon that dies during the boot can find and
    // kill this QEMU when it restarts.
    sb.rec.info.pid = sb.vm->pid();
    impl.registry.set_pid(info.id, sb.rec.info.pid);
    if (networked) move_net_helper_to_cgroup(sb);
    sb.channel = channel::GuestChannel::connect(sb.vm->agent_socket(), deadline);
    ph.mark("channel");
    channel::HelloParams hello = hello_for(info.id, from, networked);
    sb.channel->hello(hello, deadline);
    ph.mark("hello");
    attempt.dismiss();
    return std::nullopt;
  } catch (const Error& e) {
    BootFailure f{e.code(), e.what(), {}};
    if (e.code() == Errc::timeout)
      f.cause = "the guest agent did not answer within " + std::to_string(impl.cfg.boot_timeout_s) +
                " s (" + e.what() + ")";
    bool had_vm = static_cast<bool>(sb.vm);
    attempt.fire();  // clean up now (it reads the console first)
    if (had_vm && vm_exited) {
      f.cause = "QEMU exited during boot (" + std::string(e.what()) + ")";
      f.code = Errc::internal;
    }
    f.console = console;
    return f;
  }
  // Any other exception: `attempt` has cleaned up; it propagates to
  // launch(), whose own guard removes the rest.
}

namespace {

// create --from: the snapshot decides image and shape (engine_snapshots.cc);
// it cannot be deleted while the sandbox starts from it.
SandboxInfo create_from_snapshot(Engine::Impl& impl, SandboxSpec& checked) {
  auto held = impl.prepare_from(checked);
  const snapshots::Snapshot& snap = held.snapshot;
  auto simg = impl.images.find(checked.image);
  if (!simg)
    throw Error(Errc::unavailable,
                "image " + checked.image + " of snapshot " + snap.name + " is gone", "from");
  vmm::AccelVerdict accel = impl.resolve_accel(*simg);
  auto t0 = std::chrono::steady_clock::now();
  SandboxInfo made = impl.launch(checked, *simg, accel, false, &snap)->info();
  impl.metrics.snapshot_op(
      "restore", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return made;
}

// The image a create boots: a built one, or a built-in recipe built now (a
// no-op when its inputs did not change).
storage::Image image_for_create(Engine::Impl& impl, const SandboxSpec& spec) {
  auto recipes = impl.images.recipes();
  bool is_recipe = std::find(recipes.begin(), recipes.end(), spec.image) != recipes.end();
  std::optional<storage::Image> img;
  try {
    img = impl.images.find(spec.image);
  } catch (const Error& e) {
    if (e.code() != Errc::not_found) throw;
  }
  // A tenant boots global images and its own; another tenant's image is
  // answered exactly like one that does not exist.
  if (img && !spec.tenant.empty() && !img->tenant.empty() && img->tenant != spec.tenant)
    img.reset();
  if (!img) {
    if (!is_recipe)
      throw Error(Errc::invalid_argument, "unknown image '" + spec.image + "'", "image");
    spdlog::info("building image {} on demand", spec.image);
    img = impl.images.build(spec.image);
  }
  return *img;
}

// create() without the metrics: checks, then a pool member, a clone or a
// cold boot (or a snapshot's restore).
SandboxInfo create_sandbox(Engine::Impl& impl, const SandboxSpec& spec) {
  Trace trace("create", "-");
  validate_spec(spec);
  // The egress policy, normalised; a bad entry is refused here, before
  // anything exists (field "network.allow[i]", ...).
  SandboxSpec checked = spec;
  checked.network = nethost::normalize(spec.network);
  if (nethost::enabled(checked.network))
    nethost::binary(impl.cfg.guest_agent);  // fail before creating
  if (!checked.from.empty()) return create_from_snapshot(impl, checked);
  storage::Image img = image_for_create(impl, spec);
  validate_disk_fits(checked, img.rootfs_bytes);
  trace.mark("image");
  // A warm pool member of this image and shape, if there is one: ready at
  // once (pool/warm_pool.h; the hand-out is engine_handout.cc).
  if (auto pooled = impl.take_pooled(checked, &trace)) return *pooled;
  vmm::AccelVerdict accel = impl.resolve_accel(img);
  return impl.launch(checked, img, accel, false)->info();
}

}  // namespace

SandboxInfo Engine::create(const SandboxSpec& spec) {
  auto& impl = *impl_;
  // Counted by start path and outcome, timed for GET /metrics.
  auto t0 = std::chrono::steady_clock::now();
  auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  try {
    SandboxInfo info = create_sandbox(impl, spec);
    impl.metrics.create_done(info.start, "ok", seconds());
    return info;
  } catch (const Error& e) {
    impl.metrics.create_done("none", std::string(to_string(e.code())), seconds());
    throw;
  } catch (...) {
    impl.metrics.create_done("none", "internal", seconds());
    throw;
  }
}

namespace {

// A new registry row (`starting`) under a fresh id, with its disk reserved
// first: the disk every admitted sandbox may fill must fit the data dir's
// filesystem (overlays are sparse; their disk_mb is the promise).
SandboxRecord register_new(Engine::Impl& impl, const SandboxSpec& checked,
                           const vmm::AccelVerdict& accel, bool pooled) {
  const SandboxSpec& spec = checked;
  SandboxRecord rec;
  auto& info = rec.info;
  info.spec = checked;
  info.state = State::starting;
  info.accel = vmm::to_string(accel.accel);
  info.start = "boot";
  info.created_at_ms = impl.wall_ms();
  info.expires_at_ms = info.created_at_ms + int64_t{spec.timeout_s} * 1000;
  // A pool member is marked so a restarted daemon drops it rather than
  // reporting it as a user's failed sandbox.
  if (pooled) info.spec.metadata[kPoolMarker] = spec.image;
  for (int tries = 0;; ++tries) {
    // A pool member has an internal name until its hand-out mints the id
    // its caller receives (take_pooled): no id a caller will get exists
    // before it gets it.
    info.id = random_id(pooled ? "pool-" : "sb-");
    rec.run_dir = impl.sandbox_dir(info.id);
    impl.admission.reserve(info.id, spec.disk_mb, "disk_mb=" + std::to_string(spec.disk_mb),
                           "disk_mb");
    try {
      impl.registry.insert(rec);
      return rec;
    } catch (const Error& e) {
      impl.admission.release(info.id);
      if (e.code() != Errc::conflict || tries > 5) throw;  // 48 random bits collided
    } catch (...) {
      impl.admission.release(info.id);
      throw;
    }
  }
}

void journal_or_log(Engine::Impl& impl, const std::string& id, const char* event,
                    const nlohmann::json& fields) {
  try {
    impl.journal.append(id, event, fields, Durability::sync);
  } catch (const std::exception& e) {
    spdlog::error("sandbox {}: audit: {}", id, e.what());
  }
}

// Boots `sb`: a clone of its shape's template if there is one (`tpl`), else
// (or if the clone failed twice) a cold boot or a snapshot's restore, each
// retried once. The last attempt's failure, or nullopt; `tpl` is left set
// only if the sandbox is a clone of it.
std::optional<Engine::Impl::BootFailure> boot_with_retries(
    Engine::Impl& impl, Sandbox& sb, const storage::Image& img, vmm::Accel accel,
    const snapshots::Snapshot* from, std::optional<templates::Template>& tpl) {
  const std::string& id = sb.rec.info.id;
  std::optional<Engine::Impl::BootFailure> failure;
  if (tpl) {
    // A clone whose restore fails is destroyed and retried once; then the
    // template is suspect (removed, rebuilt by a later create) and this
    // create falls back to a cold boot.
    for (int attempt = 1; attempt <= kBootAttempts; ++attempt) {
      failure = impl.boot_once(sb, img, accel, &*tpl);
      if (!failure) break;
      spdlog::warn("sandbox {}: clone attempt {} failed: {}", id, attempt, failure->cause);
      journal_or_log(impl, id, "clone_failed",
                     {{"attempt", attempt},
                      {"template", tpl->key},
                      {"cause", failure->cause},
                      {"console_tail", failure->console}});
    }
    if (failure) {
      impl.templates.store()->remove(tpl->key);
      tpl.reset();
    }
  }
  for (int attempt = 1; !tpl && attempt <= kBootAttempts; ++attempt) {
    failure = impl.boot_once(sb, img, accel, nullptr, from);
    if (!failure) break;
    spdlog::warn("sandbox {}: boot attempt {} failed: {}", id, attempt, failure->cause);
    try {
      impl.journal.append(
          id, "boot_failed",
          {{"attempt", attempt}, {"cause", failure->cause}, {"console_tail", failure->console}},
          Durability::sync);
      if (attempt < kBootAttempts) impl.journal.append(id, "retry", {{"attempt", attempt + 1}});
    } catch (const std::exception& e) {
      spdlog::error("sandbox {}: audit: {}", id, e.what());
    }
  }
  return failure;
}

}  // namespace

std::shared_ptr<Sandbox> Engine::Impl::launch(const SandboxSpec& checked,
                                              const storage::Image& image,
                                              const vmm::AccelVerdict& accel, bool pooled,
                                              const snapshots::Snapshot* from) {
  auto& impl = *this;
  const storage::Image* img = &image;
  const SandboxSpec& spec = checked;
  SandboxRecord rec = register_new(impl, checked, accel, pooled);
  const std::string id = rec.info.id;
  auto sb = std::make_shared<Sandbox>(rec, registry, journal);
  sb->image_env = img->config.env;
  sb->image_workdir = img->config.workdir;
  sb->image_user = img->config.user;
  sb->image_argv = img->config.entrypoint;
  sb->image_argv.insert(sb->image_argv.end(), img->config.cmd.begin(), img->config.cmd.end());
  // From here every resource (row, reservation, run dir, overlay, helper,
  // VM) is released by this guard on ANY exception, until the commit
  // point: `failed` with the reason, nothing else left.
  std::string fail_reason = "create aborted by an error during or after boot";
  ScopeGuard undo([&] {
    if (!teardown(*sb, State::failed, fail_reason, "failed", "boot_failed")) admission.release(id);
  });
  std::error_code ec;
  fs::create_directories(sb->run_dir(), ec);
  if (!ec) fs::permissions(sb->run_dir(), fs::perms::owner_all, ec);  // 0700
  if (ec) {
    fail_reason = "cannot create run dir: " + ec.message();
    throw Error(Errc::internal, "cannot create " + sb->run_dir().string() + ": " + ec.message());
  }

  // Admission: at most `max_starts` boots/clones at once. Past that, VMs
  // starting together only slow each other down until their agents miss the
  // boot deadline (50 concurrent creates on 2 cores did exactly that); a
  // queued create waits here instead, and its deadline starts when it runs.
  lifecycle::StartSlots::Slot slot(impl.starts);
  auto t0 = std::chrono::steady_clock::now();
  std::optional<templates::Template> tpl;
  if (!from) tpl = impl.templates.for_create(*img, checked, accel.accel, id);
  std::optional<Impl::BootFailure> failure =
      boot_with_retries(impl, *sb, *img, accel.accel, from, tpl);
  sb->rec.info.start = tpl ? "clone" : from && from->memory ? "snapshot" : "boot";
  if (failure) {
    fail_reason = "boot failed: " + failure->cause;
    std::string msg = "sandbox " + id + " did not boot (" + std::to_string(kBootAttempts) +
                      " attempts): " + failure->cause;
    msg += failure->console.empty() ? "\n(no console output)"
                                    : "\nlast console lines:\n" + failure->console;
    throw Error(failure->code == Errc::timeout ? Errc::timeout : Errc::internal, msg);
  }
  sb->rec.info.boot_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  sb->expires_steady_ms = steady_ms() + int64_t{spec.timeout_s} * 1000;
  const auto& done = sb->rec.info;
  if (pooled) {
    // Stays `starting` in the registry until handed out (take_pooled).
    impl.journal.append(id, "pooled",
                        {{"image_key", img->key},
                         {"boot_ms", done.boot_ms},
                         {"start", done.start},
                         {"template", tpl ? tpl->key : std::string()},
                         {"pid", done.pid}});
    undo.dismiss();  // commit: the pool owns it
    return sb;
  }
  sb->transition(State::starting, State::running,
                 {.event = "created",
                  .details = {{"spec", spec_to_json(checked)},
                              {"image_key", img->key},
                              {"kernel_release", img->kernel_release},
                              {"accel", done.accel},
                              {"accel_reason", accel.reason},
                              {"boot_ms", done.boot_ms},
                              {"start", done.start},
                              {"template", tpl ? tpl->key : std::string()},
                              {"from", from ? from->name : std::string()},
                              {"pid", done.pid}},
                  .journal_required = true,
                  .pid = done.pid,
                  .boot_ms = done.boot_ms,
                  // The registry row was inserted before the start was
                  // known (clone, snapshot): GET reads it from there.
                  .write_record = true});
  { impl.table.put(id, sb); }
  undo.dismiss();                 // commit: the sandbox is the caller's
  impl.reaper_wake.notify_all();  // the reaper's earliest expiry may have changed
  return sb;
}

void Engine::destroy(const std::string& id) {
  auto& impl = *impl_;
  std::shared_ptr<Sandbox> sb = impl.table.find(id);
  if (!sb) {
    auto rec = impl.registry.get(id);
    if (!rec) throw Error(Errc::not_found, "no sandbox " + id, "id");
    // Terminal sandboxes have nothing left to remove; one being created or
    // torn down by someone else is not ours to touch.
    std::string state = is_terminal(rec->info.state)         ? to_string(rec->info.state)
                        : rec->info.state == State::starting ? "starting"
                                                             : "stopping";
    throw Error(Errc::conflict, "sandbox " + id + " is " + state + "; nothing to delete");
  }
  // With background_delete: answered once the sandbox is `stopping` and out
  // of service, the VM and its files go on the reclaim thread
  // (engine_reclaim.cc). Without: all is gone when this returns.

  Trace trace("delete", id);
  bool stopped = impl.cfg.background_delete
                     ? impl.teardown_async(sb, "deleted by request")
                     : impl.teardown(*sb, State::deleted, "deleted by request", "deleted");
  if (!stopped)
    throw Error(Errc::conflict, "sandbox " + id + " is " + to_string(sb->state()) +
                                    " (stopped by someone else); nothing to delete");
}

void Engine::destroy_and_wait(const std::string& id) {
  destroy(id);
  if (!impl_->reclaimer.settle_one(id, std::chrono::seconds(60)))
    throw Error(Errc::timeout,
                "sandbox " + id + " is deleted but its teardown is still running after 60 s", "id");
}

}  // namespace airlock::engine

// Snapshots and fork (docs/design.md, "Snapshots, fork, pause"). A snapshot
// is the sandbox's overlay copied while its CPUs are stopped (the QMP stop
// flushes QEMU's qcow2 caches into the file), plus for a memory snapshot
// its whole VM state. create --from puts a fresh overlay on that copy; a
// memory snapshot also loads the state, then says hello with a new
// identity (hostname, machine-id, MAC, RNG reseed, clock), as a clone does.
// A fork is an internal memory snapshot restored `count` times; its RAM is
// split out of the stream into one sealed memfd the forks map copy-on-write
// (vmm/ram_split.h), so each fork loads device state only.
#include <spdlog/spdlog.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <future>

#include "common/error.h"
#include "common/phases.h"
#include "common/subprocess.h"
#include "engine/channel/guest_client.h"
#include "engine/confine/confine.h"
#include "engine/engine_impl.h"
#include "engine/storage/disk_chain.h"
#include "engine/types_json.h"
#include "engine/vmm/jail.h"

namespace airlock::engine {

namespace fs = std::filesystem;

namespace {

// Copies `from` to `to` (new file); a full disk is Error(unavailable)
// naming it, anything else Error(internal). The partial file is removed.
void copy_or_throw(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  uint64_t size = fs::file_size(from, ec);
  if (!ec && free_bytes(to.parent_path()) < size)
    rethrow_if_disk_full(to.parent_path(), to.string(), size);
  fs::copy_file(from, to, fs::copy_options::none, ec);
  if (!ec) return;
  std::error_code e2;
  fs::remove(to, e2);
  if (ec == std::errc::no_space_on_device || ec == std::errc::file_too_large)
    rethrow_if_disk_full(to.parent_path(), to.string(), UINT64_MAX);
  rethrow_if_disk_full(to.parent_path(), to.string(), 0);
  throw Error(Errc::internal,
              "cannot copy " + from.string() + " to " + to.string() + ": " + ec.message());
}

}  // namespace

std::vector<std::string> Engine::Impl::snapshot_users(const std::string& name,
                                                      const std::string& except_id) {
  std::vector<std::string> users;
  for (const auto& rec : registry.list(/*all=*/false))
    if (rec.info.spec.from == name && rec.info.id != except_id && !is_terminal(rec.info.state))
      users.push_back("sandbox " + rec.info.id);
  for (const auto& s : snaps->store().list())
    if (s.parent == name) users.push_back("snapshot " + s.name);
  if (int n = snaps->readers(name); n > 0)
    users.push_back(std::to_string(n) + " create(s) restoring it now");
  return users;
}

void Engine::Impl::release_internal_snapshot(const std::string& name,
                                             const std::string& except_id) noexcept {
  try {
    auto s = snaps->store().find(name);
    if (!s || !s->internal) return;
    if (!snapshot_users(name, except_id).empty()) return;
    snaps->store().remove(name);
    spdlog::info("fork snapshot {} removed: nothing uses it any more", name);
  } catch (const std::exception& e) {
    spdlog::warn("fork snapshot {}: {}", name, e.what());
  }
}

snapshots::SnapshotService::Held Engine::Impl::prepare_from(SandboxSpec& checked) {
  snapshots::check_name(checked.from, "from");
  // A tenant restores only its own snapshots; another's (the operator's
  // too) is answered exactly like a name that does not exist.
  auto held = snaps->hold(checked.from, [&](const snapshots::Snapshot& s) {
    return checked.tenant.empty() || s.tenant == checked.tenant;
  });
  if (!held) throw Error(Errc::invalid_argument, "unknown snapshot '" + checked.from + "'", "from");
  const snapshots::Snapshot* snap = &held->snapshot;
  checked.image = snap->image;
  checked.disk_mb = std::max(checked.disk_mb, snap->disk_mb);
  if (snap->memory) {
    // The saved VM decides its own shape and devices.
    checked.cpus = snap->cpus;
    checked.memory_mb = snap->memory_mb;
    if (nethost::enabled(checked.network) != snap->networked)
      throw Error(Errc::invalid_argument,
                  std::string("snapshot '") + snap->name + "' was taken of a sandbox " +
                      (snap->networked ? "with" : "without") +
                      " a network; a restore of its memory must be the same (network.mode)",
                  "network");
  }
  Phases ph("verify " + snap->name);
  // Its RAM lived only in the sealed memfd its forks map; no retry can
  // bring it back, so this is the snapshot's state (409), not a shortage.
  if (snap->memory && snap->files.contains("dev.state")) {
    if (!snaps->fork_ram(snap->name))
      throw Error(Errc::conflict,
                  "snapshot '" + snap->name +
                      "' is a fork's internal snapshot: its memory was kept only while its "
                      "forks started; snapshot one of the forks instead",
                  "from");
  }
  snaps->store().verify(*snap);  // size + SHA-256 of every file, parents too
  return std::move(*held);
}

namespace {

// Before a snapshot: the guest's page cache first, so what its programs
// wrote is on the disk, and its journal checkpointed (the agent's sync op),
// so the layer reads right without a journal replay (the filesystem diff
// reads it so; a fork's diff since its start reads its internal layer as
// the "before"). The sync runs before the source stops, so it is not in its
// pause. Then its RAM mapped into QEMU while it still runs, so that the save
// does not take a page fault per page with the guest stopped (a fresh
// clone's first save: ~0.7 s of pause; vmm/ram_prefault.h). Once per QEMU.
// Returns the bytes prefaulted (on record: 0 once this QEMU was saved before).
uint64_t settle_guest(Sandbox& sb, State from, bool memory, Phases& ph) {
  const std::string& id = sb.rec.info.id;
  if (from == State::running && sb.channel) {
    try {
      channel::sync(*sb.channel, channel::Clock::now() + std::chrono::seconds(30));
    } catch (const std::exception& e) {
      spdlog::warn("sandbox {}: sync before snapshot: {}", id, e.what());
    }
  }
  ph.mark("guest sync");
  uint64_t prefaulted = 0;
  if (from == State::running && memory && sb.vm) {
    try {
      prefaulted = sb.vm->prefault_ram();
    } catch (const std::exception& e) {
      spdlog::warn("sandbox {}: prefault before snapshot: {}", id, e.what());
    }
  }
  ph.mark("prefault");
  return prefaulted;
}

// A template clone's overlay is backed by the template's disk (`base_src`),
// which a prune may remove: the snapshot keeps its own link to it, and the
// layer is rebased onto that link.
void keep_template_base(const fs::path& base_src, const fs::path& dir) {
  fs::path base = dir / "base.qcow2";
  std::error_code ec;
  fs::create_hard_link(base_src, base, ec);
  if (ec) copy_or_throw(base_src, base);
  // The layer's header is the sandbox QEMU's writing: qemu-img parses
  // it confined (-u: the new backing name is written, never opened).
  confine::Scratch scratch(dir);
  std::string layer = scratch.give(dir / "layer.qcow2", true);
  confine::Limits lim;
  lim.timeout = std::chrono::seconds(60);
  lim.file_bytes = 1 << 20;  // a header rewrite; the layer does not grow
  auto r = confine::run(scratch.exec(
      {"qemu-img", "rebase", "-u", "-f", "qcow2", "-F", "qcow2", "-b", "base.qcow2", layer},
      "qemu-img", lim));
  if (!r.ok())
    throw Error(Errc::internal, "qemu-img rebase of the snapshot layer failed: " + r.describe());
}

// A fork's save: the RAM into a sealed memfd its forks map copy-on-write;
// the source continues before the split (vmm::Vm::save_memory_split). A
// stream that does not split leaves *split_ram null (the caller saves the
// whole state); an error after the layer was taken is the snapshot's.
void save_split(Sandbox& sb, const fs::path& dir, const std::function<void()>& take_layer,
                const bool& layer_taken, std::shared_ptr<vmm::SealedRam>* split_ram) {
  const std::string& id = sb.rec.info.id;
  try {
    auto r = sb.vm->save_memory_split(dir / "dev.state", std::chrono::seconds(120), take_layer,
                                      dir / "mem.state");
    *split_ram = r.ram;
    if (!r.ram)
      spdlog::warn("sandbox {}: fork: the saved state does not split ({}); whole instead", id,
                   r.error);
  } catch (const Error& e) {
    if (layer_taken) {
      rethrow_if_disk_full(dir, (dir / "layer.qcow2").string(), 0);
      throw;
    }
    spdlog::warn("sandbox {}: fork: cannot split the saved state ({}); full state instead", id,
                 e.what());
    split_ram->reset();
  }
}

}  // namespace

namespace {

// A paused sandbox's whole VM is already on disk (pause saved it): its
// memory is copied into the snapshot; returns its RAM block's name, "" if
// the pause's record does not say.
std::string copy_paused_memory(const fs::path& paused, const fs::path& into) {
  copy_or_throw(paused / "mem.state", into / "mem.state");
  nlohmann::json pm;
  try {
    std::ifstream in(paused / "paused.json");
    pm = nlohmann::json::parse(in);
  } catch (const std::exception&) {
  }
  return pm.value("ram_block", "");
}

// What a snapshot records of its source: who, from what, and its shape.
void describe_source(snapshots::Snapshot& meta, const Sandbox& sb, bool memory, bool internal) {
  const SandboxInfo info = sb.info();
  meta.source = sb.id();
  meta.parent = info.spec.from;
  meta.image = info.spec.image;
  meta.tenant = info.spec.tenant;
  meta.memory = memory;
  meta.internal = internal;
  meta.cpus = info.spec.cpus;
  meta.memory_mb = info.spec.memory_mb;
  meta.disk_mb = info.spec.disk_mb;
  meta.accel = info.accel;
  meta.networked = sb.networked;
}

}  // namespace

snapshots::Snapshot Engine::Impl::take_snapshot(Sandbox& sb, const std::string& name, bool memory,
                                                bool internal,
                                                std::shared_ptr<vmm::SealedRam>* split_ram) {
  const std::string id = sb.id();
  const State from = sb.state();
  if (from != State::running && from != State::paused)
    throw Error(Errc::conflict, "sandbox " + id + " is " + to_string(from) +
                                    "; only a running or paused one can "
                                    "be snapshotted");
  auto t0 = std::chrono::steady_clock::now();
  Phases ph("snapshot " + name + " of " + id);
  uint64_t prefaulted = settle_guest(sb, from, memory, ph);
  snapshots::Staging st = snaps->store().stage(name);  // conflict if the name is taken
  ScopeGuard drop([&] { snaps->store().abandon(st); });
  sb.transition(from, State::snapshotting,
                {.event = "snapshotting", .details = {{"name", name}, {"memory", memory}}});
  bool stopped = false;
  std::chrono::steady_clock::time_point stop_t{};
  int64_t paused_ms = 0;  // how long the source's vCPUs stood still
  auto stop = [&] {
    stopped = true;
    stop_t = std::chrono::steady_clock::now();
  };
  auto back = [&] {
    if (stopped && sb.vm) {
      try {
        sb.vm->resume_cpus();
        // Its clock stood still with it: set it before any later request.
        if (sb.channel) sb.channel->post_host_time();
      } catch (const std::exception& e) {
        spdlog::error("sandbox {}: cannot continue after snapshot: {}", id, e.what());
      }
      paused_ms = ms_since(stop_t);
      stopped = false;
    }
  };
  snapshots::Snapshot meta;
  try {
    fs::path disk = sb.run_dir() / "disk.qcow2";
    bool layer_taken = false;
    // The disk layer is copied while the VM stands still, then it continues.
    auto take_layer = [&] {
      ph.mark("save VM");
      layer_taken = true;
      copy_or_throw(disk, st.dir / "layer.qcow2");
      ph.mark("copy layer");
      back();
    };
    if (from == State::running) {
      if (memory) {
        stop();
        if (split_ram) save_split(sb, st.dir, take_layer, layer_taken, split_ram);
        try {
          if (!layer_taken) sb.vm->save_memory(st.dir / "mem.state", std::chrono::seconds(120));
        } catch (const Error&) {
          rethrow_if_disk_full(st.dir, (st.dir / "mem.state").string(), 0);
          throw;
        }
        meta.ram_block = sb.vm->ram_block();
      } else {
        stop();
        sb.vm->stop_cpus();
      }
    } else if (memory) {
      meta.ram_block = copy_paused_memory(paused_dir(id), st.dir);
    }
    if (!layer_taken) take_layer();  // back(): the source continues; the rest works on copies
    // The layer's header was the sandbox's QEMU's to write: a chain leaving
    // airlock's directories is refused here, before any restore, fork or
    // image save opens it (storage/disk_chain.h).
    auto chain =
        storage::disk_chain(st.dir / "layer.qcow2", disk_roots(), "sandbox " + id + "'s disk");
    if (chain.size() > 1 && templates.store() &&
        storage::path_inside(chain[1].path, templates.store()->root()))
      keep_template_base(chain[1].path, st.dir);
  } catch (...) {
    back();
    try {
      sb.transition(State::snapshotting, from,
                    {.event = "snapshot_failed", .details = {{"name", name}}});
    } catch (const std::exception& e) {
      spdlog::error("sandbox {}: {}", id, e.what());
    }
    throw;
  }
  sb.transition(State::snapshotting, from);
  describe_source(meta, sb, memory, internal);
  meta.created_at_ms = wall_ms();
  meta.took_ms = ms_since(t0);
  meta.paused_ms = paused_ms;
  ph.mark("resume+rebase");
  snapshots::Snapshot done = snaps->store().commit(st, meta);  // removes the staging dir on error
  drop.dismiss();
  ph.mark("commit (hash)");
  try {
    journal.append(id, "snapshot",
                   {{"name", name},
                    {"memory", memory},
                    {"bytes", done.bytes},
                    {"took_ms", done.took_ms},
                    {"paused_ms", done.paused_ms},
                    {"prefaulted_bytes", prefaulted}});
  } catch (const std::exception& e) {
    spdlog::error("sandbox {}: audit: {}", id, e.what());
  }
  return done;
}

nlohmann::json Engine::snapshot(const std::string& id, const std::string& name, bool memory) {
  auto& impl = *impl_;
  snapshots::check_name(name);
  auto sb = impl.table.live(id);
  std::lock_guard op(sb->op_mu);
  auto t0 = std::chrono::steady_clock::now();
  auto s = impl.take_snapshot(*sb, name, memory, false);
  impl.metrics.snapshot_op(memory ? "snapshot_memory" : "snapshot_disk", ms_since(t0) / 1000.0);
  return snapshots::to_json(s);
}

nlohmann::json Engine::list_snapshots() {
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& s : impl_->snaps->store().list()) arr.push_back(snapshots::to_json(s));
  return arr;
}

nlohmann::json Engine::get_snapshot(const std::string& name) {
  return snapshots::to_json(impl_->snaps->store().get(name));
}

void Engine::delete_snapshot(const std::string& name) {
  auto& impl = *impl_;
  impl.snaps->store().get(name);  // not_found
  impl.reclaimer.settle_all();    // a fork deleted just before is no user any more
  auto users = impl.snapshot_users(name, "");
  if (!users.empty()) {
    std::string who;
    for (const auto& u : users) who += (who.empty() ? "" : ", ") + u;
    throw Error(Errc::conflict, "snapshot " + name + " is in use by " + who, "name");
  }
  impl.snaps->store().remove(name);
}

nlohmann::json Engine::save_snapshot_image(const std::string& snapshot, const std::string& name) {
  auto& impl = *impl_;
  snapshots::check_name(snapshot, "snapshot");
  auto held = impl.snaps->hold(snapshot);  // not deletable while it is read
  if (!held) throw Error(Errc::not_found, "no snapshot '" + snapshot + "'", "snapshot");
  const snapshots::Snapshot* snap = &held->snapshot;
  std::optional<storage::Image> existing;
  try {
    existing = impl.images.find(name);
  } catch (const Error&) {
    // A bad name: install() below names it.
  }
  if (existing)
    throw Error(Errc::conflict, "image '" + name + "' already exists (remove it first)", "name");
  impl.snaps->store().verify(*snap);  // size + SHA-256 of every layer, parents too

  // Only files airlock itself keeps (snapshots, templates, images) may be
  // in the layer's chain, and qemu-img is given exactly those files.
  auto chain = storage::disk_chain(snap->layer(), impl.disk_roots(),
                                   "the disk layer of snapshot '" + snapshot + "'");
  storage::ImageConfig config;
  try {
    if (auto base = impl.images.find(snap->image)) config = base->config;
  } catch (const Error&) {
    // Its image is gone (the snapshot holds the files): no exec defaults.
  }
  config.base = snap->image;

  // Staged under the image directory (a leftover of a crash is pruned as
  // ".tmp-import-*"); install() moves the flattened rootfs into place.
  fs::path tmp = impl.images.dir() / random_id(".tmp-import-save-");
  std::error_code ec;
  fs::create_directories(tmp, ec);
  if (ec) throw Error(Errc::internal, "cannot create " + tmp.string() + ": " + ec.message());
  ScopeGuard drop([&] {
    std::error_code e;
    fs::remove_all(tmp, e);
  });
  // qemu-img and e2fsck parse what the sandbox's QEMU and guest wrote: both
  // run confined (confine.h), writing only into a scratch directory of
  // their own uid, given the chain's files as descriptors.
  confine::Scratch scratch(tmp);
  fs::path rootfs = scratch.dir() / "rootfs.ext4";
  uint64_t virtual_size = chain[0].virtual_size;
  if (free_bytes(tmp) < virtual_size / 4)
    rethrow_if_disk_full(tmp, rootfs.string(), virtual_size / 4);
  confine::Limits lim;
  lim.timeout = std::chrono::minutes(10);
  lim.file_bytes = std::max<uint64_t>(virtual_size, 1) + (1 << 20);
  // Sparse raw output: only the blocks the filesystem uses take space.
  std::string source = scratch.give_image_opts(storage::image_opts(chain));
  std::string out = scratch.give_dir() + "/rootfs.ext4";
  auto r = confine::run(
      scratch.exec({"qemu-img", "convert", "-O", "raw", "-S", "4k", source, out}, "qemu-img", lim));
  if (!r.ok()) {
    rethrow_if_disk_full(tmp, rootfs.string(), 0);
    throw Error(Errc::internal,
                "qemu-img convert of snapshot '" + snapshot + "' failed: " + r.describe());
  }
  // A disk snapshot of a running guest is crash-consistent: its ext4 may
  // hold a journal to replay, as after a power cut. Preen our own staged
  // copy (what the guest's next mount would do) before install checks it.
  scratch.forget();
  auto fsck = confine::run(
      scratch.exec({"e2fsck", "-fp", scratch.give_dir() + "/rootfs.ext4"}, "e2fsck", lim));
  if (fsck.timed_out || (fsck.exit_code != 0 && fsck.exit_code != 1))
    throw Error(Errc::internal, "e2fsck -fp of snapshot '" + snapshot +
                                    "' found what it cannot repair: " + fsck.describe());
  scratch.reclaim();  // root's again before install() opens what the tools left
  // The image is the snapshot owner's: a tenant's snapshot makes an image
  // only that tenant boots; the operator's makes a global one.
  auto img = impl.images.install(name, rootfs, config,
                                 {.source = "snapshot:" + snapshot,
                                  .layers = static_cast<int>(chain.size()),
                                  .tenant = snap->tenant});
  auto j = storage::to_json(img);
  j["used_by"] = nlohmann::json::array();
  return j;
}

std::vector<SandboxInfo> Engine::fork(const std::string& id, int count) {
  auto& impl = *impl_;
  if (count < 1 || count > 16)
    throw Error(Errc::invalid_argument, "count must be 1..16, got " + std::to_string(count),
                "count");
  auto t0 = std::chrono::steady_clock::now();
  auto sb = impl.table.live(id);
  Phases ph("fork of " + id + " x" + std::to_string(count));
  std::string name = random_id("fork-");
  SandboxSpec spec;
  std::shared_ptr<vmm::SealedRam> ram;  // the source's RAM, shared by every fork
  int64_t paused_ms = 0;
  {
    std::lock_guard op(sb->op_mu);
    if (sb->state() != State::running)
      throw Error(Errc::conflict,
                  "sandbox " + id + " is " + to_string(sb->state()) + "; only a running one forks");
    paused_ms = impl.take_snapshot(*sb, name, true, true, &ram).paused_ms;
    spec = sb->info().spec;
  }
  if (ram) impl.snaps->keep_fork_ram(name, ram);
  ScopeGuard drop_ram([&] { impl.snaps->drop_fork_ram(name); });
  ph.mark("snapshot");
  spec.from = name;
  spec.metadata.erase(kPoolMarker);
  // All or nothing: every fork is made, or none is left.
  std::vector<std::future<SandboxInfo>> futs;
  for (int i = 0; i < count; ++i)
    futs.push_back(std::async(std::launch::async, [this, spec] { return create(spec); }));
  std::vector<SandboxInfo> made;
  std::optional<Error> first;
  std::string other;
  for (auto& f : futs) {
    try {
      made.push_back(f.get());
    } catch (const Error& e) {
      if (!first) first = e;
    } catch (const std::exception& e) {
      if (!first) first = Error(Errc::internal, e.what());
    }
  }
  ph.mark("restores");
  if (first) {
    for (const auto& m : made) {
      try {
        impl.destroy_now(m.id, "fork failed");  // complete before the error is answered
      } catch (const std::exception& e) {
        spdlog::error("fork of {}: removing {}: {}", id, m.id, e.what());
      }
    }
    impl.release_internal_snapshot(name, "");
    throw Error(first->code(), "fork of " + id + " failed, no fork was kept: " + first->what(),
                first->field());
  }
  try {
    nlohmann::json ids = nlohmann::json::array();
    for (const auto& m : made) ids.push_back(m.id);
    impl.journal.append(id, "fork",
                        {{"count", count},
                         {"forks", ids},
                         {"snapshot", name},
                         {"paused_ms", paused_ms},
                         {"took_ms", ms_since(t0)}});
  } catch (const std::exception& e) {
    spdlog::error("sandbox {}: audit: {}", id, e.what());
  }
  impl.metrics.snapshot_op("fork", ms_since(t0) / 1000.0);
  return made;
}

}  // namespace airlock::engine

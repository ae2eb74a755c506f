// The engine's side of the warm pool (pool/warm_pool.h owns the slots and
// their thread): how a member is made (launch + warm-up) and ended, and how a
// taken member is handed out to a create — made the caller's inside, renamed
// to a fresh public id and recorded in one write.
#include <spdlog/spdlog.h>

#include <chrono>

#include "common/error.h"
#include "engine/channel/guest_client.h"
#include "engine/channel/warmup.h"
#include "engine/engine_impl.h"
#include "engine/net/host/control.h"
#include "engine/types_json.h"
#include "engine/validate.h"
#include "engine/vmm/cgroup.h"

namespace airlock::engine {

namespace {

pool::Key key_of(const SandboxSpec& s) {
  return {s.image, s.cpus, s.memory_mb, s.disk_mb, nethost::enabled(s.network)};
}

// A networked member idles under this policy: a NIC, and nothing allowed
// through it, until its hand-out installs the caller's policy.
nlohmann::json deny_everything() {
  return {{"mode", "allowlist"}, {"allow", nlohmann::json::array()}};
}

}  // namespace

// Under TCG a fresh QEMU translates every guest code path the first time it
// runs, so the first exec in a new clone is slow; an interpreter's first
// start also reads its files. A member therefore runs its image's warm-up
// (or `true`) before it is ready: only caches get warm; no process or cgroup
// of it remains. Each command is journaled as `pool_warmup` (nobody's exec),
// and the channel's stream count afterwards is recorded: take_pooled hands
// out only a member whose channel carried nothing since. Returns false (the
// member is not made ready) if a command failed.
bool Engine::Impl::warm_up(Sandbox& sb, const std::vector<std::string>& commands) {
  try {
    for (auto& rec : channel::run_warmup(*sb.channel, commands, "pool member " + sb.rec.info.id))
      journal.append(sb.rec.info.id, "pool_warmup", rec);
    sb.streams_at_ready = sb.channel->streams_opened();
    return true;
  } catch (const std::exception& e) {
    spdlog::warn("pool member {}: warm-up failed: {}", sb.rec.info.id, e.what());
    return false;
  }
}

std::shared_ptr<Sandbox> PoolMembers::make(const pool::Key& key) {
  SandboxSpec spec;
  spec.image = key.image;
  spec.cpus = key.cpus;
  spec.memory_mb = key.memory_mb;
  spec.disk_mb = key.disk_mb;
  spec.network = nethost::normalize(key.networked ? deny_everything() : spec.network);
  auto img = impl_.images.find(spec.image);
  if (!img) img = impl_.images.build(spec.image);
  vmm::AccelVerdict accel = impl_.resolve_accel(*img);
  auto sb = impl_.launch(spec, *img, accel, true);
  if (!impl_.warm_up(*sb, img->config.warmup)) {
    impl_.teardown(*sb, State::deleted, "warm-up failed", "deleted");
    throw Error(Errc::internal, "the member's warm-up failed");
  }
  return sb;
}

bool PoolMembers::usable(const Sandbox& sb, bool untouched) const {
  if (!sb.vm || !sb.vm->alive() || !sb.channel || sb.channel->closed()) return false;
  return !untouched || sb.channel->streams_opened() == sb.streams_at_ready;
}

void PoolMembers::end(Sandbox& sb, const std::string& reason) {
  impl_.teardown(sb, State::deleted, reason, "deleted");
}

void PoolMembers::end_async(const std::shared_ptr<Sandbox>& sb, const std::string& reason) {
  impl_.teardown_async(sb, reason);
}

namespace {

// Makes the member the caller's inside: the host's clock and the public id
// as its name, the normal cpu weight, the caller's network policy. False
// (the member torn down, the caller boots a fresh sandbox) if one failed.
bool adapt_member(Engine::Impl& impl, const std::shared_ptr<Sandbox>& sb,
                  const SandboxSpec& checked, const std::string& public_id,
                  const std::function<void(const char*)>& mark) {
  auto& info = sb->rec.info;
  try {
    sb->channel->post_host_time(public_id);
  } catch (const std::exception& e) {
    spdlog::warn("pool member {}: clock at hand-out not sent: {}", sb->id(), e.what());
    impl.teardown_async(sb, "pool hand-out failed: the clock was not set");
    return false;
  }
  mark("clock");
  // The member waited at cfg.pool_cpu_weight (its clone and warm-up yielded
  // to sandboxes in use); from here it is one of them. A cgroup that cannot
  // be written ends the member, as above.
  try {
    if (impl.cfg.pool_cpu_weight != vmm::kDefaultCpuWeight)
      sb->vm->set_cpu_weight(vmm::kDefaultCpuWeight);
  } catch (const std::exception& e) {
    spdlog::warn("pool member {}: cpu weight at hand-out not set: {}", sb->id(), e.what());
    impl.teardown_async(sb, "pool hand-out failed: the cpu weight was not set");
    return false;
  }
  mark("weight");
  if (sb->networked) {
    // The caller's policy replaces deny-everything in the helper before the
    // create returns (the helper answers once it is in force), so the first
    // packet after the create already meets it. A refusal ends the member;
    // the caller then boots a fresh sandbox.
    try {
      nethost::Control(sb->run_dir()).set_policy(checked.network);
    } catch (const std::exception& e) {
      spdlog::warn("pool member {}: policy at hand-out refused: {}", sb->id(), e.what());
      impl.teardown_async(sb, "pool hand-out failed: the network policy was not applied");
      return false;
    }
    impl.journal.append(info.id, "net_policy", {{"policy", checked.network}});
    mark("policy");
  }
  return true;
}

}  // namespace

std::optional<SandboxInfo> Engine::Impl::take_pooled(const SandboxSpec& checked, Trace* trace) {
  auto mark = [&](const char* phase) {
    if (trace) trace->mark(phase);
  };
  const pool::Key key = key_of(checked);
  std::shared_ptr<Sandbox> sb = pool.take(key);
  if (!sb) return std::nullopt;
  mark("take");

  auto t0 = std::chrono::steady_clock::now();
  // Not shared yet (out of the queue, not in `live`): rec is ours to write.
  auto& info = sb->rec.info;
  info.spec = checked;  // the caller's env, metadata, lifetime
  info.start = "pool";
  info.created_at_ms = wall_ms();
  info.expires_at_ms = info.created_at_ms + int64_t{checked.timeout_s} * 1000;
  info.boot_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  // The member's clock was set at its own hello, maybe minutes ago, and its
  // warm-up may have moved it: the host's time now. Posted, not awaited: the
  // agent applies it before it reads anything sent after it, and every exec
  // comes after (the member is not in `live` yet). A closed channel ends the
  // member; the caller then boots a fresh sandbox. The public id is minted
  // here and the guest named after it with the clock; the sandbox takes it
  // (hand_out) below, once nothing but the record can fail.
  const std::string public_id = random_id("sb-");
  if (!adapt_member(*this, sb, checked, public_id, mark)) return std::nullopt;
  sb->set_network(checked.network);
  sb->expires_steady_ms = steady_ms() + int64_t{checked.timeout_s} * 1000;
  // Until here the member had only its internal name (its run dir, jail,
  // cgroup and QEMU keep it), so no id a caller receives was ever shown
  // anywhere before. The row is renamed by the transition below; the
  // member's own journal ends with the id it became.
  const std::string member = sb->id();
  sb->hand_out(public_id);
  if (trace) trace->set_id(info.id);
  admission.rename(member, info.id, info.spec.disk_mb);
  // If the hand-out cannot be recorded, the member goes (never a half-made
  // sandbox); the caller then boots a fresh one.
  bool renamed = false;
  ScopeGuard undo([&] {
    if (!renamed) {
      // The write failed: the row is still the member's, and so is the end.
      sb->hand_out(member);
      admission.rename(public_id, member, info.spec.disk_mb);
    }
    teardown(*sb, State::deleted, "pool hand-out failed", "deleted");
  });
  // One write: spec, state, times (compare-and-set from starting). What is
  // durable when (docs/design.md, "Warm pool"): the registry row is
  // committed in WAL mode with synchronous=NORMAL (no fsync per commit) and
  // the `created` record is one write(2) without fsync. Both survive a
  // daemon crash (they are in the kernel); a host crash may lose them, but
  // it also kills the VM, and the next daemon cleans up a row it finds
  // `starting`/`running` with no live QEMU either way.
  sb->transition(State::starting, State::running,
                 {.event = "created",
                  .details = {{"spec", spec_to_json(checked)},
                              {"accel", info.accel},
                              {"boot_ms", info.boot_ms},
                              {"start", info.start},
                              {"pool_member", member},
                              {"pid", info.pid}},
                  .durability = Durability::buffered,
                  .journal_required = true,
                  .write_record = true});
  renamed = true;
  mark("record");
  try {
    journal.append(member, "handed_out", {{"id", info.id}});
  } catch (const std::exception& e) {
    spdlog::warn("pool member {}: audit: {}", member, e.what());
  }
  // The helper's events are the public id's from here (drained under the
  // member's name first).
  if (sb->net_events) {
    sb->net_events.reset();
    sb->net_events = nethost::attach_events(journal, info.id, sb->run_dir(), sb->net_pid, &metrics);
  }
  { table.put(info.id, sb); }
  undo.dismiss();
  reaper_wake.notify_all();  // the reaper's earliest expiry
  auto out = sb->info();
  mark("live");
  return out;
}

nlohmann::json Engine::set_pool(const std::string& image, int size, const nlohmann::json& shape) {
  auto& impl = *impl_;
  if (!limits::kPoolSize.contains(size))
    throw Error(Errc::invalid_argument,
                "size must be " + std::to_string(limits::kPoolSize.min) + ".." +
                    std::to_string(limits::kPoolSize.max) + ", got " + std::to_string(size),
                "size");
  SandboxSpec spec;
  spec.image = image;
  if (!shape.is_null() && !shape.is_object())
    throw Error(Errc::invalid_argument, "shape must be an object", "shape");
  const nlohmann::json fields = shape.is_object() ? shape : nlohmann::json::object();
  bool networked = false;
  for (const auto& [k, v] : fields.items()) {
    if (k == "network") {
      if (!v.is_boolean())
        throw Error(Errc::invalid_argument, "network must be true or false", "network");
      networked = v.get<bool>();
      continue;
    }
    if (!v.is_number_integer()) throw Error(Errc::invalid_argument, k + " must be an integer", k);
    if (k == "cpus")
      spec.cpus = v.get<int>();
    else if (k == "memory_mb")
      spec.memory_mb = v.get<int>();
    else if (k == "disk_mb")
      spec.disk_mb = v.get<int>();
    else
      throw Error(Errc::invalid_argument, "unknown pool shape field '" + k + "'", k);
  }
  validate_spec(spec);
  auto recipes = impl.images.recipes();
  bool known = std::find(recipes.begin(), recipes.end(), image) != recipes.end();
  if (!known) {
    try {
      known = impl.images.find(image).has_value();
    } catch (const Error&) {
    }
  }
  if (!known) throw Error(Errc::invalid_argument, "unknown image '" + image + "'", "image");
  impl.pool.set_slot({image, spec.cpus, spec.memory_mb, spec.disk_mb, networked}, size);
  return pool_info();
}

nlohmann::json Engine::pool_info() { return impl_->pool.info(); }

}  // namespace airlock::engine

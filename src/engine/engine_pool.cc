// The warm pool: per shape (image, cpus, memory_mb, disk_mb, NIC or not), N
// sandboxes cloned and idle, handed out whole by a create of exactly that
// shape (docs/design.md, "Warm pool"). Slots are configured (PUT /v1/pool,
// --pool) or learned from creates that found no ready member.
//
// Invariants: a member is in exactly one place — a slot's `ready` queue,
// `pool_retired` (its slot went away) or `live` (handed out) — and moves
// once, under pool_mu, so it is never handed out twice; no exec ever
// reaches a member before it is handed out (execs look only in `live`).
// Dead members are replaced; under memory pressure members are shed (the
// learned slots' first) instead of refilled.
#include <spdlog/spdlog.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>

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

// A learned slot starts with one member and grows by one per miss up to
// this: enough for an agent's create-use-delete loop and a small burst,
// small enough that guessing wrong costs little.
constexpr int kLearnedMaxTarget = 2;

PoolKey key_of(const SandboxSpec& s) {
  return {s.image, s.cpus, s.memory_mb, s.disk_mb, nethost::enabled(s.network)};
}

nlohmann::json shape_json(const PoolKey& k) {
  return {{"cpus", k.cpus},
          {"memory_mb", k.memory_mb},
          {"disk_mb", k.disk_mb},
          {"network", k.networked}};
}

// A networked member idles under this policy: a NIC, and nothing allowed
// through it, until its hand-out installs the caller's policy.
nlohmann::json deny_everything() {
  return {{"mode", "allowlist"}, {"allow", nlohmann::json::array()}};
}

bool member_alive(Sandbox& sb) {
  return sb.vm && sb.vm->alive() && sb.channel && !sb.channel->closed();
}

}  // namespace

// Memory pressure: less than 10% of RAM available, or tasks stalled on
// memory more than 10% of the last 10 s (PSI). Pool members are a luxury:
// they go first. Runs on the pool thread: a malformed file (an odd kernel,
// a test) must never throw out of it.
bool memory_pressure(const std::filesystem::path& meminfo, const std::filesystem::path& psi_file) {
  std::ifstream mi(meminfo);
  std::string key;
  uint64_t value = 0, total = 0, avail = 0;
  std::string unit;
  while (mi >> key >> value >> unit) {
    if (key == "MemTotal:") total = value;
    if (key == "MemAvailable:") avail = value;
  }
  if (total > 0 && avail * 10 < total) return true;
  std::ifstream psi(psi_file);
  std::string line;
  if (std::getline(psi, line)) {
    auto at = line.find("avg10=");
    if (at == std::string::npos) return false;
    const char* begin = line.c_str() + at + 6;
    char* end = nullptr;
    errno = 0;
    double avg10 = std::strtod(begin, &end);
    if (end == begin || errno != 0) return false;
    return avg10 > 10.0;
  }
  return false;
}

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

PoolSlot* Engine::Impl::learn_shape(const PoolKey& key, int64_t now) {
  if (cfg.pool_learn_shapes <= 0) return nullptr;
  const int64_t budget = cfg.pool_learn_memory_mb;
  // The learned slots' count and memory (target members x memory_mb).
  auto learned = [&] {
    std::pair<int, int64_t> n{0, 0};
    for (const auto& [k, slot] : pool_slots)
      if (slot.learned) ++n.first, n.second += int64_t{slot.target} * k.memory_mb;
    return n;
  };
  if (auto it = pool_slots.find(key); it != pool_slots.end()) {
    PoolSlot& slot = it->second;
    // Misses keep coming: one more member, if the budget has room (a
    // configured slot is the operator's: never changed here).
    if (slot.learned && slot.target < kLearnedMaxTarget &&
        learned().second + key.memory_mb <= budget)
      ++slot.target;
    return &slot;
  }
  if (key.memory_mb > budget) return nullptr;
  // Room for one more shape within the count and the memory: the least
  // recently used learned shapes go.
  for (auto [count, mb] = learned(); count >= cfg.pool_learn_shapes || mb + key.memory_mb > budget;
       std::tie(count, mb) = learned()) {
    auto lru = pool_slots.end();
    for (auto it = pool_slots.begin(); it != pool_slots.end(); ++it)
      if (it->second.learned &&
          (lru == pool_slots.end() || it->second.last_used_ms < lru->second.last_used_ms))
        lru = it;
    if (lru == pool_slots.end()) return nullptr;
    for (auto& m : lru->second.ready) pool_retired.push_back(m);
    pool_slots.erase(lru);
  }
  PoolSlot& slot = pool_slots[key];
  slot.key = key;
  slot.learned = true;
  slot.target = 1;
  slot.last_used_ms = now;
  return &slot;
}

namespace {

// A ready member of `key`'s shape, out of its slot's queue (so it is handed
// out once), or null: a miss, which teaches the pool the shape. Members
// found dead or touched on the way are torn down in the background.
std::shared_ptr<Sandbox> pop_ready(Engine::Impl& impl, const PoolKey& key) {
  std::shared_ptr<Sandbox> sb;
  std::vector<std::shared_ptr<Sandbox>> dead;
  {
    std::lock_guard lock(impl.pool_mu);
    const int64_t now = steady_ms();
    auto it = impl.pool_slots.find(key);
    PoolSlot* slot = it == impl.pool_slots.end() ? nullptr : &it->second;
    while (slot && !slot->ready.empty() && !sb) {
      auto cand = slot->ready.front();
      slot->ready.pop_front();
      // Untouched since its warm-up: no stream opened on its channel since.
      if (member_alive(*cand) && cand->channel->streams_opened() == cand->streams_at_ready)
        sb = cand;
      else
        dead.push_back(cand);
    }
    // A miss teaches the pool this shape (or grows its learned slot); the
    // pool thread makes the member on its next tick.
    if (!sb && (!slot || slot->learned)) slot = impl.learn_shape(key, now);
    if (slot) {
      slot->last_used_ms = now;
      slot->replaced += static_cast<int64_t>(dead.size());
      ++(sb ? slot->hits : slot->misses);
      auto& counts = impl.pool_counts[key.image];
      ++(sb ? counts.first : counts.second);
    }
  }
  // The refill starts on the pool's next tick (<= 500 ms), not at once, so
  // the new QEMU does not compete for the CPU with the caller's first exec.
  for (auto& d : dead) impl.teardown_async(d, "pool member died while idle");
  return sb;
}

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
  const PoolKey key = key_of(checked);
  std::shared_ptr<Sandbox> sb = pop_ready(*this, key);
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

void Engine::Impl::pool_loop() {
  std::unique_lock lock(pool_mu);
  // A member was just added and a slot still wants more: the next one starts
  // at once instead of a tick later (a pool of 4 refilled in 4 clones' time,
  // not 4 ticks more), so refills keep up with a client that drains it.
  bool more = false;
  while (!pool_stopping) {
    if (!more)
      pool_wake.wait_for(lock, std::chrono::milliseconds(cfg.pool_tick_ms),
                         [&] { return pool_stopping || pool_kicked; });
    more = pool_kicked = false;
    if (pool_stopping) break;
    // Collect what to do under the lock; do it (slow: VMs) outside.
    std::vector<std::shared_ptr<Sandbox>> drop;
    drop.swap(pool_retired);
    std::optional<PoolKey> fill;  // the shape to make one member of
    bool pressure = false;
    lock.unlock();
    pressure = memory_pressure();
    lock.lock();
    const int64_t now = steady_ms();
    const int64_t idle_ms = int64_t{cfg.pool_learn_idle_s} * 1000;
    // Learned shapes unused for pool_learn_idle_s are forgotten.
    for (auto it = pool_slots.begin(); it != pool_slots.end();) {
      if (it->second.learned && now - it->second.last_used_ms > idle_ms) {
        for (auto& m : it->second.ready) drop.push_back(m);
        it = pool_slots.erase(it);
      } else {
        ++it;
      }
    }
    // Under pressure one member per slot per tick goes, the learned slots'
    // first: the configured ones shed only when no learned member is left.
    bool learned_left = false;
    for (const auto& [key, slot] : pool_slots) learned_left |= slot.learned && !slot.ready.empty();
    for (auto& [key, slot] : pool_slots) {
      for (auto it = slot.ready.begin(); it != slot.ready.end();) {
        if (!member_alive(**it)) {
          drop.push_back(*it);
          it = slot.ready.erase(it);
          ++slot.replaced;
        } else {
          ++it;
        }
      }
      while (static_cast<int>(slot.ready.size()) > slot.target) {
        drop.push_back(slot.ready.back());
        slot.ready.pop_back();
      }
      if (pressure && !slot.ready.empty() && (slot.learned || !learned_left)) {
        drop.push_back(slot.ready.back());
        slot.ready.pop_back();
        ++slot.shed;
      }
    }
    // Configured slots fill before learned ones.
    for (bool learned : {false, true})
      for (const auto& [key, slot] : pool_slots)
        if (!pressure && !fill && slot.learned == learned &&
            static_cast<int>(slot.ready.size()) < slot.target)
          fill = key;
    lock.unlock();
    for (auto& d : drop) teardown(*d, State::deleted, "dropped from the warm pool", "deleted");
    if (pressure && !drop.empty())
      spdlog::warn("memory pressure: shed {} pool member(s)", drop.size());
    if (fill) {
      try {
        SandboxSpec spec;
        spec.image = fill->image;
        spec.cpus = fill->cpus;
        spec.memory_mb = fill->memory_mb;
        spec.disk_mb = fill->disk_mb;
        spec.network = nethost::normalize(fill->networked ? deny_everything() : spec.network);
        auto img = images.find(spec.image);
        if (!img) img = images.build(spec.image);
        vmm::AccelVerdict accel = resolve_accel(*img);
        auto sb = launch(spec, *img, accel, true);
        if (!warm_up(*sb, img->config.warmup)) {
          teardown(*sb, State::deleted, "warm-up failed", "deleted");
          throw Error(Errc::internal, "the member's warm-up failed");
        }
        lock.lock();
        auto it = pool_slots.find(*fill);
        bool wanted = !pool_stopping && it != pool_slots.end() &&
                      static_cast<int>(it->second.ready.size()) < it->second.target;
        if (wanted) it->second.ready.push_back(sb);
        for (const auto& [key, slot] : pool_slots)
          more |= wanted && static_cast<int>(slot.ready.size()) < slot.target;
        lock.unlock();
        if (!wanted)
          teardown(*sb, State::deleted, "not needed by the warm pool any more", "deleted");
      } catch (const std::exception& e) {
        spdlog::warn("warm pool for {}: could not make a member: {}", fill->image, e.what());
        lock.lock();
        // A learned shape that cannot be made is forgotten (it was a guess;
        // the next create of it learns it again). A configured one backs
        // off instead of spinning on a persistent failure.
        auto it = pool_slots.find(*fill);
        if (it != pool_slots.end() && it->second.learned) {
          for (auto& m : it->second.ready) pool_retired.push_back(m);
          pool_slots.erase(it);
        } else {
          pool_wake.wait_for(lock, std::chrono::seconds(5), [&] { return pool_stopping; });
        }
        lock.unlock();
      }
    }
    lock.lock();
  }
}

void Engine::Impl::drain_pool() {
  std::vector<std::shared_ptr<Sandbox>> all;
  {
    std::lock_guard lock(pool_mu);
    all.swap(pool_retired);
    for (auto& [key, slot] : pool_slots) {
      for (auto& m : slot.ready) all.push_back(m);
      slot.ready.clear();
    }
  }
  for (auto& m : all)
    teardown(*m, State::deleted, "warm pool drained (daemon stopping)", "deleted");
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
  const PoolKey key{image, spec.cpus, spec.memory_mb, spec.disk_mb, networked};
  std::deque<std::shared_ptr<Sandbox>> old;
  {
    std::lock_guard lock(impl.pool_mu);
    if (size == 0) {
      // Removes this shape's slot (configured or learned); other shapes of
      // the image stay.
      if (auto it = impl.pool_slots.find(key); it != impl.pool_slots.end()) {
        old.swap(it->second.ready);
        impl.pool_slots.erase(it);
      }
    } else {
      auto& slot = impl.pool_slots[key];
      slot.key = key;
      slot.target = size;
      slot.learned = false;  // the operator's from now on: learning leaves it alone
      slot.last_used_ms = steady_ms();
    }
    impl.pool_kicked = true;
  }
  for (auto& m : old) impl.teardown(*m, State::deleted, "warm pool slot removed", "deleted");
  impl.pool_wake.notify_all();
  return pool_info();
}

nlohmann::json Engine::pool_info() {
  auto& impl = *impl_;
  nlohmann::json out = nlohmann::json::array();
  std::lock_guard lock(impl.pool_mu);
  for (const auto& [key, slot] : impl.pool_slots) {
    nlohmann::json members = nlohmann::json::array();
    for (const auto& m : slot.ready) members.push_back(m->rec.info.id);
    out.push_back({{"image", key.image},
                   {"shape", shape_json(key)},
                   {"learned", slot.learned},
                   {"target", slot.target},
                   {"ready", slot.ready.size()},
                   {"members", members},
                   {"hits", slot.hits},
                   {"misses", slot.misses},
                   {"replaced", slot.replaced},
                   {"shed", slot.shed}});
  }
  return out;
}

}  // namespace airlock::engine

// The warm pool: per shape (image, cpus, memory_mb, disk_mb, NIC or not), N
// sandboxes cloned and idle, handed out whole by a create of exactly that
// shape (docs/design.md, "Warm pool"). Slots are configured (PUT /v1/pool,
// --pool) or learned from creates that found no ready member.
//
// The pool owns its slots, its counters, its lock and its thread. It does not
// know how a member is made or ended: the engine's lifecycle does that behind
// `Members`, and the engine hands a taken member out (hand_out.cc).
//
// Invariants: a member is in exactly one place — a slot's `ready` queue, the
// retired list (its slot went away) or the engine's (taken) — and moves once,
// under the pool's lock, so it is never handed out twice; no exec ever reaches
// a member before it is handed out (execs look only in the sandbox table).
// Dead members are replaced; under memory pressure members are shed (the
// learned slots' first) instead of refilled.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine/sandbox/sandbox.h"

namespace airlock::engine::pool {

// One slot per shape; several shapes of one image coexist.
struct Key {
  std::string image;
  int cpus = 1, memory_mb = 256, disk_mb = 1024;
  bool networked = false;  // members carry a NIC under deny-everything
  auto operator<=>(const Key&) const = default;
};

struct Slot {
  Key key;
  int target = 0;
  // Learned from creates that found no ready member (not configured):
  // bounded by Options::learn_*, forgotten when unused for learn_idle_s; a
  // configured slot is never touched by learning.
  bool learned = false;
  int64_t last_used_ms = 0;  // steady_ms() of its last create (hit or miss)
  std::deque<std::shared_ptr<Sandbox>> ready;
  int64_t hits = 0, misses = 0, replaced = 0, shed = 0;
};

// What the pool needs of the engine's lifecycle (the seam the fake-backed
// tests and the engine both stand behind).
class Members {
 public:
  virtual ~Members() = default;
  // A new member of `key`'s shape, booted (or cloned) and warmed up, not in
  // the sandbox table. Throws (an Error) if it cannot be made; nothing of it
  // is left then.
  virtual std::shared_ptr<Sandbox> make(const Key& key) = 0;
  // True if `sb` may still be handed out: its VM and channel alive and, with
  // `untouched`, no stream opened on its channel since its warm-up.
  virtual bool usable(const Sandbox& sb, bool untouched) const = 0;
  // Ends a member now, to `deleted` with `reason`. Never throws.
  virtual void end(Sandbox& sb, const std::string& reason) = 0;
  // Ends a member in the background (off a create's hot path). Never throws.
  virtual void end_async(const std::shared_ptr<Sandbox>& sb, const std::string& reason) = 0;
};

// Memory pressure: less than 10% of RAM available in `meminfo`, or PSI
// `psi` avg10 above 10%. A missing or malformed file counts as no pressure;
// never throws.
bool memory_pressure(const std::filesystem::path& meminfo = "/proc/meminfo",
                     const std::filesystem::path& psi = "/proc/pressure/memory");

struct Options {
  int tick_ms = 500;  // how often the thread looks at the slots
  // Learning (engine::Config::pool_learn_*): 0 shapes = off.
  int learn_shapes = 0;
  int64_t learn_memory_mb = 1024;
  int learn_idle_s = 300;
  std::function<bool()> pressure = [] { return memory_pressure(); };
};

class WarmPool {
 public:
  WarmPool(Options opts, Members& members) : opts_(std::move(opts)), members_(members) {}
  ~WarmPool() { stop(); }
  WarmPool(const WarmPool&) = delete;
  WarmPool& operator=(const WarmPool&) = delete;

  // Starts the thread that fills, replaces and sheds members.
  void start();
  // Stops and joins the thread and ends every member (engine shutdown:
  // members are nobody's sandboxes yet). Idempotent; never throws.
  void stop() noexcept;

  // A ready member of `key`'s shape, out of its slot (so it is taken once),
  // alive and untouched since its warm-up; null if none (a miss, which
  // teaches the pool the shape). Members found dead on the way are ended in
  // the background.
  std::shared_ptr<Sandbox> take(const Key& key);
  // The operator's slot for `key`: `size` members (0 removes the slot,
  // configured or learned; other shapes of the image stay). Removed members
  // are ended before it returns.
  void set_slot(const Key& key, int size);
  // Every slot: image, shape, learned, target, ready, members, counters.
  nlohmann::json info() const;
  // Hits and misses per image since the pool was made (slots come and go,
  // counters never go down).
  std::map<std::string, std::pair<int64_t, int64_t>> counts() const;

 private:
  void loop();
  // A learned slot for `key` (a create's miss), within the count and memory
  // budget, evicting the least recently used learned slots; grows a learned
  // slot by one member on a later miss. Holds mu_. Null if learning is off
  // or the shape alone is over the budget.
  Slot* learn_shape(const Key& key, int64_t now);
  // One tick under mu_: forgets idle learned slots, collects dead, surplus
  // and (under `pressure`) shed members into `drop`; the shape to make one
  // member of, if any.
  std::optional<Key> plan_tick(bool pressure, std::vector<std::shared_ptr<Sandbox>>& drop);
  // Makes one member of `key` outside mu_ and queues it if still wanted;
  // true if another slot still wants more.
  bool fill_one(const Key& key);

  const Options opts_;
  Members& members_;
  mutable std::mutex mu_;  // everything below
  std::condition_variable wake_;
  // The slots changed (set_slot): look now, not on the next tick. A flag
  // and not just the notify, which is lost if the thread is not waiting yet.
  bool kicked_ = false;
  bool stopping_ = false;
  std::map<Key, Slot> slots_;
  // Members of slots removed on a create's path (a learned slot evicted):
  // the thread ends them, off the create's hot path.
  std::vector<std::shared_ptr<Sandbox>> retired_;
  std::map<std::string, std::pair<int64_t, int64_t>> counts_;
  std::thread thread_;
};

}  // namespace airlock::engine::pool

#include "engine/pool/warm_pool.h"

#include <spdlog/spdlog.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <tuple>

namespace airlock::engine::pool {

namespace {

// A learned slot starts with one member and grows by one per miss up to
// this: enough for an agent's create-use-delete loop and a small burst,
// small enough that guessing wrong costs little.
constexpr int kLearnedMaxTarget = 2;

nlohmann::json shape_json(const Key& k) {
  return {{"cpus", k.cpus},
          {"memory_mb", k.memory_mb},
          {"disk_mb", k.disk_mb},
          {"network", k.networked}};
}

}  // namespace

// Pool members are a luxury: they go first. Runs on the pool thread: a
// malformed file (an odd kernel, a test) must never throw out of it.
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

void WarmPool::start() {
  thread_ = std::thread([this] { loop(); });
}

void WarmPool::stop() noexcept {
  std::vector<std::shared_ptr<Sandbox>> all;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  {
    std::lock_guard lock(mu_);
    all.swap(retired_);
    for (auto& [key, slot] : slots_) {
      for (auto& m : slot.ready) all.push_back(m);
      slot.ready.clear();
    }
  }
  for (auto& m : all) members_.end(*m, "warm pool drained (daemon stopping)");
}

Slot* WarmPool::learn_shape(const Key& key, int64_t now) {
  if (opts_.learn_shapes <= 0) return nullptr;
  const int64_t budget = opts_.learn_memory_mb;
  // The learned slots' count and memory (target members x memory_mb).
  auto learned = [&] {
    std::pair<int, int64_t> n{0, 0};
    for (const auto& [k, slot] : slots_)
      if (slot.learned) ++n.first, n.second += int64_t{slot.target} * k.memory_mb;
    return n;
  };
  if (auto it = slots_.find(key); it != slots_.end()) {
    Slot& slot = it->second;
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
  for (auto [count, mb] = learned(); count >= opts_.learn_shapes || mb + key.memory_mb > budget;
       std::tie(count, mb) = learned()) {
    auto lru = slots_.end();
    for (auto it = slots_.begin(); it != slots_.end(); ++it)
      if (it->second.learned &&
          (lru == slots_.end() || it->second.last_used_ms < lru->second.last_used_ms))
        lru = it;
    if (lru == slots_.end()) return nullptr;
    for (auto& m : lru->second.ready) retired_.push_back(m);
    slots_.erase(lru);
  }
  Slot& slot = slots_[key];
  slot.key = key;
  slot.learned = true;
  slot.target = 1;
  slot.last_used_ms = now;
  return &slot;
}

std::shared_ptr<Sandbox> WarmPool::take(const Key& key) {
  std::shared_ptr<Sandbox> sb;
  std::vector<std::shared_ptr<Sandbox>> dead;
  {
    std::lock_guard lock(mu_);
    const int64_t now = steady_ms();
    auto it = slots_.find(key);
    Slot* slot = it == slots_.end() ? nullptr : &it->second;
    while (slot && !slot->ready.empty() && !sb) {
      auto cand = slot->ready.front();
      slot->ready.pop_front();
      if (members_.usable(*cand, true))
        sb = cand;
      else
        dead.push_back(cand);
    }
    // A miss teaches the pool this shape (or grows its learned slot); the
    // thread makes the member on its next tick.
    if (!sb && (!slot || slot->learned)) slot = learn_shape(key, now);
    if (slot) {
      slot->last_used_ms = now;
      slot->replaced += static_cast<int64_t>(dead.size());
      ++(sb ? slot->hits : slot->misses);
      auto& counts = counts_[key.image];
      ++(sb ? counts.first : counts.second);
    }
  }
  // The refill starts on the next tick (<= tick_ms), not at once, so the new
  // QEMU does not compete for the CPU with the caller's first exec.
  for (auto& d : dead) members_.end_async(d, "pool member died while idle");
  return sb;
}

void WarmPool::set_slot(const Key& key, int size) {
  std::deque<std::shared_ptr<Sandbox>> old;
  {
    std::lock_guard lock(mu_);
    if (size == 0) {
      if (auto it = slots_.find(key); it != slots_.end()) {
        old.swap(it->second.ready);
        slots_.erase(it);
      }
    } else {
      auto& slot = slots_[key];
      slot.key = key;
      slot.target = size;
      slot.learned = false;  // the operator's from now on: learning leaves it alone
      slot.last_used_ms = steady_ms();
    }
    kicked_ = true;
  }
  for (auto& m : old) members_.end(*m, "warm pool slot removed");
  wake_.notify_all();
}

nlohmann::json WarmPool::info() const {
  nlohmann::json out = nlohmann::json::array();
  std::lock_guard lock(mu_);
  for (const auto& [key, slot] : slots_) {
    nlohmann::json ids = nlohmann::json::array();
    for (const auto& m : slot.ready) ids.push_back(m->rec.info.id);
    out.push_back({{"image", key.image},
                   {"shape", shape_json(key)},
                   {"learned", slot.learned},
                   {"target", slot.target},
                   {"ready", slot.ready.size()},
                   {"members", ids},
                   {"hits", slot.hits},
                   {"misses", slot.misses},
                   {"replaced", slot.replaced},
                   {"shed", slot.shed}});
  }
  return out;
}

std::map<std::string, std::pair<int64_t, int64_t>> WarmPool::counts() const {
  std::lock_guard lock(mu_);
  return counts_;
}

std::optional<Key> WarmPool::plan_tick(bool pressure, std::vector<std::shared_ptr<Sandbox>>& drop) {
  drop.swap(retired_);
  const int64_t now = steady_ms();
  const int64_t idle_ms = int64_t{opts_.learn_idle_s} * 1000;
  // Learned shapes unused for learn_idle_s are forgotten.
  for (auto it = slots_.begin(); it != slots_.end();) {
    if (it->second.learned && now - it->second.last_used_ms > idle_ms) {
      for (auto& m : it->second.ready) drop.push_back(m);
      it = slots_.erase(it);
    } else {
      ++it;
    }
  }
  // Under pressure one member per slot per tick goes, the learned slots'
  // first: the configured ones shed only when no learned member is left.
  bool learned_left = false;
  for (const auto& [key, slot] : slots_) learned_left |= slot.learned && !slot.ready.empty();
  for (auto& [key, slot] : slots_) {
    for (auto it = slot.ready.begin(); it != slot.ready.end();) {
      if (!members_.usable(**it, false)) {
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
  if (pressure) return std::nullopt;
  // Configured slots fill before learned ones.
  for (bool learned : {false, true})
    for (const auto& [key, slot] : slots_)
      if (slot.learned == learned && static_cast<int>(slot.ready.size()) < slot.target) return key;
  return std::nullopt;
}

bool WarmPool::fill_one(const Key& key) {
  bool more = false;
  try {
    auto sb = members_.make(key);
    std::unique_lock lock(mu_);
    auto it = slots_.find(key);
    bool wanted = !stopping_ && it != slots_.end() &&
                  static_cast<int>(it->second.ready.size()) < it->second.target;
    if (wanted) it->second.ready.push_back(sb);
    for (const auto& [k, slot] : slots_)
      more |= wanted && static_cast<int>(slot.ready.size()) < slot.target;
    lock.unlock();
    if (!wanted) members_.end(*sb, "not needed by the warm pool any more");
  } catch (const std::exception& e) {
    spdlog::warn("warm pool for {}: could not make a member: {}", key.image, e.what());
    std::unique_lock lock(mu_);
    // A learned shape that cannot be made is forgotten (it was a guess; the
    // next create of it learns it again). A configured one backs off instead
    // of spinning on a persistent failure.
    auto it = slots_.find(key);
    if (it != slots_.end() && it->second.learned) {
      for (auto& m : it->second.ready) retired_.push_back(m);
      slots_.erase(it);
    } else {
      wake_.wait_for(lock, std::chrono::seconds(5), [&] { return stopping_; });
    }
  }
  return more;
}

void WarmPool::loop() {
  std::unique_lock lock(mu_);
  // A member was just added and a slot still wants more: the next one starts
  // at once instead of a tick later (a pool of 4 refilled in 4 clones' time,
  // not 4 ticks more), so refills keep up with a client that drains it.
  bool more = false;
  while (!stopping_) {
    if (!more)
      wake_.wait_for(lock, std::chrono::milliseconds(opts_.tick_ms),
                     [&] { return stopping_ || kicked_; });
    more = kicked_ = false;
    if (stopping_) break;
    // Collect what to do under the lock; do it (slow: VMs) outside.
    lock.unlock();
    const bool pressure = opts_.pressure();
    lock.lock();
    std::vector<std::shared_ptr<Sandbox>> drop;
    std::optional<Key> fill = plan_tick(pressure, drop);
    lock.unlock();
    for (auto& d : drop) members_.end(*d, "dropped from the warm pool");
    if (pressure && !drop.empty())
      spdlog::warn("memory pressure: shed {} pool member(s)", drop.size());
    if (fill) more = fill_one(*fill);
    lock.lock();
  }
}

}  // namespace airlock::engine::pool

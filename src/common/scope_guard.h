// ScopeGuard: runs an action at scope exit unless dismissed. Every resource a
// multi-step operation acquires is held by one until its commit point, so an
// exception or early return on any step releases what the earlier steps took.
#pragma once

#include <functional>
#include <utility>

namespace airlock {

class ScopeGuard {
 public:
  explicit ScopeGuard(std::function<void()> f) : f_(std::move(f)) {}
  ~ScopeGuard() {
    if (f_) f_();
  }
  void dismiss() { f_ = nullptr; }
  // Runs the action now (once).
  void fire() {
    auto f = std::move(f_);
    f_ = nullptr;
    if (f) f();
  }
  ScopeGuard(const ScopeGuard&) = delete;
  ScopeGuard& operator=(const ScopeGuard&) = delete;

 private:
  std::function<void()> f_;
};

}  // namespace airlock

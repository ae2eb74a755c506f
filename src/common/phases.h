// Per-phase wall times of one operation, logged as one line when it ends
// (fork, snapshot, restore: where their time goes, measured, not guessed).
//
//   Phases ph("fork " + id);
//   ... ph.mark("snapshot"); ... ph.mark("restore");
//   // destructor: "fork sb-1: snapshot 120 ms, restore 300 ms; total 420 ms"
#pragma once

#include <spdlog/spdlog.h>

#include <chrono>
#include <string>

namespace airlock {

class Phases {
 public:
  explicit Phases(std::string what) : what_(std::move(what)), t0_(Clock::now()), last_(t0_) {}
  ~Phases() {
    try {
      spdlog::info("{}: {}total {} ms", what_, line_, ms(t0_, Clock::now()));
    } catch (...) {
    }
  }
  Phases(const Phases&) = delete;
  Phases& operator=(const Phases&) = delete;

  // The time since the previous mark (or the start) is phase `name`.
  void mark(const char* name) {
    auto now = Clock::now();
    line_ += std::string(name) + " " + std::to_string(ms(last_, now)) + " ms, ";
    last_ = now;
  }

 private:
  using Clock = std::chrono::steady_clock;
  static long long ms(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(b - a).count();
  }
  std::string what_, line_;
  Clock::time_point t0_, last_;
};

}  // namespace airlock

// Phase timings of the hot paths (pool hand-out, exec, delete) for the
// start-up benchmark (bench/start.py): with AIRLOCK_TRACE=1 in airlockd's
// environment every traced call logs one line
//
//   trace create sb-0123456789ab image=12 take=40 record=310 total=380
//
// (microseconds since the previous mark; total since construction). Off (the
// default), a Trace costs one branch per mark: the switch is read once.
//
//   Trace t("exec", id);
//   ... t.mark("journal"); ... t.mark("guest");
//   t.note("agent", guest_us);  // a figure measured elsewhere (the guest)
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace airlock::engine {

class Trace {
 public:
  Trace(const char* op, std::string id);
  ~Trace();  // logs the line if enabled
  Trace(const Trace&) = delete;
  Trace& operator=(const Trace&) = delete;

  static bool enabled();
  // The time since the previous mark (or construction), as `phase`.
  void mark(const char* phase);
  // A value measured elsewhere, logged as is.
  void note(const char* name, int64_t value);
  void set_id(std::string id) { id_ = std::move(id); }

 private:
  bool on_;
  const char* op_;
  std::string id_;
  std::string line_;
  std::chrono::steady_clock::time_point start_, last_;
};

}  // namespace airlock::engine

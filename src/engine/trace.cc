#include "engine/trace.h"

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <cstring>

namespace airlock::engine {

bool Trace::enabled() {
  static const bool on = [] {
    const char* v = std::getenv("AIRLOCK_TRACE");
    return v && *v && std::strcmp(v, "0") != 0;
  }();
  return on;
}

Trace::Trace(const char* op, std::string id) : on_(enabled()), op_(op), id_(std::move(id)) {
  if (on_) start_ = last_ = std::chrono::steady_clock::now();
}

void Trace::mark(const char* phase) {
  if (!on_) return;
  auto now = std::chrono::steady_clock::now();
  note(phase, std::chrono::duration_cast<std::chrono::microseconds>(now - last_).count());
  last_ = now;
}

void Trace::note(const char* name, int64_t value) {
  if (!on_) return;
  line_ += ' ';
  line_ += name;
  line_ += '=';
  line_ += std::to_string(value);
}

Trace::~Trace() {
  if (!on_) return;
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                                  start_)
                .count();
  spdlog::info("trace {} {}{} total={}", op_, id_, line_, us);
}

}  // namespace airlock::engine

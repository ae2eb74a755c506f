// Tests: destroy() answers once the sandbox is `stopping` and the teardown
// finishes in the background (engine_reclaim.cc). Tests that check what a
// finished teardown leaves (state `deleted`, no VM, no files) wait for it.
#pragma once

#include <chrono>
#include <string>
#include <thread>

#include "engine/engine.h"
#include "engine/types_json.h"

namespace airlock::engine::testing {

// destroy(id) (its errors propagate as they are), then waits up to 60 s for
// the teardown to complete: the journal's `deleted` record, written after
// the VM, helper and files are gone. (get() shows `deleted` from the
// moment destroy() returns, so it cannot tell.)
inline void destroy_wait(Engine& engine, const std::string& id) {
  engine.destroy(id);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    auto recs = engine.audit(id);
    if (!recs.empty() && recs.back().value("event", "") == "deleted") return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace airlock::engine::testing

// The API handlers: route an Exchange to the engine (internal to airlockd).
#pragma once

#include <functional>

#include "daemon/exchange.h"
#include "engine/engine.h"

namespace airlock::daemon {

// Runs `fn`, which answers `ex`; what it throws is answered in the one
// error style (airlock::Error as its HTTP status, anything else 500). Once
// an answer began nothing more is written, except that a stream left open
// is aborted so its client sees a truncated body instead of waiting.
// Never throws.
void answer_errors(Exchange& ex, const std::function<void()>& fn);

// Answers one request. Never throws for anything a client can cause:
// airlock::Error becomes its HTTP status, other exceptions 500.
void handle(engine::Engine& engine, Exchange& ex, ServerCounters& counters);

}  // namespace airlock::daemon

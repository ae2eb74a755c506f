// The API handlers: route an Exchange to the engine (internal to airlockd).
#pragma once

#include "daemon/exchange.h"
#include "engine/engine.h"

namespace airlock::daemon {

// Answers one request. Never throws for anything a client can cause:
// airlock::Error becomes its HTTP status, other exceptions 500.
void handle(engine::Engine& engine, Exchange& ex, ServerCounters& counters);

}  // namespace airlock::daemon

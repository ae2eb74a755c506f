// JSON forms of the engine's public types (api/types.h), shared by the registry
// (which stores specs as JSON) and the daemon-facing to_json() functions.
//
//   nlohmann::json j = spec_to_json(spec);
//   SandboxSpec back = spec_from_json(j);   // tolerant: missing keys keep defaults
//   State s = state_from_string("running"); // throws Error(internal) if unknown
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>

#include "engine/api/types.h"

namespace airlock::engine {

nlohmann::json spec_to_json(const SandboxSpec& spec);
// Reads back what spec_to_json wrote. This is for trusted, stored data (the
// registry); caller-supplied JSON is validated by the daemon's own parser.
SandboxSpec spec_from_json(const nlohmann::json& j);

// Inverse of to_string(State). Throws Error(internal) for an unknown name
// (the registry only ever stores names written by to_string).
State state_from_string(std::string_view name);

// True for the states a sandbox never leaves (deleted, timed_out, failed).
bool is_terminal(State state);

}  // namespace airlock::engine

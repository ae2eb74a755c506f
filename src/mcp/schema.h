// A small JSON Schema checker for tool arguments: the subset airlock's own
// tool schemas use (type, properties, required, additionalProperties, items,
// enum, minimum/maximum, minItems/maxItems, minLength/maxLength, pattern).
// Checking arguments against the very schema tools/list publishes keeps the
// two from drifting apart.
//
//   if (auto bad = check_schema(tool["inputSchema"], args))
//     // bad->field == "env.FOO", bad->message == "env.FOO must be a string"
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace airlock::mcp {

struct SchemaViolation {
  std::string field;    // "argv[2]", "network.allow[0]", "" for the whole value
  std::string message;  // names the field and what was expected
};

// The first violation of `value` against `schema`, or nullopt. Keywords
// outside the subset are ignored (they are documentation to clients).
std::optional<SchemaViolation> check_schema(const nlohmann::json& schema,
                                            const nlohmann::json& value,
                                            const std::string& field = "");

}  // namespace airlock::mcp

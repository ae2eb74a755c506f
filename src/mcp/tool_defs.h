// The tools `airlock mcp` offers, as tools/list publishes them: name, title,
// description, inputSchema (also what arguments are checked against) and,
// for tools with structured results, outputSchema.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace airlock::mcp {

// All tool definitions, in a stable order.
const nlohmann::json& tool_definitions();

// The definition named `name`, or nullptr.
const nlohmann::json* find_tool(const std::string& name);

// Defaults the tools apply when an argument is omitted (kept here, beside the
// schemas that document them).
inline constexpr double kDefaultExecTimeoutS = 300;
inline constexpr int64_t kDefaultMaxOutputBytes = 256 * 1024;
inline constexpr int64_t kMaxOutputBytes = 16 << 20;
inline constexpr int64_t kDefaultMaxReadBytes = 1 << 20;
inline constexpr int64_t kMaxReadBytes = 16 << 20;
inline constexpr int64_t kDefaultLogLimit = 200;

}  // namespace airlock::mcp

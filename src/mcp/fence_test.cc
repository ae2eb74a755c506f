// The MCP server and the CLI share airlockd's client (src/client), not each
// other's code: nothing under src/mcp or src/client includes a cli/ header,
// and src/client includes no mcp/ one. (The CLI may include the MCP
// server's: `airlock mcp` runs it.)
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <string>

#include "common/source_tree_test_support.h"

namespace airlock::mcp {
namespace {

namespace fs = std::filesystem;

std::regex includes_of(const std::string& folder) {
  return std::regex("^\\s*#\\s*include\\s*[<\"]" + folder + "/");
}

TEST(Fence, McpAndTheClientIncludeNothingOfTheCli) {
  const fs::path src = fs::path(AIRLOCK_SOURCE_DIR) / "src";
  // Anything listed: share it through src/client instead.
  EXPECT_EQ(fence_breaks(src, {"mcp", "client"}, includes_of("cli")), "");
  EXPECT_EQ(fence_breaks(src, {"client"}, includes_of("mcp"), {}, 2), "");
}

}  // namespace
}  // namespace airlock::mcp

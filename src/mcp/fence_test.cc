// The MCP server and the CLI share airlockd's client (src/client), not each
// other's code: nothing under src/mcp or src/client includes a cli/ header,
// and src/client includes no mcp/ one. (The CLI may include the MCP
// server's: `airlock mcp` runs it.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace airlock::mcp {
namespace {

namespace fs = std::filesystem;

// "file:line: text" for each line of the .cc/.h files under `dir` that
// includes a header of `folder`.
std::vector<std::string> includes_of(const fs::path& src, const std::string& dir,
                                     const std::string& folder, size_t& files) {
  const std::regex include("^\\s*#\\s*include\\s*[<\"]" + folder + "/");
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(src / dir)) {
    auto ext = e.path().extension();
    if (!e.is_regular_file() || (ext != ".cc" && ext != ".h")) continue;
    ++files;
    std::ifstream in(e.path());
    std::string line;
    for (int n = 1; std::getline(in, line); ++n)
      if (std::regex_search(line, include))
        out.push_back(fs::relative(e.path(), src).string() + ":" + std::to_string(n) + ": " + line);
  }
  return out;
}

TEST(Fence, McpAndTheClientIncludeNothingOfTheCli) {
  const fs::path src = fs::path(AIRLOCK_SOURCE_DIR) / "src";
  size_t files = 0;
  std::vector<std::string> found;
  for (const auto& [dir, folder] : std::vector<std::pair<std::string, std::string>>{
           {"mcp", "cli"}, {"client", "cli"}, {"client", "mcp"}})
    for (auto& f : includes_of(src, dir, folder, files)) found.push_back(f);
  EXPECT_GT(files, 10u);  // the tree was found
  std::string all;
  for (const auto& f : found) all += f + "\n";
  EXPECT_TRUE(found.empty()) << "share it through src/client instead:\n" << all;
}

}  // namespace
}  // namespace airlock::mcp

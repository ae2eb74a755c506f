// The engine's clients see it through its interface only: no source of the
// daemon, E2B, MCP, the CLI, the registry or the recipe builder includes
// engine.h (or the engine's inside), so each compiles against
// engine/api/ and its tests run on FakeSandboxService. airlockd's main.cc,
// which constructs the Engine, is the one exception.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace airlock::daemon {
namespace {

namespace fs = std::filesystem;

// "file:line: text" for every line of `text` that includes the engine's
// facade or its inside.
std::vector<std::string> engine_includes(const std::string& file, const std::string& text) {
  static const std::regex include(R"(^\s*#\s*include\s*[<"]engine/(engine|engine_impl)\.h[>"])");
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n)
    if (std::regex_search(line, include))
      out.push_back(file + ":" + std::to_string(n) + ": " + line);
  return out;
}

TEST(EngineFence, TheCheckSeesEachWayIn) {
  for (const char* bad : {"#include \"engine/engine.h\"", "  #  include \"engine/engine.h\"",
                          "#include <engine/engine.h>", "#include \"engine/engine_impl.h\""})
    EXPECT_EQ(engine_includes("f.cc", bad).size(), 1u) << bad;
  for (const char* fine : {"#include \"engine/api/service.h\"", "// engine/engine.h implements it",
                           "#include \"engine/engine_metrics.h\""})
    EXPECT_TRUE(engine_includes("f.cc", fine).empty()) << fine;
}

TEST(EngineFence, ClientsIncludeOnlyTheInterface) {
  const fs::path src = fs::path(AIRLOCK_SOURCE_DIR) / "src";
  const std::set<fs::path> allowed = {src / "daemon" / "main.cc"};
  std::vector<std::string> found;
  size_t files = 0;
  for (const char* dir : {"daemon", "e2b", "mcp", "cli", "recipes", "engine/registry"}) {
    for (const auto& e : fs::recursive_directory_iterator(src / dir)) {
      auto ext = e.path().extension();
      if (!e.is_regular_file() || (ext != ".cc" && ext != ".h")) continue;
      ++files;
      if (allowed.count(e.path())) continue;
      std::ifstream in(e.path());
      std::stringstream text;
      text << in.rdbuf();
      for (auto& f : engine_includes(fs::relative(e.path(), src).string(), text.str()))
        found.push_back(f);
    }
  }
  EXPECT_GT(files, 50u);  // the tree was found
  std::string all;
  for (const auto& f : found) all += f + "\n";
  EXPECT_TRUE(found.empty()) << "include engine/api/service.h instead:\n" << all;
}

}  // namespace
}  // namespace airlock::daemon

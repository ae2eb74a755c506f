// The engine's clients see it through its interface only: no source of the
// daemon, E2B, MCP, the CLI, the registry or the recipe builder includes
// engine.h (or the engine's inside), so each compiles against
// engine/api/ and its tests run on FakeSandboxService. airlockd's main.cc,
// which constructs the Engine, is the one exception.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>

#include "common/source_tree_test_support.h"

namespace airlock::daemon {
namespace {

namespace fs = std::filesystem;

// The includes of the engine's facade or its inside.
const std::regex& engine_include() {
  static const std::regex include(R"(^\s*#\s*include\s*[<"]engine/(engine|engine_impl)\.h[>"])");
  return include;
}

TEST(EngineFence, TheCheckSeesEachWayIn) {
  for (const char* bad : {"#include \"engine/engine.h\"", "  #  include \"engine/engine.h\"",
                          "#include <engine/engine.h>", "#include \"engine/engine_impl.h\""})
    EXPECT_TRUE(std::regex_search(bad, engine_include())) << bad;
  for (const char* fine : {"#include \"engine/api/service.h\"", "// engine/engine.h implements it",
                           "#include \"engine/engine_metrics.h\""})
    EXPECT_FALSE(std::regex_search(fine, engine_include())) << fine;
}

TEST(EngineFence, ClientsIncludeOnlyTheInterface) {
  const fs::path src = fs::path(AIRLOCK_SOURCE_DIR) / "src";
  // Anything listed includes engine.h: include engine/api/service.h instead.
  EXPECT_EQ(fence_breaks(src, {"daemon", "e2b", "mcp", "cli", "recipes", "engine/registry"},
                         engine_include(), {src / "daemon" / "main.cc"}, 50),
            "");
}

}  // namespace
}  // namespace airlock::daemon

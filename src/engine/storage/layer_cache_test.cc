// prune_layers on a layer cache of the test's own (the build that fills it
// runs real VMs: tests/integration/test_recipes.py).
#include "engine/storage/layer_cache.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

namespace airlock::storage {
namespace {
namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    std::string t = (fs::temp_directory_path() / "airlock-prune-XXXXXX").string();
    path = ::mkdtemp(t.data());
  }
  ~TempDir() { fs::remove_all(path); }
};

TEST(PruneLayers, RemovesCachedLayersOnlyWhenNotADryRunAndLeavesOtherEntries) {
  TempDir images;
  std::vector<std::string> removed;
  EXPECT_EQ(prune_layers(images.path, false, removed), 0u);  // no cache yet
  EXPECT_TRUE(removed.empty());

  fs::path layers = layer_dir(images.path);
  fs::create_directories(layers);
  for (const char* name : {"a.qcow2", "b.qcow2"})
    std::ofstream(layers / name) << std::string(8192, 'x');
  fs::create_directory(layers / "not-a-layer");
  fs::create_symlink("/etc/passwd", layers / "link.qcow2");  // never followed nor removed

  auto bytes = prune_layers(images.path, true, removed);
  ASSERT_TRUE(bytes);
  EXPECT_GE(*bytes, 2 * 8192u);
  std::sort(removed.begin(), removed.end());
  EXPECT_EQ(removed, (std::vector<std::string>{"build-cache:a.qcow2", "build-cache:b.qcow2"}));
  EXPECT_TRUE(fs::exists(layers / "a.qcow2"));  // a dry run removes nothing

  removed.clear();
  ASSERT_TRUE(prune_layers(images.path, false, removed));
  EXPECT_EQ(removed.size(), 2u);
  EXPECT_FALSE(fs::exists(layers / "a.qcow2"));
  EXPECT_FALSE(fs::exists(layers / "b.qcow2"));
  EXPECT_TRUE(fs::is_directory(layers / "not-a-layer"));
  EXPECT_TRUE(fs::is_symlink(layers / "link.qcow2"));
  EXPECT_TRUE(fs::exists("/etc/passwd"));
}

TEST(PruneLayers, LeavesTheCacheAloneWhileABuildHoldsIt) {
  TempDir images;
  fs::path layers = layer_dir(images.path);
  fs::create_directories(layers);
  std::ofstream(layers / "a.qcow2") << "layer";
  std::vector<std::string> removed;
  {
    LayerCacheUse build;
    EXPECT_EQ(prune_layers(images.path, false, removed), std::nullopt);
    EXPECT_TRUE(removed.empty());
    EXPECT_TRUE(fs::exists(layers / "a.qcow2"));
    LayerCacheUse second_build;  // builds do not exclude each other
  }
  EXPECT_TRUE(prune_layers(images.path, false, removed));
  EXPECT_FALSE(fs::exists(layers / "a.qcow2"));
}

}  // namespace
}  // namespace airlock::storage

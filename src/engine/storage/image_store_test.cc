// Real image builds from the recipes in images/ (the kernel package is
// downloaded once and cached; see kernel_cache() below).
#include "engine/storage/image_store.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <set>

#include "common/error.h"
#include "common/subprocess.h"

namespace airlock::storage {
namespace {
namespace fs = std::filesystem;

const fs::path kRecipes = fs::path(AIRLOCK_SOURCE_DIR) / "images";

// Unpacked kernels are shared between test runs (and with `make test`'s image
// directory when AIRLOCK_IMAGE_DIR is set) so only the first run downloads.
fs::path kernel_cache() {
  const char* d = std::getenv("AIRLOCK_IMAGE_DIR");
  fs::path p = d && *d ? fs::path(d) / "cache" / "kernel"
                       : fs::temp_directory_path() / "airlock-test-kernel-cache";
  fs::create_directories(p);
  return p;
}

class ImageStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "airlock-image-test-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    images_ = root_ / "images";
    fs::create_directories(images_ / "cache");
    fs::create_directory_symlink(kernel_cache(), images_ / "cache" / "kernel");
    // Any static binary will do as the "agent": only its bytes are keyed.
    agent_ = root_ / "airlock-guest";
    fs::copy_file("/bin/busybox", agent_);
  }
  void TearDown() override {
    run_command({"sh", "-c", "chmod -R u+w \"$0\"; rm -rf \"$0\"", root_.string()});
  }

  fs::path copy_recipes() {
    fs::path d = root_ / "recipes";
    fs::create_directories(d);
    for (const auto& e : fs::directory_iterator(kRecipes))
      if (e.path().extension() == ".sh") fs::copy_file(e.path(), d / e.path().filename());
    return d;
  }

  static std::string debugfs_cat(const fs::path& img, const std::string& path) {
    return run_checked({"debugfs", "-R", "cat " + path, img.string()}).out;
  }

  fs::path root_, images_, agent_;
};

TEST_F(ImageStoreTest, RecipesAreListed) {
  ImageStore store(images_, kRecipes, agent_);
  auto r = store.recipes();
  EXPECT_EQ(r, (std::vector<std::string>{"debian", "minimal"}));
}

TEST_F(ImageStoreTest, BuildsMinimalReadOnlyAndOnlyOnce) {
  ImageStore store(images_, kRecipes, agent_);
  EXPECT_FALSE(store.find("minimal").has_value());
  std::set<std::string> steps;
  uint64_t max_bytes = 0;
  Image img = store.build("minimal", [&](const BuildProgress& p) {
    steps.insert(p.step);
    max_bytes = std::max(max_bytes, p.bytes);
  });
  EXPECT_TRUE(steps.count("busybox")) << "steps reported by the recipe";
  EXPECT_TRUE(steps.count("mkfs.ext4"));
  EXPECT_TRUE(steps.count("cpio"));
  EXPECT_GT(max_bytes, 0u);

  EXPECT_EQ(img.name, "minimal");
  EXPECT_EQ(img.key.size(), 16u);
  EXPECT_EQ(img.dir, images_ / "minimal" / img.key);
  EXPECT_EQ(img.kernel_release.find("cloud-amd64") != std::string::npos, true)
      << img.kernel_release;
  EXPECT_EQ(img.rootfs_bytes, 128u << 20);
  for (const auto& f : {img.kernel, img.initrd, img.rootfs, img.dir / "image.json"}) {
    ASSERT_TRUE(fs::is_regular_file(f)) << f;
    struct stat st;
    ASSERT_EQ(::stat(f.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0222, 0u) << f << " must be read-only";
  }
  EXPECT_GT(fs::file_size(img.kernel), 1u << 20);
  EXPECT_GT(fs::file_size(img.initrd), 1u << 20);  // busybox + modules + agent

  // The root filesystem has the users and busybox applets.
  std::string passwd = debugfs_cat(img.rootfs, "/etc/passwd");
  EXPECT_NE(passwd.find("root:x:0:0:"), std::string::npos);
  EXPECT_NE(passwd.find("user:x:1000:1000:sandbox user:/home/user:/bin/sh"), std::string::npos);
  EXPECT_EQ(debugfs_cat(img.rootfs, "/etc/hostname"), "airlock\n");
  auto home = run_checked({"debugfs", "-R", "stat /home/user", img.rootfs.string()}).out;
  EXPECT_TRUE(std::regex_search(home, std::regex("User: +1000 +Group: +1000"))) << home;
  auto stat_sh = run_checked({"debugfs", "-R", "stat /bin/sh", img.rootfs.string()}).out;
  EXPECT_NE(stat_sh.find("Type: symlink"), std::string::npos) << stat_sh;

  // The initramfs carries /init, the agent and the modules in load order.
  auto listing =
      run_checked({"sh", "-c", "(zcat -f \"$0\" | cpio -it --quiet) 2>&1", img.initrd.string()})
          .out;
  for (const char* f : {"init", "airlock-guest", "bin/busybox", "lib/modules/virtio_blk.ko",
                        "lib/modules/virtio_pci.ko", "lib/modules/load-order"})
    EXPECT_NE(listing.find(f), std::string::npos) << f << " missing in initramfs:\n" << listing;

  auto found = store.find("minimal");
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->key, img.key);
  auto all = store.list();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].key, img.key);

  // Second build: same key, nothing rebuilt.
  auto t0 = std::chrono::steady_clock::now();
  bool progressed = false;
  Image again = store.build("minimal", [&](const BuildProgress&) { progressed = true; });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  EXPECT_FALSE(progressed);
  EXPECT_EQ(again.key, img.key);
  EXPECT_EQ(again.built_at, img.built_at);

  // A new agent makes a new key but reuses the root filesystem (same inode).
  { std::ofstream(agent_, std::ios::app) << "changed"; }
  EXPECT_FALSE(store.find("minimal").has_value()) << "the old image is no longer current";
  Image agent2 = store.build("minimal");
  EXPECT_NE(agent2.key, img.key);
  struct stat a, b;
  ASSERT_EQ(::stat(img.rootfs.c_str(), &a), 0);
  ASSERT_EQ(::stat(agent2.rootfs.c_str(), &b), 0);
  EXPECT_EQ(a.st_ino, b.st_ino) << "rootfs must be shared, not rebuilt";
  EXPECT_TRUE(fs::exists(img.dir)) << "old images stay for sandboxes still using them";

  // No temporary directories are left anywhere.
  for (const auto& e : fs::recursive_directory_iterator(images_ / "minimal"))
    EXPECT_EQ(e.path().filename().string().rfind(".tmp-", 0), std::string::npos) << e.path();
}

TEST_F(ImageStoreTest, ChangedRecipeMakesNewKeyAndRootfs) {
  fs::path recipes = copy_recipes();
  ImageStore store(images_, recipes, agent_);
  Image first = store.build("minimal");
  { std::ofstream(recipes / "minimal.sh", std::ios::app) << "# changed\n"; }
  Image second = store.build("minimal");
  EXPECT_NE(first.key, second.key);
  struct stat a, b;
  ASSERT_EQ(::stat(first.rootfs.c_str(), &a), 0);
  ASSERT_EQ(::stat(second.rootfs.c_str(), &b), 0);
  EXPECT_NE(a.st_ino, b.st_ino);
}

TEST_F(ImageStoreTest, UnknownOrBadNames) {
  ImageStore store(images_, kRecipes, agent_);
  for (const char* bad : {"nope", "common", "initramfs"}) {
    try {
      store.build(bad);
      FAIL() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::not_found) << bad;
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos);
    }
  }
  for (const char* bad : {"../etc", "", "Minimal", "a/b"}) {
    try {
      store.find(bad);
      FAIL() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_argument) << bad;
      EXPECT_EQ(e.field(), "image");
    }
  }
}

TEST_F(ImageStoreTest, MissingAgentIsUnavailable) {
  ImageStore store(images_, kRecipes, root_ / "no-such-agent");
  EXPECT_FALSE(store.find("minimal").has_value());
  try {
    store.build("minimal");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::unavailable);
    EXPECT_NE(std::string(e.what()).find("no-such-agent"), std::string::npos);
  }
}

TEST_F(ImageStoreTest, FailedBuildNamesStepAndLeavesNothing) {
  fs::path recipes = copy_recipes();
  {
    std::ofstream f(recipes / "broken.sh");
    f << "#!/bin/sh\n# airlock-recipe: fails on purpose\nset -eu\necho '@@step prepare'\n"
         "for i in $(seq 1 40); do echo noise$i; done\necho '@@step explode'\n"
         "echo 'the real reason' >&2\nexit 3\n";
  }
  ImageStore store(images_, recipes, agent_);
  try {
    store.build("broken");
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_EQ(e.code(), Errc::internal);
    EXPECT_NE(m.find("step 'explode'"), std::string::npos) << m;
    EXPECT_NE(m.find("the real reason"), std::string::npos) << m;
    EXPECT_NE(m.find("noise40"), std::string::npos) << m;
    EXPECT_EQ(m.find("noise10\n"), std::string::npos) << "only the tail: " << m;
  }
  EXPECT_FALSE(store.find("broken").has_value());
  for (const auto& e : fs::recursive_directory_iterator(images_))
    EXPECT_EQ(e.path().filename().string().rfind(".tmp-", 0), std::string::npos) << e.path();
}

class OverlayTest : public ImageStoreTest {};

TEST_F(OverlayTest, CreatesQcow2OverBase) {
  fs::path base = root_ / "base.ext4";
  run_checked({"truncate", "-s", "64M", base.string()});
  fs::path ov = root_ / "disk.qcow2";
  create_overlay(base, ov, 256);
  auto info = run_checked({"qemu-img", "info", "--output=json", ov.string()}).out;
  EXPECT_NE(info.find("\"format\": \"qcow2\""), std::string::npos) << info;
  EXPECT_NE(info.find("\"backing-filename-format\": \"raw\""), std::string::npos) << info;
  EXPECT_NE(info.find(base.string()), std::string::npos) << info;
  EXPECT_NE(info.find("\"virtual-size\": 268435456"), std::string::npos) << info;
  // Same size as the base is allowed.
  create_overlay(base, root_ / "same.qcow2", 64);
}

TEST_F(OverlayTest, FailureModes) {
  fs::path base = root_ / "base.ext4";
  run_checked({"truncate", "-s", "64M", base.string()});
  auto expect = [&](const fs::path& b, const fs::path& ov, uint64_t mb, Errc code,
                    const char* field) {
    try {
      create_overlay(b, ov, mb);
      ADD_FAILURE() << ov;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_EQ(e.field(), field) << e.what();
    }
  };
  expect(base, root_ / "small.qcow2", 63, Errc::invalid_argument, "disk_mb");
  expect(base, root_ / "zero.qcow2", 0, Errc::invalid_argument, "disk_mb");
  expect(root_ / "missing.ext4", root_ / "m.qcow2", 128, Errc::not_found, "");
  expect(base, root_ / "no-dir" / "d.qcow2", 128, Errc::not_found, "");
  // qemu-img itself fails (it cannot create a file in /proc).
  expect(base, "/proc/airlock-overlay.qcow2", 128, Errc::internal, "");
  // An existing overlay is never overwritten.
  fs::path existing = root_ / "existing.qcow2";
  { std::ofstream(existing) << "keep"; }
  expect(base, existing, 128, Errc::conflict, "");
  std::ifstream in(existing);
  std::string s;
  in >> s;
  EXPECT_EQ(s, "keep");
  for (const char* left : {"small.qcow2", "zero.qcow2", "m.qcow2"})
    EXPECT_FALSE(fs::exists(root_ / left)) << left;
}

}  // namespace
}  // namespace airlock::storage

namespace airlock::storage {
namespace {

// install(): a directory tree becomes a complete image (kernel, initramfs
// with the agent and modules, ext4 root with the tree's owners and the mount
// points), atomically, with its config and metadata.
TEST_F(ImageStoreTest, InstallsADirectoryTreeAsAnImage) {
  ImageStore store(images_, kRecipes, agent_);
  fs::path tree = root_ / "tree";
  fs::create_directories(tree / "bin");
  fs::create_directories(tree / "app");
  fs::copy_file("/bin/busybox", tree / "bin" / "busybox");
  fs::create_symlink("busybox", tree / "bin" / "sh");
  { std::ofstream(tree / "app" / "hello.txt") << "hello\n"; }
  ASSERT_EQ(::chown((tree / "app" / "hello.txt").c_str(), 1234, 1234), 0);
  fs::create_symlink("/var/run", tree / "run");  // replaced by a real mount point

  ImageConfig c;
  c.env = {{"PATH", "/bin"}, {"GREETING", "hi"}};
  c.workdir = "/app";
  c.user = "1234";
  c.cmd = {"/bin/sh"};
  c.warmup = {"true"};
  c.labels = {{"org.example", "x"}};
  std::set<std::string> steps;
  Image img = store.install("myapp", tree, c, {.source = "test:tree", .layers = 2},
                            [&](const BuildProgress& p) { steps.insert(p.step); });
  EXPECT_TRUE(steps.count("mkfs.ext4"));
  EXPECT_EQ(img.kind, "installed");
  EXPECT_EQ(img.source, "test:tree");
  EXPECT_EQ(img.layers, 2);
  EXPECT_EQ(img.config.workdir, "/app");
  EXPECT_EQ(img.config.env.at("GREETING"), "hi");
  EXPECT_EQ(img.config.warmup, std::vector<std::string>{"true"});
  EXPECT_GT(img.disk_bytes, 0u);
  EXPECT_GT(img.built_at, 0);
  for (const auto& f : {img.kernel, img.initrd, img.rootfs}) EXPECT_TRUE(fs::is_regular_file(f));
  EXPECT_EQ(debugfs_cat(img.rootfs, "/app/hello.txt"), "hello\n");
  auto st = run_checked({"debugfs", "-R", "stat /app/hello.txt", img.rootfs.string()}).out;
  if (::geteuid() == 0) {
    EXPECT_TRUE(std::regex_search(st, std::regex("User: +1234 +Group: +1234"))) << st;
  }
  auto run = run_checked({"debugfs", "-R", "stat /run", img.rootfs.string()}).out;
  EXPECT_NE(run.find("Type: directory"), std::string::npos) << run;
  auto listing =
      run_checked({"sh", "-c", "(zcat -f \"$0\" | cpio -it --quiet) 2>&1", img.initrd.string()})
          .out;
  EXPECT_NE(listing.find("airlock-guest"), std::string::npos);
  EXPECT_NE(listing.find("lib/modules/virtio_blk.ko"), std::string::npos);

  auto found = store.find("myapp");
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->key, img.key);
  EXPECT_EQ(found->config.user, "1234");
  bool listed = false;
  for (const auto& i : store.list()) listed |= i.name == "myapp";
  EXPECT_TRUE(listed);

  // The name is taken unless replace; a recipe's name never is free.
  try {
    store.install("myapp", img.rootfs, c, {});
    ADD_FAILURE() << "a second install of a name must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::conflict);
  }
  try {
    store.install("minimal", tree, c, {});
    ADD_FAILURE() << "a recipe's name must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::conflict);
  }
  // Replace from an ext4 file: a new version becomes current, the old one
  // stays until pruned.
  Image v2 = store.install("myapp", img.rootfs, {}, {.source = "test:ext4", .replace = true});
  EXPECT_NE(v2.key, img.key);
  EXPECT_EQ(store.find("myapp")->key, v2.key);
  EXPECT_EQ(store.versions("myapp").size(), 2u);
  std::vector<fs::path> removed;
  EXPECT_GT(store.prune_versions("myapp", {}, true, &removed), 0u);
  EXPECT_EQ(removed, std::vector<fs::path>{img.dir});
  EXPECT_EQ(store.versions("myapp").size(), 2u) << "dry run removes nothing";
  EXPECT_EQ(store.prune_versions("myapp", {img.dir}, false, nullptr), 0u) << "in use: kept";
  store.prune_versions("myapp", {}, false, nullptr);
  EXPECT_EQ(store.versions("myapp"), std::vector<fs::path>{v2.dir});

  store.remove("myapp");
  EXPECT_FALSE(store.find("myapp").has_value());
  EXPECT_FALSE(fs::exists(images_ / "myapp"));
}

TEST_F(ImageStoreTest, FailedInstallLeavesNothing) {
  ImageStore store(images_, kRecipes, agent_);
  fs::path junk = root_ / "junk.ext4";
  { std::ofstream(junk) << std::string(1 << 16, 'x'); }
  try {
    store.install("bad", junk, {}, {});
    ADD_FAILURE() << "a file that is not ext4 must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument) << e.what();
    EXPECT_EQ(e.field(), "rootfs");
  }
  EXPECT_FALSE(store.find("bad").has_value());
  for (const auto& e : fs::directory_iterator(images_ / "bad"))
    EXPECT_EQ(e.path().filename(), ".lock") << "left behind: " << e.path();
  ImageConfig c;
  c.workdir = "relative";
  try {
    store.install("bad", root_, c, {});
    ADD_FAILURE() << "a relative workdir must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "config.workdir");
  }
  EXPECT_THROW(store.install("Bad Name", root_, {}, {}), Error);
}

}  // namespace
}  // namespace airlock::storage

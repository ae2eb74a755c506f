// fsdiff on real ext4 images made with mkfs.ext4 -d (no VM, no mounts):
// each kind of change, content diffs, a qcow2 layer, and hostile images.
#include "engine/fsdiff/fsdiff.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <random>

#include "common/error.h"
#include "common/subprocess.h"
#include "engine/storage/disk_chain.h"

namespace airlock::engine::fsdiff {
namespace {
namespace fs = std::filesystem;

class FsdiffTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "fsdiff-test-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  void put(const fs::path& root, const std::string& rel, const std::string& data,
           mode_t mode = 0644) {
    fs::create_directories((root / rel).parent_path());
    std::ofstream(root / rel, std::ios::binary) << data;
    ::chmod((root / rel).c_str(), mode);
  }
  fs::path mkfs(const fs::path& tree, const std::string& name) {
    fs::path img = dir_ / name;
    run_checked({"mkfs.ext4", "-q", "-F", "-d", tree.string(), img.string(), "8M"});
    return img;
  }
  fs::path dir_;
};

nlohmann::json find(const nlohmann::json& r, const std::string& path) {
  for (const auto& c : r["changes"])
    if (c["path"] == path) return c;
  return nullptr;
}

TEST_F(FsdiffTest, NamesEachKindOfChange) {
  fs::path a = dir_ / "a", b = dir_ / "b";
  for (const auto& root : {a, b}) {
    put(root, "etc/same", "unchanged\n");
    put(root, "etc/samesize", "aaaa\n");
    put(root, "bin/tool",
        std::string("\x7f"
                    "ELF\0\1\2",
                    7),
        0755);
  }
  put(a, "etc/config", "one\ntwo\nthree\n");
  put(b, "etc/config", "one\nTWO\nthree\nfour\n");
  put(b, "etc/samesize", "bbbb\n");  // same size, other bytes: still modified
  put(a, "etc/gone", "bye\n");
  put(a, "etc/mode", "x\n", 0644);
  put(b, "etc/mode", "x\n", 0600);
  put(b, "root/new", "hello\n");
  put(b, "bin/tool",
      std::string("\x7f"
                  "ELF\0\3\4",
                  7),
      0755);
  fs::create_symlink("/etc/shadow", b / "root/link");
  Options o;
  o.content = true;
  auto r = diff({mkfs(a, "a.img"), "raw"}, {mkfs(b, "b.img"), "raw"}, dir_, o);

  EXPECT_TRUE(find(r, "/etc/same").is_null());
  auto cfg = find(r, "/etc/config");
  ASSERT_FALSE(cfg.is_null()) << r.dump(2);
  EXPECT_EQ(cfg["change"], "modified");
  EXPECT_EQ(cfg["what"], nlohmann::json({"content"}));
  EXPECT_EQ(cfg["size"], 19);
  EXPECT_EQ(cfg["before"]["size"], 14);
  std::string d = cfg["diff"];
  EXPECT_NE(d.find("--- a/etc/config"), std::string::npos) << d;
  EXPECT_NE(d.find("-two\n+TWO\n three\n+four\n"), std::string::npos) << d;
  EXPECT_EQ(find(r, "/etc/samesize")["what"], nlohmann::json({"content"}));
  EXPECT_EQ(find(r, "/etc/gone")["change"], "deleted");
  EXPECT_NE(find(r, "/etc/gone")["diff"].get<std::string>().find("-bye"), std::string::npos);
  auto m = find(r, "/etc/mode");
  EXPECT_EQ(m["what"], nlohmann::json({"mode"}));
  EXPECT_EQ(m["mode"], "0600");
  EXPECT_EQ(m["before"]["mode"], "0644");
  auto n = find(r, "/root/new");
  EXPECT_EQ(n["change"], "added");
  EXPECT_EQ(n["type"], "file");
  EXPECT_NE(n["diff"].get<std::string>().find("+hello"), std::string::npos);
  EXPECT_EQ(find(r, "/root")["change"], "added");
  EXPECT_EQ(find(r, "/root")["type"], "dir");
  // A symlink is data: its target is reported, never followed on the host.
  auto l = find(r, "/root/link");
  EXPECT_EQ(l["type"], "symlink");
  EXPECT_EQ(l["target"], "/etc/shadow");
  auto bin = find(r, "/bin/tool");
  EXPECT_EQ(bin["binary"], true);
  EXPECT_FALSE(bin.contains("diff"));
  EXPECT_EQ(r["summary"]["deleted"], 1);
}

TEST_F(FsdiffTest, ReadsAQcow2LayerOverARawBase) {
  fs::path a = dir_ / "a";
  put(a, "f", "x\n");
  fs::path base = mkfs(a, "base.img");
  // An overlay with nothing written: no changes through the qcow2 chain.
  fs::path top = dir_ / "top.qcow2";
  run_checked(
      {"qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", base.string(), top.string()});
  // Whatever the header says: the chain given is the chain read.
  run_checked(
      {"qemu-img", "rebase", "-u", "-f", "qcow2", "-F", "raw", "-b", "/nonexistent", top.string()});
  storage::ChainLink l0{top, "qcow2"}, l1{base, "raw"};
  auto r = diff({base, "raw"}, {top, "qcow2", storage::image_opts({l0, l1})}, dir_, {});
  EXPECT_EQ(r["changes"].size(), 0u) << r.dump(2);
  // A qcow2 layer without its explicit chain is never opened by its name.
  EXPECT_THROW(diff({base, "raw"}, {top, "qcow2"}, dir_, {}), Error);
  EXPECT_TRUE(r["timing_ms"].contains("materialize"));
  // The temporary raw copy is gone.
  for (auto& e : fs::directory_iterator(dir_))
    EXPECT_NE(e.path().filename().string().rfind("fsdiff-", 0), 0u) << e.path();
}

TEST_F(FsdiffTest, NotExt4IsAClearError) {
  fs::path junk = dir_ / "junk.img";
  std::ofstream(junk) << std::string(1 << 20, 'x');
  try {
    diff({junk, "raw"}, {junk, "raw"}, dir_, {});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::unavailable);
    EXPECT_NE(std::string(e.what()).find("not a readable ext4"), std::string::npos) << e.what();
  }
}

TEST_F(FsdiffTest, BoundsTheWalk) {
  fs::path a = dir_ / "a";
  for (int i = 0; i < 50; ++i) put(a, "d/f" + std::to_string(i), "x");
  fs::path img = mkfs(a, "a.img");
  Options o;
  o.limits.max_entries = 20;
  EXPECT_THROW(diff({img, "raw"}, {img, "raw"}, dir_, o), Error);
  o.limits.max_entries = 1000;
  o.limits.max_changes = 0;
  EXPECT_EQ(diff({img, "raw"}, {img, "raw"}, dir_, o)["truncated"], false);
}

// Hostile images: random bytes over the metadata of a real filesystem. Every
// run ends in a result or a typed Error; the walker runs in a child, so even
// a libext2fs crash would be an Error here, not a dead test.
TEST_F(FsdiffTest, SurvivesCorruptFilesystems) {
  fs::path a = dir_ / "a";
  for (int i = 0; i < 30; ++i) put(a, "d" + std::to_string(i % 5) + "/f" + std::to_string(i), "x");
  fs::create_symlink("../../../../etc/passwd", a / "escape");
  fs::path good = mkfs(a, "good.img");
  std::mt19937 rng(12345);
  constexpr int kRounds = 16;  // ~1 s each on a loaded 2-core machine
  int results = 0, errors = 0;
  for (int round = 0; round < kRounds; ++round) {
    fs::path bad = dir_ / "bad.img";
    fs::copy_file(good, bad, fs::copy_options::overwrite_existing);
    {
      std::fstream f(bad, std::ios::in | std::ios::out | std::ios::binary);
      // The first 256 KiB hold the superblock, group descriptors, bitmaps,
      // inode tables and the first directories of this small filesystem.
      for (int k = 0; k < 64; ++k) {
        f.seekp(static_cast<std::streamoff>(rng() % (256 * 1024)));
        f.put(static_cast<char>(rng()));
      }
    }
    Options o;
    o.content = true;
    o.limits.child_cpu_seconds = 20;
    try {
      auto r = diff({good, "raw"}, {bad, "raw"}, dir_, o);
      EXPECT_TRUE(r["changes"].is_array());
      ++results;
    } catch (const Error& e) {
      EXPECT_TRUE(e.code() == Errc::unavailable) << e.what();
      ++errors;
    }
  }
  EXPECT_EQ(results + errors, kRounds);
  std::cout << "corrupt images: " << results << " diffed, " << errors << " refused\n";
}

}  // namespace
}  // namespace airlock::engine::fsdiff

#include "engine/storage/disk_chain.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/subprocess.h"

namespace airlock::storage {
namespace {
namespace fs = std::filesystem;

class DiskChainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("disk-chain-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "images");
    fs::create_directories(dir_ / "run");
    base_ = dir_ / "images" / "rootfs.ext4";
    std::ofstream(base_) << std::string(4096, 'x');
    layer_ = dir_ / "images" / "layer.qcow2";
    top_ = dir_ / "run" / "disk.qcow2";
    qemu_img({"create", "-q", "-f", "qcow2", "-F", "raw", "-b", base_.string(), layer_.string()});
    qemu_img({"create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", "../images/layer.qcow2",
              top_.string()});
  }
  void TearDown() override { fs::remove_all(dir_); }
  static void qemu_img(std::vector<std::string> args) {
    args.insert(args.begin(), "qemu-img");
    auto r = run_command(args);
    ASSERT_TRUE(r.ok()) << r.describe();
  }
  // The message of the refusal of `top_`'s chain.
  std::string refusal() {
    try {
      disk_chain(top_, {dir_ / "images"}, "disk X");
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::unavailable);
      return e.what();
    }
    return "";
  }
  fs::path dir_, base_, layer_, top_;
};

TEST_F(DiskChainTest, FollowsRelativeAndAbsoluteNamesWithFormats) {
  auto chain = disk_chain(top_, {dir_ / "images"}, "disk X");
  ASSERT_EQ(chain.size(), 3u);
  EXPECT_EQ(chain[0].path, top_);
  EXPECT_EQ(chain[1].path, layer_);
  EXPECT_EQ(chain[1].format, "qcow2");
  EXPECT_EQ(chain[2].path, base_);
  EXPECT_EQ(chain[2].format, "raw");
  EXPECT_EQ(chain[0].virtual_size, 4096u);
}

TEST_F(DiskChainTest, RefusesAHeaderRewrittenToAHostFile) {
  qemu_img({"rebase", "-u", "-f", "qcow2", "-F", "raw", "-b", "/etc/shadow", layer_.string()});
  std::string m = refusal();
  EXPECT_NE(m.find("disk X"), std::string::npos) << m;
  EXPECT_NE(m.find("/etc/shadow"), std::string::npos) << m;
  EXPECT_NE(m.find("outside airlock's own directories"), std::string::npos) << m;
}

TEST_F(DiskChainTest, RefusesDotDotAndSymlinksLeadingOut) {
  qemu_img({"rebase", "-u", "-f", "qcow2", "-F", "raw", "-b", "../../../../../etc/passwd",
            layer_.string()});
  EXPECT_NE(refusal().find("outside"), std::string::npos);
  fs::create_symlink("/etc/passwd", dir_ / "images" / "link");
  qemu_img({"rebase", "-u", "-f", "qcow2", "-F", "raw", "-b", "link", layer_.string()});
  EXPECT_NE(refusal().find("/etc/passwd"), std::string::npos) << refusal();
  fs::create_symlink("rootfs.ext4", dir_ / "images" / "inner");
  qemu_img({"rebase", "-u", "-f", "qcow2", "-F", "raw", "-b", "inner", layer_.string()});
  EXPECT_NE(refusal().find("not a regular file"), std::string::npos) << refusal();
}

TEST_F(DiskChainTest, RefusesLoopsProtocolsAndOtherFormats) {
  qemu_img({"rebase", "-u", "-f", "qcow2", "-F", "qcow2", "-b", layer_.string(), layer_.string()});
  EXPECT_NE(refusal().find("loops"), std::string::npos) << refusal();
  qemu_img({"rebase", "-u", "-f", "qcow2", "-F", "raw", "-b", "nbd:127.0.0.1:1", layer_.string()});
  EXPECT_NE(refusal().find("not a plain file name"), std::string::npos) << refusal();
  qemu_img({"rebase", "-u", "-f", "qcow2", "-F", "vmdk", "-b", base_.string(), layer_.string()});
  EXPECT_NE(refusal().find("format 'vmdk'"), std::string::npos) << refusal();
}

TEST_F(DiskChainTest, ImageOptsNameEveryLinkAndEndTheChain) {
  auto chain = disk_chain(top_, {dir_ / "images"}, "disk X");
  std::string o = image_opts(chain, true);
  ASSERT_EQ(o.rfind("json:", 0), 0u);
  auto j = nlohmann::json::parse(o.substr(5));
  EXPECT_EQ(j["file"]["filename"], top_.string());
  EXPECT_EQ(j["force-share"], true);
  EXPECT_EQ(j["backing"]["file"]["filename"], layer_.string());
  EXPECT_EQ(j["backing"]["backing"]["driver"], "raw");
  EXPECT_FALSE(j["backing"]["backing"].contains("backing"));
  // qemu-img opens exactly these files, whatever a header says afterwards
  // (a backing name that does not exist would fail the convert).
  auto single = disk_chain(layer_, {dir_ / "images"}, "layer");
  qemu_img({"rebase", "-u", "-f", "qcow2", "-F", "raw", "-b", "/nonexistent", layer_.string()});
  std::vector<ChainLink> only_layer = {single[0]};
  only_layer[0].path = layer_;
  auto r = run_command(
      {"qemu-img", "convert", image_opts(only_layer), "-O", "raw", (dir_ / "out.raw").string()});
  EXPECT_TRUE(r.ok()) << r.describe();
}

}  // namespace
}  // namespace airlock::storage

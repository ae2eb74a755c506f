#include "engine/vmm/kernel_head.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/error.h"

namespace airlock::vmm {
namespace {

namespace fs = std::filesystem;

class KernelHead : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string t = (fs::temp_directory_path() / "airlock-khead-XXXXXX").string();
    ASSERT_NE(::mkdtemp(t.data()), nullptr);
    dir_ = t;
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path write(const std::string& name, const std::string& bytes) {
    std::ofstream(dir_ / name, std::ios::binary) << bytes;
    return dir_ / name;
  }
  // A synthetic bzImage: `sects` setup sectors after the boot sector, the
  // boot header's magic, then `payload` bytes of kernel.
  static std::string bzimage(uint8_t sects, size_t payload) {
    size_t setup = ((sects == 0 ? 4 : sects) + 1) * 512;
    std::string img(setup + payload, '\0');
    img[0x1f1] = static_cast<char>(sects);
    img.replace(0x202, 4, "HdrS");
    for (size_t i = setup; i < img.size(); ++i) img[i] = static_cast<char>('a' + i % 26);
    return img;
  }
  fs::path dir_;
};

TEST_F(KernelHead, KeepsTheSetupSectorsAndOnePageOfPayload) {
  std::string img = bzimage(30, 1 << 20);
  fs::path k = write("vmlinuz", img);
  std::string head = kernel_head(k);
  ASSERT_EQ(head.size(), 31 * 512 + kKernelHeadPayload);
  EXPECT_EQ(head, img.substr(0, head.size()));
  // setup_sects 0 means 4 (the boot protocol's oldest rule).
  EXPECT_EQ(kernel_head(write("old", bzimage(0, 10000))).size(), 5 * 512 + kKernelHeadPayload);
  // A payload shorter than a page is kept whole.
  EXPECT_EQ(kernel_head(write("small", bzimage(4, 100))).size(), 5 * 512 + 100u);
}

TEST_F(KernelHead, AnythingButABzImageIsPassedWhole) {
  EXPECT_EQ(kernel_head(write("elf",
                              "\x7f"
                              "ELF" +
                                  std::string(9000, '\0'))),
            "");
  EXPECT_EQ(kernel_head(write("short", "tiny")), "");
  EXPECT_EQ(kernel_head(dir_ / "missing"), "");
  // A header that claims more setup sectors than the file holds.
  std::string cut = bzimage(60, 0).substr(0, 4096);
  EXPECT_EQ(kernel_head(write("cut", cut)), "");
  EXPECT_EQ(write_kernel_head(dir_ / "elf", dir_ / "out"), fs::path());
  EXPECT_FALSE(fs::exists(dir_ / "out"));
}

TEST_F(KernelHead, WritesAfreshWithoutFollowingALink) {
  fs::path k = write("vmlinuz", bzimage(8, 50000));
  fs::path victim = write("victim", "keep");
  fs::create_symlink(victim, dir_ / "kernel.head");
  EXPECT_EQ(write_kernel_head(k, dir_ / "kernel.head"), dir_ / "kernel.head");
  EXPECT_FALSE(fs::is_symlink(dir_ / "kernel.head"));
  EXPECT_EQ(fs::file_size(dir_ / "kernel.head"), 9 * 512 + kKernelHeadPayload);
  std::ifstream in(victim);
  std::string kept((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(kept, "keep");
  // An unwritable destination is an error naming it.
  try {
    write_kernel_head(k, dir_ / "no-such-dir" / "kernel.head");
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-dir"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace airlock::vmm

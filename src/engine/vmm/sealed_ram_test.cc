#include "engine/vmm/sealed_ram.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include "common/error.h"

namespace airlock::vmm {
namespace {

namespace fs = std::filesystem;

TEST(SealedRam, CopyKeepsTheBytesAndNobodyCanChangeThem) {
  char tmpl[] = "/tmp/alsealXXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  fs::path dir = tmpl;
  fs::path file = dir / "tpl.ram";
  {
    // 3 MiB: a zero MiB (kept as a hole), then data, then a partial chunk.
    std::ofstream out(file, std::ios::binary);
    out << std::string(1 << 20, '\0') << std::string(1 << 20, 'A') << std::string(4096, 'B');
  }
  auto ram = SealedRam::copy_of(file);
  ASSERT_EQ(ram->size(), fs::file_size(file));
  EXPECT_TRUE(is_write_sealed(ram->fd()));
  char buf[4];
  ASSERT_EQ(::pread(ram->fd(), buf, 4, 1 << 20), 4);
  EXPECT_EQ(std::string(buf, 4), "AAAA");
  ASSERT_EQ(::pread(ram->fd(), buf, 4, 0), 4);
  EXPECT_EQ(std::string(buf, 4), std::string(4, '\0'));
  ASSERT_EQ(::pread(ram->fd(), buf, 4, (2 << 20) + 4092), 4);
  EXPECT_EQ(std::string(buf, 4), "BBBB");
  // No write, no truncation, no shared writable mapping ...
  EXPECT_EQ(::pwrite(ram->fd(), "x", 1, 0), -1);
  EXPECT_EQ(::ftruncate(ram->fd(), 0), -1);
  void* shared = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, ram->fd(), 0);
  EXPECT_EQ(shared, MAP_FAILED);
  // ... but a private copy-on-write one, as a clone's QEMU makes, works and
  // its writes stay its own.
  void* priv = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE, ram->fd(), 1 << 20);
  ASSERT_NE(priv, MAP_FAILED);
  std::memcpy(priv, "ZZZZ", 4);
  ::munmap(priv, 4096);
  ASSERT_EQ(::pread(ram->fd(), buf, 4, 1 << 20), 4);
  EXPECT_EQ(std::string(buf, 4), "AAAA");
  // Not our own pid's fd 4 unless it is such a memfd.
  EXPECT_FALSE(template_ram_sealed(::getpid(), 0));
  fs::remove_all(dir);
}

TEST(SealedRam, ALinkOrAMissingFileIsAnError) {
  char tmpl[] = "/tmp/alsealXXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  fs::path dir = tmpl;
  EXPECT_THROW(SealedRam::copy_of(dir / "none"), Error);
  std::ofstream(dir / "real") << "x";
  fs::create_symlink(dir / "real", dir / "link");
  EXPECT_THROW(SealedRam::copy_of(dir / "link"), Error);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace airlock::vmm

#include "engine/vmm/ram_split.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <string>

#include "common/error.h"

namespace airlock::vmm {
namespace {

// A migration stream built by hand, in QEMU 7.2's layout.
struct Stream {
  std::string s;
  void u8(uint8_t v) { s.push_back(static_cast<char>(v)); }
  void be32(uint32_t v) {
    for (int i = 3; i >= 0; --i) u8(static_cast<uint8_t>(v >> (8 * i)));
  }
  void be64(uint64_t v) {
    be32(static_cast<uint32_t>(v >> 32));
    be32(static_cast<uint32_t>(v));
  }
  void id(const std::string& n) {
    u8(static_cast<uint8_t>(n.size()));
    s += n;
  }
  void page(uint64_t addr, uint64_t flags, const std::string& block, char fill) {
    be64(addr | flags);
    if (!(flags & 0x20)) id(block);
    if (flags & 0x08)
      s += std::string(4096, fill);
    else
      u8(static_cast<uint8_t>(fill));
  }
};

int memfd_with(const std::string& data) {
  int fd = ::memfd_create("t", MFD_CLOEXEC);
  EXPECT_EQ(::write(fd, data.data(), data.size()), static_cast<ssize_t>(data.size()));
  ::lseek(fd, 0, SEEK_SET);
  return fd;
}

std::string read_all(int fd) {
  std::string out;
  ::lseek(fd, 0, SEEK_SET);
  char buf[65536];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  return out;
}

Stream header() {
  Stream st;
  st.be32(0x5145564d);
  st.be32(3);
  st.u8(0x07);
  st.be32(13);
  st.s += "pc-i440fx-7.2";
  return st;
}

TEST(RamSplit, MainBlockPagesGoToTheMemfdRomPagesAndDevicesStay) {
  Stream in = header();
  Stream want = header();
  // START: the block list, then EOS.
  for (Stream* st : {&in, &want}) {
    st->u8(0x01);
    st->be32(2);
    st->id("ram");
    st->be32(0);
    st->be32(4);
    st->be64((16 * 4096 + 4096) | 0x04);
    st->id("pc.ram");
    st->be64(16 * 4096);
    st->id("pc.bios");
    st->be64(4096);
    st->be64(0x10);
    st->u8(0x7e);
    st->be32(2);
  }
  // PART: RAM page 1 ('A'), a zero page, the ROM page (CONTINUE after a
  // RAM page in the input: must name its block in the output), RAM page 3
  // named, then page 1 written again as zero.
  in.u8(0x02);
  in.be32(2);
  in.page(4096, 0x08, "pc.ram", 'A');
  in.page(2 * 4096, 0x02 | 0x20, "", 0);
  in.page(0, 0x08, "pc.bios", 'R');
  in.page(3 * 4096, 0x08, "pc.ram", 'C');
  in.page(5 * 4096, 0x08, "pc.ram", 'D');
  in.page(5 * 4096, 0x02 | 0x20, "", 0);
  in.be64(0x10);
  in.u8(0x7e);
  in.be32(2);
  want.u8(0x02);
  want.be32(2);
  want.page(0, 0x08, "pc.bios", 'R');
  want.be64(0x10);
  want.u8(0x7e);
  want.be32(2);
  // END with nothing, then a device section and EOF, copied as they are.
  for (Stream* st : {&in, &want}) {
    st->u8(0x03);
    st->be32(2);
    st->be64(0x10);
    st->u8(0x7e);
    st->be32(2);
    st->u8(0x04);
    st->s += std::string("\0\0\0\3\3cpu\0\0\0\0\0\0\0\1devicebytes\x7e\0\0\0\3\0", 32);
  }
  int in_fd = memfd_with(in.s);
  int dev_fd = ::memfd_create("dev", MFD_CLOEXEC);
  auto r = split_migration_stream(in_fd, dev_fd, "pc.ram");
  EXPECT_EQ(read_all(dev_fd), want.s);
  EXPECT_EQ(r.device_bytes, want.s.size());
  EXPECT_EQ(r.pages, 3u);
  ASSERT_EQ(r.ram->size(), 16u * 4096);
  EXPECT_TRUE(is_write_sealed(r.ram->fd()));
  std::string ram = read_all(r.ram->fd());
  ASSERT_EQ(ram.size(), 16u * 4096);
  EXPECT_EQ(ram.substr(0, 4096), std::string(4096, '\0'));
  EXPECT_EQ(ram.substr(4096, 4096), std::string(4096, 'A'));
  EXPECT_EQ(ram.substr(3 * 4096, 4096), std::string(4096, 'C'));
  EXPECT_EQ(ram.substr(5 * 4096, 4096), std::string(4096, '\0'));  // zeroed again
  ::close(in_fd);
  ::close(dev_fd);
}

TEST(RamSplit, AnythingUnexpectedIsRefused) {
  auto split = [](const std::string& s) {
    int in_fd = memfd_with(s);
    int dev_fd = ::memfd_create("dev", MFD_CLOEXEC);
    try {
      split_migration_stream(in_fd, dev_fd, "pc.ram");
    } catch (...) {
      ::close(in_fd);
      ::close(dev_fd);
      throw;
    }
    ::close(in_fd);
    ::close(dev_fd);
  };
  EXPECT_THROW(split("not a stream"), Error);
  Stream st = header();
  EXPECT_THROW(split(st.s), Error);  // truncated
  st.u8(0x01);
  st.be32(1);
  st.id("block");  // another iterative section: not understood
  st.be32(0);
  st.be32(1);
  EXPECT_THROW(split(st.s), Error);
  Stream no_ram = header();
  no_ram.u8(0x00);  // EOF without the RAM block
  EXPECT_THROW(split(no_ram.s), Error);
}

}  // namespace
}  // namespace airlock::vmm

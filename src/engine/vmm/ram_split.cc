#include "engine/vmm/ram_split.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "common/error.h"

namespace airlock::vmm {

namespace {

// migration/savevm.c and migration/ram.c of QEMU 7.2.
constexpr uint32_t kMagic = 0x5145564d;  // "QEVM"
constexpr uint32_t kVersion = 3;
constexpr uint8_t kEof = 0x00, kStart = 0x01, kPart = 0x02, kEnd = 0x03, kFull = 0x04,
                  kSubsection = 0x05, kConfiguration = 0x07, kFooter = 0x7e;
constexpr uint64_t kZero = 0x02, kMemSize = 0x04, kPage = 0x08, kEos = 0x10, kContinue = 0x20;
constexpr uint64_t kPageSize = 4096, kFlagMask = kPageSize - 1;

[[noreturn]] void bad(const std::string& what) {
  throw Error(Errc::internal, "unexpected migration stream: " + what);
}

class Reader {
 public:
  Reader(int fd, const std::atomic<bool>* stop) : fd_(fd), stop_(stop), buf_(1 << 20) {}
  // Copies n bytes into `out` (nullptr: skips them).
  void get(void* out, size_t n) {
    auto* o = static_cast<char*>(out);
    while (n > 0) {
      if (pos_ == len_ && !fill()) bad("truncated");
      size_t k = std::min(n, len_ - pos_);
      if (o) {
        std::memcpy(o, buf_.data() + pos_, k);
        o += k;
      }
      pos_ += k;
      n -= k;
    }
  }
  uint8_t u8() {
    uint8_t v;
    get(&v, 1);
    return v;
  }
  uint32_t be32() {
    uint8_t b[4];
    get(b, 4);
    return uint32_t{b[0]} << 24 | uint32_t{b[1]} << 16 | uint32_t{b[2]} << 8 | b[3];
  }
  uint64_t be64() { return uint64_t{be32()} << 32 | be32(); }
  std::string str(size_t n) {
    std::string s(n, '\0');
    get(s.data(), n);
    return s;
  }
  // What is left of the buffer, then refilled, until EOF.
  template <class F>
  void rest(F&& sink) {
    for (;;) {
      if (pos_ < len_) sink(buf_.data() + pos_, len_ - pos_);
      pos_ = len_;
      if (!fill()) return;
    }
  }

 private:
  bool fill() {
    for (;;) {
      if (stop_) {
        pollfd p{fd_, POLLIN, 0};
        int r = ::poll(&p, 1, 100);
        if (r < 0 && errno != EINTR) throw_errno("poll migration stream");
        if (stop_->load()) bad("abandoned by its writer");
        if (r <= 0) continue;
      }
      ssize_t n = ::read(fd_, buf_.data(), buf_.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw_errno("read migration stream");
      pos_ = 0;
      len_ = static_cast<size_t>(n);
      return n > 0;
    }
  }
  int fd_;
  const std::atomic<bool>* stop_;
  std::vector<char> buf_;
  size_t pos_ = 0, len_ = 0;
};

class Writer {
 public:
  explicit Writer(int fd) : fd_(fd) { buf_.reserve(1 << 20); }
  ~Writer() = default;
  void put(const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    buf_.insert(buf_.end(), c, c + n);
    total_ += n;
    if (buf_.size() >= (1 << 20)) flush();
  }
  void u8(uint8_t v) { put(&v, 1); }
  void be32(uint32_t v) {
    uint8_t b[4] = {uint8_t(v >> 24), uint8_t(v >> 16), uint8_t(v >> 8), uint8_t(v)};
    put(b, 4);
  }
  void be64(uint64_t v) {
    be32(static_cast<uint32_t>(v >> 32));
    be32(static_cast<uint32_t>(v));
  }
  void flush() {
    size_t off = 0;
    while (off < buf_.size()) {
      ssize_t n = ::write(fd_, buf_.data() + off, buf_.size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw_errno("write device state");
      off += static_cast<size_t>(n);
    }
    buf_.clear();
  }
  uint64_t total() const { return total_; }

 private:
  int fd_;
  std::vector<char> buf_;
  uint64_t total_ = 0;
};

// The main RAM block being filled: a memfd written with pwrite, runs of
// consecutive pages coalesced (a mapping would fault on every page).
struct Ram {
  int fd = -1;
  uint64_t size = 0;
  std::vector<bool> touched;
  std::vector<char> run;
  uint64_t run_off = 0;
  ~Ram() {
    if (fd >= 0) ::close(fd);
  }
  void flush() {
    for (size_t done = 0; done < run.size();) {
      ssize_t n =
          ::pwrite(fd, run.data() + done, run.size() - done, static_cast<off_t>(run_off + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw_errno("write RAM memfd");
      done += static_cast<size_t>(n);
    }
    run.clear();
  }
  // Room for the page at `off` at the end of the run.
  char* page_at(uint64_t off) {
    if (!run.empty() && (off != run_off + run.size() || run.size() >= (4u << 20))) flush();
    if (run.empty()) run_off = off;
    run.resize(run.size() + kPageSize);
    return run.data() + run.size() - kPageSize;
  }
};

// One pass over the stream's sections: the main RAM block's pages go to
// `ram`, everything else is copied to `out` as read.
struct Splitter {
  Reader& in;
  Writer& out;
  Ram& ram;
  SplitStream& result;
  const std::string& block;
  std::string cur_in, last_out;  // block of the last page record read / written
  uint32_t ram_section = UINT32_MAX;

  // One section header and its records; false once device state begins.
  bool section() {
    uint8_t type = in.u8();
    switch (type) {
      case kConfiguration: {
        uint32_t len = in.be32();
        if (len > 256) bad("machine name length");
        std::string name = in.str(len);
        out.u8(type);
        out.be32(len);
        out.put(name.data(), len);
        return true;
      }
      case kStart: {
        uint32_t section = in.be32();
        std::string id = in.str(in.u8());
        uint32_t instance = in.be32(), version = in.be32();
        if (id != "ram") bad("iterative section " + id);
        ram_section = section;
        out.u8(type);
        out.be32(section);
        out.u8(static_cast<uint8_t>(id.size()));
        out.put(id.data(), id.size());
        out.be32(instance);
        out.be32(version);
        ram_records();
        footer(section);
        return true;
      }
      case kPart:
      case kEnd: {
        uint32_t section = in.be32();
        if (section != ram_section) bad("section " + std::to_string(section));
        out.u8(type);
        out.be32(section);
        ram_records();
        footer(section);
        return true;
      }
      case kFull:
      case kEof:
        // Device state from here on (vmstate, not self-delimiting): as is.
        out.u8(type);
        return false;
      case kSubsection:
      default:
        bad("section type " + std::to_string(type));
    }
  }

  // One "ram" section's records, up to its EOS.
  void ram_records() {
    for (;;) {
      uint64_t v = in.be64();
      uint64_t flags = v & kFlagMask, addr = v & ~kFlagMask;
      if (flags == kEos) {
        out.be64(v);
        return;
      }
      if (flags == kMemSize) {
        out.be64(v);
        block_list(addr);
        continue;
      }
      uint64_t kind = flags & ~kContinue;
      if (kind != kZero && kind != kPage) bad("page flags " + std::to_string(flags));
      if (!(flags & kContinue)) cur_in = in.str(in.u8());
      if (cur_in.empty()) bad("page record without a block");
      if (cur_in == block)
        ram_page(kind, addr);
      else
        rom_page(kind, addr);
    }
  }

  // The list of RAM blocks (`total` bytes in all), copied; the main block's
  // memfd is created at its size.
  void block_list(uint64_t total) {
    for (uint64_t left = total; left > 0;) {
      uint8_t len = in.u8();
      std::string id = in.str(len);
      uint64_t length = in.be64();
      out.u8(len);
      out.put(id.data(), len);
      out.be64(length);
      if (length > left) bad("RAM block list longer than its total");
      left -= length;
      if (id == block) {
        if (ram.fd >= 0) bad("RAM block " + id + " listed twice");
        if (length == 0 || length % kPageSize) bad("RAM block " + id + " size");
        ram.fd = ::memfd_create("airlock-fork-ram", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (ram.fd < 0) throw_errno("memfd_create");
        if (::ftruncate(ram.fd, static_cast<off_t>(length)) != 0) throw_errno("size RAM memfd");
        ram.size = length;
        ram.run.reserve((4u << 20) + kPageSize);
        ram.touched.assign(length / kPageSize, false);
      }
    }
  }

  // A page of the main block: into the memfd, not the stream.
  void ram_page(uint64_t kind, uint64_t addr) {
    if (ram.fd < 0) bad("page of " + block + " before its block list");
    if (addr + kPageSize > ram.size) bad("page outside RAM block " + block);
    size_t pg = addr / kPageSize;
    if (kind == kPage) {
      in.get(ram.page_at(addr), kPageSize);
      ram.touched[pg] = true;
      ++result.pages;
    } else {
      uint8_t ch = in.u8();
      if (ch != 0 || ram.touched[pg]) std::memset(ram.page_at(addr), ch, kPageSize);
      ram.touched[pg] = ch != 0;
    }
  }

  // A ROM's page: kept, its block named again if the last one written was
  // another (CONTINUE refers to the previous record *written*).
  void rom_page(uint64_t kind, uint64_t addr) {
    bool cont = cur_in == last_out;
    out.be64(addr | kind | (cont ? kContinue : 0));
    if (!cont) {
      out.u8(static_cast<uint8_t>(cur_in.size()));
      out.put(cur_in.data(), cur_in.size());
    }
    last_out = cur_in;
    if (kind == kPage) {
      char page[kPageSize];
      in.get(page, kPageSize);
      out.put(page, kPageSize);
    } else {
      out.u8(in.u8());
    }
  }

  void footer(uint32_t section) {
    if (in.u8() != kFooter || in.be32() != section) bad("section footer");
    out.u8(kFooter);
    out.be32(section);
  }
};

}  // namespace

SplitStream split_migration_stream(int in_fd, int dev_fd, const std::string& block,
                                   const std::atomic<bool>* stop) {
  Reader in(in_fd, stop);
  Writer out(dev_fd);
  Ram ram;
  SplitStream result;
  if (in.be32() != kMagic) bad("no QEVM magic");
  if (in.be32() != kVersion) bad("not version 3");
  out.be32(kMagic);
  out.be32(kVersion);
  Splitter split{in, out, ram, result, block};
  while (split.section()) {
  }
  if (ram.fd < 0) bad("no RAM block " + block);
  ram.flush();
  in.rest([&](const char* p, size_t n) { out.put(p, n); });
  out.flush();
  result.device_bytes = out.total();
  result.ram = SealedRam::seal(ram.fd, ram.size);  // takes the fd
  ram.fd = -1;
  return result;
}

}  // namespace airlock::vmm

// read_stdin_batch: what one request of the CLI's stdin pump carries.
#include "cli/stdin_pump.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace airlock::cli {
namespace {

struct Pipe {
  int fd[2];
  Pipe() { EXPECT_EQ(::pipe(fd), 0); }
  ~Pipe() {
    for (int f : fd)
      if (f >= 0) ::close(f);
  }
  void write(const std::string& s) {
    ASSERT_EQ(::write(fd[1], s.data(), s.size()), ssize_t(s.size()));
  }
  void close_writer() {
    ::close(fd[1]);
    fd[1] = -1;
  }
};

// A line is sent as soon as it is readable: no waiting for a full batch.
TEST(StdinBatch, ALineGoesAtOnce) {
  Pipe in, wake;
  in.write("print(1)\n");
  StdinBatch b;
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(read_stdin_batch(in.fd[0], wake.fd[0], 1 << 20, b));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(500));
  EXPECT_EQ(b.bytes, "print(1)\n");
  EXPECT_FALSE(b.eof);
}

// Bulk input is gathered up to the cap; what is left comes next time, and
// the end of input is reported with the last bytes.
TEST(StdinBatch, BulkIsCappedThenEofComesWithTheRest) {
  Pipe in, wake;
  std::thread writer([&] {
    in.write(std::string(100000, 'a'));
    in.close_writer();
  });
  StdinBatch b;
  std::string all;
  bool eof = false;
  while (!eof) {
    ASSERT_TRUE(read_stdin_batch(in.fd[0], wake.fd[0], 30000, b));
    EXPECT_LE(b.bytes.size(), 30000u);
    all += b.bytes;
    eof = b.eof;
  }
  writer.join();
  EXPECT_EQ(all, std::string(100000, 'a'));
}

TEST(StdinBatch, WakeStopsAWaitingRead) {
  Pipe in, wake;
  std::thread waker([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    wake.write("x");
  });
  StdinBatch b;
  EXPECT_FALSE(read_stdin_batch(in.fd[0], wake.fd[0], 1024, b));
  waker.join();
  EXPECT_TRUE(b.bytes.empty());
}

TEST(StdinBatch, EmptyInputIsJustEof) {
  Pipe in, wake;
  in.close_writer();
  StdinBatch b;
  ASSERT_TRUE(read_stdin_batch(in.fd[0], wake.fd[0], 1024, b));
  EXPECT_TRUE(b.eof);
  EXPECT_TRUE(b.bytes.empty());
}

}  // namespace
}  // namespace airlock::cli

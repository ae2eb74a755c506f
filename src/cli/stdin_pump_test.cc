// read_stdin_batch: what one request of the CLI's stdin pump carries.
#include "cli/stdin_pump.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

#include "common/error.h"

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

// airlockd dies while a batch is on its way: part of it reached the guest.
// Once the daemon answers again the pump asks how far the guest got and
// sends exactly the rest: every byte once, in order.
TEST(StdinResume, AFailedBatchIsResentFromWhereTheGuestGot) {
  Pipe wake;
  std::string guest = "abc";  // what earlier batches gave the process
  int down = 0;               // calls that still find no daemon
  std::vector<std::string> calls;
  StdinSend send = [&](std::string_view b, bool eof) -> nlohmann::json {
    calls.push_back(std::string(b) + (eof ? "<eof>" : ""));
    if (calls.size() == 1) {  // the daemon dies mid-request: 4 bytes got through
      guest += b.substr(0, 4);
      down = 2;
      throw Error(Errc::unavailable, "reading airlockd's answer failed");
    }
    if (down > 0 && down--) throw Error(Errc::unavailable, "cannot connect to airlockd");
    guest += b;
    return {{"stdin_total", guest.size()}};
  };
  StdinBatch batch{"0123456789", true};
  auto total = send_resuming(send, batch, 3, std::chrono::seconds(10), wake.fd[0]);
  ASSERT_TRUE(total);
  EXPECT_EQ(*total, 13u);
  EXPECT_EQ(guest, "abc0123456789");
  ASSERT_EQ(calls.size(), 5u);
  EXPECT_EQ(calls[3], "");  // the probe
  EXPECT_EQ(calls[4], "456789<eof>");
  // Without patience (AIRLOCK_REATTACH_SECONDS=0) the failure is final.
  calls.clear();
  EXPECT_THROW(send_resuming(send, batch, 13, std::chrono::milliseconds(0), wake.fd[0]), Error);
  // A total this client cannot account for is an error, not a guess.
  StdinSend other = [&](std::string_view b, bool) -> nlohmann::json {
    if (!b.empty()) throw Error(Errc::unavailable, "gone");
    return {{"stdin_total", 1000}};
  };
  try {
    send_resuming(other, batch, 13, std::chrono::seconds(10), wake.fd[0]);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::internal) << e.what();
  }
  // stop() while waiting: nullopt.
  StdinSend never = [](std::string_view, bool) -> nlohmann::json {
    throw Error(Errc::unavailable, "gone");
  };
  wake.write("x");
  EXPECT_FALSE(send_resuming(never, batch, 13, std::chrono::seconds(10), wake.fd[0]));
}

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

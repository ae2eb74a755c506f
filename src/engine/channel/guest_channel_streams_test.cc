// GuestChannel's streamed stdin and file watch against the real agent
// (airlock-guest --listen-fd N on this host), when it has been built.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <thread>

#include "common/error.h"
#include "engine/channel/real_agent_fixture.h"
#include "protocol/messages.h"

namespace airlock::channel {
namespace {

using protocol::Frame;
using protocol::Type;
using test_support::in;
using namespace std::chrono_literals;
using test_support::RealAgent;

#ifdef AIRLOCK_GUEST_BIN
TEST_F(RealAgent, StreamedStdinAnswersLineByLine) {
  uint32_t s = ch_->open_stream();
  std::mutex mu;
  std::condition_variable cv;
  std::string out;
  bool started = false;
  std::thread exec([&] {
    auto r = ch_->exec(s, {{"argv", {"sh"}}, {"stdin", true}}, nullptr,
                       {.on_start =
                            [&](int) {
                              std::lock_guard lock(mu);
                              started = true;
                              cv.notify_all();
                            },
                        .on_output =
                            [&](int c, std::string_view b) {
                              std::lock_guard lock(mu);
                              if (c == 1) out += b;
                              cv.notify_all();
                              return true;
                            }},
                       in(60s));
    EXPECT_EQ(r["exit_code"], 7);
    EXPECT_EQ(r["stdin_bytes"], 49);
  });
  auto send = [&](std::string text, bool eof) {
    bool given = false;
    return ch_->write_stdin(
        s,
        [&]() -> std::optional<std::string> {
          if (given) return std::nullopt;
          given = true;
          return text;
        },
        eof);
  };
  {
    // The stream is registered by exec(); a writer only knows of it after the start.
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 10s, [&] { return started; }));
  }
  for (int i = 1; i <= 3; ++i) {
    std::string want = "answer " + std::to_string(i) + "\n";
    EXPECT_EQ(send("echo answer " + std::to_string(i) + "\n", false), 14u);
    std::unique_lock lock(mu);
    EXPECT_TRUE(cv.wait_for(lock, 10s, [&] { return out.find(want) != std::string::npos; }))
        << "no answer to line " << i << "; output so far: " << out;
  }
  EXPECT_EQ(send("exit 7\n", true), 7u);
  exec.join();
  // The exec is over: its stdin is closed.
  EXPECT_THROW(send("late\n", false), Error);
}

// A process that does not read: write_stdin stops pulling from its source
// once the guest's window and the pipe are full (no buffering anywhere),
// and delivers everything once the process reads.
TEST_F(RealAgent, StreamedStdinBackpressureBoundsWhatIsPulled) {
  uint32_t s = ch_->open_stream();
  std::string out;
  std::atomic<bool> started{false};
  std::thread exec([&] {
    ch_->exec(s, {{"argv", {"sh", "-c", "sleep 1.5; wc -c"}}, {"stdin", true}}, nullptr,
              {.on_start = [&](int) { started = true; },
               .on_output =
                   [&](int, std::string_view b) {
                     out += b;
                     return true;
                   }},
              in(60s));
  });
  while (!started) std::this_thread::sleep_for(10ms);
  std::atomic<uint64_t> pulled{0};
  const uint64_t total = 16u << 20;
  std::thread writer([&] {
    ch_->write_stdin(
        s,
        [&]() -> std::optional<std::string> {
          if (pulled >= total) return std::nullopt;
          pulled += 64 * 1024;
          return std::string(64 * 1024, 'x');
        },
        true);
  });
  std::this_thread::sleep_for(800ms);
  // Window (256 KiB) + guest pipe (64 KiB) + one chunk in hand, with slack.
  EXPECT_LT(pulled.load(), 1u << 20) << "stdin was buffered, not back-pressured";
  writer.join();
  exec.join();
  EXPECT_EQ(out, std::to_string(total) + "\n");
}

// A write blocked on a process that does not read ends when its writer is
// cancelled (the daemon: the HTTP client hung up), not only when the exec does.
TEST_F(RealAgent, StreamedStdinBlockedWriteIsCancellable) {
  uint32_t s = ch_->open_stream();
  std::atomic<bool> started{false};
  std::thread exec([&] {
    ch_->exec(s, {{"argv", {"sleep", "3"}}, {"stdin", true}}, nullptr,
              {.on_start = [&](int) { started = true; }}, in(60s));
  });
  while (!started) std::this_thread::sleep_for(10ms);
  auto t0 = Clock::now();
  std::atomic<bool> cancel{false};
  std::thread canceller([&] {
    std::this_thread::sleep_for(500ms);
    cancel = true;
  });
  try {
    ch_->write_stdin(
        s, [] { return std::optional<std::string>(std::string(64 * 1024, 'x')); }, false,
        [&] { return cancel.load(); });
    ADD_FAILURE() << "an endless write to a process that does not read returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::unavailable) << e.what();
  }
  EXPECT_LT(Clock::now() - t0, 2500ms);  // before the exec ended
  canceller.join();
  exec.join();
}

// A background job with a stdin pipe, fed batch by batch by job_stdin
// streams; "close" ends it, after which a write is refused (exists ->
// conflict), as is one to a job started without a stdin.
TEST_F(RealAgent, BackgroundJobStdinBatchesThenClose) {
  std::string out = dir_ + "/job.out";
  ch_->call({{"op", "exec"},
             {"argv", {"sh", "-c", "cat > " + out}},
             {"background", true},
             {"stdin", true},
             {"exec_id", "bg-in"}},
            in(10s));
  auto once = [](std::string text) {
    auto given = std::make_shared<bool>(false);
    return [text, given]() -> std::optional<std::string> {
      if (*given) return std::nullopt;
      *given = true;
      return text;
    };
  };
  auto r = ch_->job_stdin("bg-in", once("first "), false, in(10s));
  EXPECT_EQ(r["stdin_bytes"], 6);
  EXPECT_EQ(r["stdin_closed"], false);
  std::string big(300000, 'b');  // beyond one credit window
  r = ch_->job_stdin("bg-in", once(big), true, in(30s));
  EXPECT_EQ(r["stdin_bytes"], big.size());
  EXPECT_EQ(r["stdin_total"], big.size() + 6);
  EXPECT_EQ(r["stdin_closed"], true);
  auto job = ch_->call({{"op", "wait_job"}, {"exec_id", "bg-in"}, {"timeout_ms", 10000}}, in(20s));
  EXPECT_EQ(job["running"], false);
  EXPECT_EQ(job["exit_code"], 0);
  std::ifstream f(out);
  std::string got((std::istreambuf_iterator<char>(f)), {});
  EXPECT_TRUE(got == "first " + big) << got.size();
  try {
    ch_->job_stdin("bg-in", once("late"), false, in(10s));
    ADD_FAILURE() << "a write after close was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::conflict) << e.what();
  }
  ch_->call({{"op", "exec"}, {"argv", {"sleep", "0"}}, {"background", true}, {"exec_id", "bg-no"}},
            in(10s));
  try {
    ch_->job_stdin("bg-no", once("x"), false, in(10s));
    ADD_FAILURE() << "a job without stdin took some";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::conflict) << e.what();
  }
  try {
    ch_->job_stdin("bg-nosuch", once("x"), false, in(10s));
    ADD_FAILURE() << "an unknown job took stdin";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::not_found) << e.what();
  }
}

TEST_F(RealAgent, WatchStreamsCheckedEventsAndStopsOnRequest) {
  std::vector<nlohmann::json> seen;
  nlohmann::json started;
  int idles = 0;
  auto r = ch_->watch(dir_, true,
                      {.on_start =
                           [&](const nlohmann::json& w) {
                             started = w;
                             std::filesystem::create_directories(dir_ + "/sub");
                           },
                       .on_event =
                           [&](const nlohmann::json& e) {
                             seen.push_back(e);
                             // The guest watches sub before it reports it, so
                             // the rename inside is seen as one (made earlier,
                             // it could be scanned as a plain `created g`).
                             if (seen.size() == 1) {
                               std::ofstream(dir_ + "/sub/f") << "x";
                               std::filesystem::rename(dir_ + "/sub/f", dir_ + "/sub/g");
                             }
                             return !(e["type"] == "renamed");
                           },
                       .on_idle = [&] { return ++idles < 40; },
                       .tick = 100ms},
                      in(10s));
  EXPECT_EQ(r["reason"], "cancelled") << r.dump();
  EXPECT_EQ(started["dirs"], 1);
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.front(),
            nlohmann::json({{"type", "created"}, {"path", dir_ + "/sub"}, {"is_dir", true}}));
  EXPECT_EQ(seen.back(), nlohmann::json({{"type", "renamed"},
                                         {"path", dir_ + "/sub/g"},
                                         {"is_dir", false},
                                         {"old_path", dir_ + "/sub/f"}}));
  // The guest released the watch; the channel goes on.
  auto info = ch_->call({{"op", "info"}}, in(10s));
  EXPECT_EQ(info["watch"]["watches"], 0) << info.dump();
  EXPECT_EQ(info["watch"]["watched_dirs"], 0) << info.dump();
}

TEST_F(RealAgent, WatchIdleTickStopsAndErrorsMapToErrc) {
  int idles = 0;
  auto r = ch_->watch(dir_, false, {.on_idle = [&] { return ++idles < 3; }, .tick = 50ms}, in(10s));
  EXPECT_EQ(r["reason"], "cancelled");
  EXPECT_EQ(idles, 3);
  try {
    ch_->watch(dir_ + "/missing", false, {}, in(10s));
    FAIL() << "watched a missing directory";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::not_found) << e.what();
  }
  std::ofstream(dir_ + "/file") << "x";
  try {
    ch_->watch(dir_ + "/file", false, {}, in(10s));
    FAIL() << "watched a file";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument) << e.what();
  }
  // The root going away ends the watch from the guest's side.
  std::filesystem::create_directories(dir_ + "/gone");
  r = ch_->watch(
      dir_ + "/gone", false,
      {.on_start = [&](const nlohmann::json&) { std::filesystem::remove(dir_ + "/gone"); }},
      in(10s));
  EXPECT_EQ(r["reason"], "path_deleted") << r.dump();
}

// GuestChannel::attach (§5 detach and attach): a named exec outlives its
// host's call (here: a new hello, what the agent sees of a restarted
// daemon; the old call, without a deadline, waits until the channel is
// closed at the end) and is resumed from an offset; a cancelled attach
// detaches it again; bad names and offsets are typed errors.
TEST_F(RealAgent, AttachResumesANamedExecFromAnOffset) {
  std::string go = dir_ + "/go";
  std::atomic<bool> first_out{false};
  std::thread old_host([&] {
    nlohmann::json req{{"argv",
                        {"sh", "-c",
                         "printf abc; sleep 0.2; printf de >&2; while [ ! -e " + go +
                             " ]; do sleep 0.05; done; printf fgh; exit 4"}},
                       {"exec_id", "ex-chan1"}};
    EXPECT_THROW(ch_->exec(ch_->open_stream(), req, nullptr,
                           {.on_output =
                                [&](int, std::string_view) {
                                  first_out = true;
                                  return true;
                                }}),
                 Error);
  });
  struct Joiner {
    GuestChannel& ch;
    std::thread& th;
    ~Joiner() {
      ch.close("test over");  // ends the old host's call
      th.join();
    }
  } joiner{*ch_, old_host};
  for (int i = 0; i < 600 && !first_out; ++i) std::this_thread::sleep_for(50ms);
  ASSERT_TRUE(first_out);
  ch_->hello({.hostname = "sb-test"}, in(10s));

  // From offset 1, detached again by `cancelled` once "de" arrived.
  std::string got;
  nlohmann::json attached;
  auto r = ch_->attach("ex-chan1", 1,
                       {.on_attached = [&](const nlohmann::json& a) { attached = a; },
                        .on_output =
                            [&](int c, std::string_view b) {
                              got += std::to_string(c) + std::string(b);
                              return true;
                            },
                        .cancelled = [&] { return got.find("2de") != std::string::npos; },
                        .tick = 50ms},
                       in(10s));
  EXPECT_EQ(r["detached"], true) << r.dump();
  EXPECT_EQ(r["offset"], 5);
  EXPECT_EQ(attached["offset"], 1);
  EXPECT_EQ(attached["dropped"], 0);
  EXPECT_EQ(attached["running"], true);
  EXPECT_EQ(got, "1bc2de");
  auto code = [&](const std::string& id, uint64_t off) {
    try {
      ch_->attach(id, off, {}, in(10s));
    } catch (const Error& e) {
      return e.code();
    }
    return Errc::internal;
  };
  EXPECT_EQ(code("ex-chan1", 6), Errc::invalid_argument);
  EXPECT_EQ(code("ex-none", 0), Errc::not_found);

  // From the end: the rest live, then the result; then it is forgotten.
  std::ofstream(go) << "";
  got.clear();
  r = ch_->attach("ex-chan1", 5,
                  {.on_output =
                       [&](int c, std::string_view b) {
                         got += std::to_string(c) + std::string(b);
                         return true;
                       }},
                  in(10s));
  EXPECT_EQ(got, "1fgh");
  EXPECT_EQ(r["exit_code"], 4) << r.dump();
  EXPECT_EQ(r["output_end"], 8);
  EXPECT_EQ(code("ex-chan1", 0), Errc::not_found);
}

#endif

}  // namespace
}  // namespace airlock::channel

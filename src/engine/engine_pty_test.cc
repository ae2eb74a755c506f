// Pty execs through the real engine, GuestChannel and airlock-guest (fake
// launcher, no QEMU): terminal input under the guest's credit, resize,
// signals, and what is refused.
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "engine/engine_fake_test_support.h"

namespace airlock::engine {
namespace {

using namespace std::chrono_literals;

class EnginePty : public testing::FakeVmTest {};

// One pty exec on its own thread; the test thread plays the terminal.
struct Terminal {
  Engine& engine;
  std::string id;
  std::mutex mu;
  std::condition_variable cv;
  std::string exec_id, out;
  bool done = false;
  ExecResult result;
  std::string error;
  std::thread thread;

  Terminal(Engine& e, std::string sid, ExecRequest req) : engine(e), id(std::move(sid)) {
    thread = std::thread([this, req] {
      ExecCallbacks cb;
      cb.on_start = [this](const std::string& x, int) {
        std::lock_guard lock(mu);
        exec_id = x;
        cv.notify_all();
      };
      cb.on_output = [this](int, std::string_view b) {
        std::lock_guard lock(mu);
        out += b;
        cv.notify_all();
        return true;
      };
      try {
        result = engine.exec(id, req, cb);
      } catch (const std::exception& e) {
        error = e.what();
      }
      std::lock_guard lock(mu);
      done = true;
      cv.notify_all();
    });
  }
  ~Terminal() { thread.join(); }
  bool wait_out(const std::string& s, std::chrono::seconds limit = 20s) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, limit, [&] { return out.find(s) != std::string::npos || done; }) &&
           out.find(s) != std::string::npos;
  }
  std::string started() {
    std::unique_lock lock(mu);
    cv.wait_for(lock, 20s, [&] { return !exec_id.empty() || done; });
    return exec_id;
  }
};

TEST_F(EnginePty, InputResizeAndAPasteBeyondTheCreditWindow) {
  Engine engine(cfg_);
  std::string sid = engine.create({.image = "minimal"}).id;
  ExecRequest req;
  req.argv = {
      "sh", "-c",
      "stty size; read l; echo got=$l; stty raw -echo; echo raw-now; head -c 1000000 > /dev/null; "
      "echo pasted; trap 'stty size; exit 4' WINCH; echo armed; "
      "while :; do sleep 0.05; done"};
  req.pty = ExecRequest::Pty{100, 30};
  Terminal t(engine, sid, req);
  std::string ex = t.started();
  ASSERT_FALSE(ex.empty()) << t.error;
  ASSERT_TRUE(t.wait_out("30 100")) << t.out;
  engine.pty_input(sid, ex, "hello\r");
  ASSERT_TRUE(t.wait_out("got=hello")) << t.out;
  // In canonical mode a line holds at most 4095 bytes: paste once raw.
  ASSERT_TRUE(t.wait_out("raw-now")) << t.out;
  // 1 MB, four times the guest's window: pty_input blocks for credit as the
  // program reads it, and nothing is lost.
  engine.pty_input(sid, ex, std::string(1000000, 'x'));
  ASSERT_TRUE(t.wait_out("armed")) << t.out.substr(0, 500);
  EXPECT_NE(t.out.find("pasted"), std::string::npos);
  engine.pty_resize(sid, ex, 90, 33);
  t.thread.join();
  t.thread = std::thread([] {});
  EXPECT_TRUE(t.error.empty()) << t.error;
  EXPECT_EQ(t.result.exit_code, 4);
  EXPECT_NE(t.out.find("33 90"), std::string::npos) << t.out;
  // The exec is over: its terminal is gone.
  EXPECT_THROW(engine.pty_input(sid, ex, "x"), Error);
  EXPECT_THROW(engine.pty_resize(sid, ex, 80, 24), Error);
  testing::destroy_wait(engine, sid);
}

TEST_F(EnginePty, SignalAndRefusals) {
  Engine engine(cfg_);
  std::string sid = engine.create({.image = "minimal"}).id;
  ExecRequest req;
  req.argv = {"sleep", "100"};
  req.pty = ExecRequest::Pty{80, 24};
  {
    Terminal t(engine, sid, req);
    std::string ex = t.started();
    ASSERT_FALSE(ex.empty()) << t.error;
    engine.kill_exec(sid, ex, 15);
    t.thread.join();
    t.thread = std::thread([] {});
    EXPECT_EQ(t.result.signal, 15);
    EXPECT_EQ(t.result.reason, "killed");
  }
  auto field = [&](ExecRequest r) {
    try {
      engine.exec(sid, r, {});
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_argument) << e.what();
      return e.field();
    }
    return std::string("<no error>");
  };
  ExecRequest bad = req;
  bad.pty->cols = 0;
  EXPECT_EQ(field(bad), "cols");
  bad = req;
  bad.pty->rows = 5000;
  EXPECT_EQ(field(bad), "rows");
  bad = req;
  bad.stdin_data = "x";
  EXPECT_EQ(field(bad), "stdin");
  EXPECT_THROW(engine.pty_resize(sid, "ex-nosuch", 80, 24), Error);
  try {
    engine.pty_resize(sid, "ex-nosuch", 0, 24);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "cols");
  }
  testing::destroy_wait(engine, sid);
}

}  // namespace
}  // namespace airlock::engine

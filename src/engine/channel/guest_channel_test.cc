// GuestChannel against (1) an in-test peer that speaks the real codec and
// behaves in scripted, sometimes hostile ways, and (2) the real airlock-guest
// binary in its host-test mode (--listen-fd), when it has been built.
#include "engine/channel/guest_channel.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <thread>

#include "common/error.h"
#include "engine/channel/real_agent_fixture.h"
#include "protocol/messages.h"

namespace airlock::channel {
namespace {

using protocol::Frame;
using protocol::Type;
using namespace std::chrono_literals;

using test_support::in;
#ifdef AIRLOCK_GUEST_BIN
using test_support::RealAgent;
#endif

// A scripted guest on the other end of a socketpair. Single-threaded event
// loop: read a frame, react, and push any output the credit windows allow.
class FakeGuest {
 public:
  explicit FakeGuest(int fd) : fd_(fd) {
    thread_ = std::thread([this] { run(); });
  }
  ~FakeGuest() {
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    ::close(fd_);
  }
  nlohmann::json hello_seen() {
    std::lock_guard l(mu_);
    return hello_;
  }
  size_t zeros_before_hello() { return zeros_; }
  uint64_t max_in_flight() { return max_in_flight_; }
  std::vector<int> signals() {
    std::lock_guard l(mu_);
    return signals_;
  }
  std::map<std::string, std::string> files;  // read_file content, by path

 private:
  struct Out {  // pending guest->host bytes of one stream
    std::string data[3];
    bool eof_after = false;
    nlohmann::json response;
    uint64_t window[3] = {protocol::kInitialCredit, protocol::kInitialCredit,
                          protocol::kInitialCredit};
    std::string stdin_buf;  // "cat": echo stdin back
    bool cat = false, hang = false;
  };

  void put(const Frame& f) {
    std::string w = protocol::encode(f);
    size_t off = 0;
    while (off < w.size()) {
      ssize_t n = ::send(fd_, w.data() + off, w.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return;
      off += n;
    }
  }

  void pump(uint32_t id, Out& o) {
    for (uint8_t ch : {1, 2}) {
      while (!o.data[ch].empty() && o.window[ch] > 0) {
        size_t n = std::min<size_t>({o.data[ch].size(), protocol::kMaxPayload, o.window[ch]});
        put(Frame{Type::data, ch, id, o.data[ch].substr(0, n)});
        o.data[ch].erase(0, n);
        o.window[ch] -= n;
        uint64_t inflight = protocol::kInitialCredit - o.window[ch];
        if (inflight > max_in_flight_) max_in_flight_ = inflight;
      }
    }
    if (o.eof_after && o.data[1].empty() && o.data[2].empty()) {
      put(Frame{Type::eof, 1, id, {}});
      put(Frame{Type::eof, 2, id, {}});
      put(protocol::json_frame(Type::response, id, o.response));
      streams_.erase(id);
    }
  }

  void request(uint32_t id, const nlohmann::json& r) {
    Out& o = streams_[id];
    std::string op = r.value("op", "");
    if (op == "exec") {
      std::string prog = r["argv"][0];
      put(protocol::json_frame(Type::event, id, {{"started", true}, {"pid", 42}}));
      nlohmann::json ok{{"exit_code", 0}, {"signal", nullptr}, {"timed_out", false}};
      if (prog == "echo") {
        o.data[1] = r["argv"][1].get<std::string>();
        o.data[2] = "err";
        o.response = ok;
        o.eof_after = true;
      } else if (prog == "flood") {
        o.data[1].assign(std::stoul(r["argv"][1].get<std::string>()), 'x');
        o.response = ok;
        o.eof_after = true;
      } else if (prog == "cat") {
        o.cat = true;
      } else if (prog == "hang") {
        o.hang = true;
      } else if (prog == "die") {
        ::shutdown(fd_, SHUT_RDWR);
      } else if (prog == "overrun") {  // ignores credit: hostile
        std::string big(protocol::kMaxPayload, 'y');
        for (int i = 0; i < 8; ++i) put(Frame{Type::data, 1, id, big});
        o.hang = true;
      } else {
        put(protocol::json_frame(Type::response, id,
                                 protocol::error_json("not_found", "exec " + prog + ": nope")));
        streams_.erase(id);
        return;
      }
      pump(id, o);
    } else if (op == "write_file") {
      o.cat = false;
      o.response = {{"path", r["path"]}};
    } else if (op == "read_file") {
      auto it = files.find(r["path"]);
      if (it == files.end()) {
        put(protocol::json_frame(Type::response, id,
                                 protocol::error_json("not_found", "open nope")));
        streams_.erase(id);
        return;
      }
      o.data[1] = it->second;
      o.response = {{"size", it->second.size()}};
      // read_file ends with eof on out only; pump() sends both, harmless
      o.eof_after = true;
      pump(id, o);
    } else if (op == "mkdir") {
      put(protocol::json_frame(Type::response, id,
                               protocol::error_json("exists", "mkdir /x: File exists")));
      streams_.erase(id);
    } else {
      put(protocol::json_frame(Type::response, id, {{"op", op}, {"echo", r}}));
      streams_.erase(id);
    }
  }

  void frame(Frame f) {
    if (f.type == Type::hello) {
      {
        std::lock_guard l(mu_);
        hello_ = protocol::parse_json(f);
      }
      put(protocol::json_frame(
          Type::hello, 0,
          {{"version", protocol::kVersion}, {"agent_version", "fake"}, {"kernel", "k"}}));
      return;
    }
    if (f.type == Type::request) return request(f.stream, protocol::parse_json(f));
    auto it = streams_.find(f.stream);
    if (it == streams_.end()) return;
    Out& o = it->second;
    switch (f.type) {
      case Type::credit:
        o.window[f.channel] += protocol::parse_credit(f);
        break;
      case Type::data:
        o.stdin_buf += f.payload;
        put(protocol::make_credit(f.stream, 0, f.payload.size()));
        if (o.cat) o.data[1] += f.payload;
        break;
      case Type::eof:
        if (o.cat) {
          o.response = {{"exit_code", 0}, {"signal", nullptr}, {"stdin_bytes", o.stdin_buf.size()}};
          o.eof_after = true;
        } else {  // write_file
          o.response["size"] = o.stdin_buf.size();
          put(protocol::json_frame(Type::response, f.stream, o.response));
          streams_.erase(it);
          return;
        }
        break;
      case Type::signal: {
        int sig = protocol::parse_json(f)["signal"];
        {
          std::lock_guard l(mu_);
          signals_.push_back(sig);
        }
        if (o.hang) {
          put(protocol::json_frame(Type::response, f.stream,
                                   {{"exit_code", nullptr}, {"signal", sig}}));
          streams_.erase(it);
          return;
        }
        break;
      }
      default:
        break;
    }
    pump(f.stream, o);
  }

  void run() {
    protocol::Decoder d;
    char buf[65536];
    bool seen_frame = false;
    for (;;) {
      ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) return;
      size_t off = 0;
      // Count the resync preamble (zero bytes) the way a real guest would
      // experience it, then decode the rest.
      while (!seen_frame && off < static_cast<size_t>(n) && buf[off] == 0) ++off, ++zeros_;
      seen_frame = seen_frame || off < static_cast<size_t>(n);
      try {
        d.feed(buf + off, n - off);
        while (auto f = d.next()) frame(std::move(*f));
      } catch (const Error&) {
        return;
      }
    }
  }

  int fd_;
  std::thread thread_;
  std::mutex mu_;
  nlohmann::json hello_;
  std::vector<int> signals_;
  std::atomic<size_t> zeros_{0};
  std::atomic<uint64_t> max_in_flight_{0};
  std::map<uint32_t, Out> streams_;
};

struct Pair {
  std::unique_ptr<GuestChannel> host;
  std::unique_ptr<FakeGuest> guest;
};

Pair make_pair_with_fake(std::map<std::string, std::string> files = {}) {
  int sv[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  Pair p;
  p.guest = std::make_unique<FakeGuest>(sv[1]);
  p.guest->files = std::move(files);
  p.host = GuestChannel::from_fd(sv[0]);
  return p;
}

ChunkSource from_string(std::string s, size_t chunk = 10000) {
  auto data = std::make_shared<std::string>(std::move(s));
  auto off = std::make_shared<size_t>(0);
  return [=]() -> std::optional<std::string> {
    if (*off >= data->size()) return std::nullopt;
    std::string c = data->substr(*off, chunk);
    *off += c.size();
    return c;
  };
}

TEST(GuestChannelFake, HelloSendsTimeHostnameAndEntropy) {
  auto p = make_pair_with_fake();
  auto reply = p.host->hello({.hostname = "sb-0123456789ab", .resync = true}, in(5s));
  EXPECT_EQ(reply["agent_version"], "fake");
  auto h = p.guest->hello_seen();
  EXPECT_EQ(h["version"], protocol::kVersion);
  EXPECT_EQ(h["hostname"], "sb-0123456789ab");
  EXPECT_EQ(h["entropy"].get<std::string>().size(), 128u);
  auto now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::system_clock::now().time_since_epoch())
                    .count();
  EXPECT_NEAR(static_cast<double>(h["time_ns"].get<int64_t>()), static_cast<double>(now_ns), 5e9);
  EXPECT_EQ(p.guest->zeros_before_hello(), protocol::kHeaderSize + protocol::kMaxPayload);
}

TEST(GuestChannelFake, ExecDeliversOutputOnCallerThread) {
  auto p = make_pair_with_fake();
  p.host->hello({}, in(5s));
  std::string out, err;
  int pid = 0;
  auto caller = std::this_thread::get_id();
  bool same_thread = true;
  auto r = p.host->exec(p.host->open_stream(), {{"argv", {"echo", "hello"}}}, nullptr,
                        {.on_start = [&](int p) { pid = p; },
                         .on_output =
                             [&](int ch, std::string_view b) {
                               same_thread &= std::this_thread::get_id() == caller;
                               (ch == 1 ? out : err) += b;
                               return true;
                             }});
  EXPECT_EQ(pid, 42);
  EXPECT_EQ(out, "hello");
  EXPECT_EQ(err, "err");
  EXPECT_TRUE(same_thread);
  EXPECT_EQ(r["exit_code"], 0);
}

TEST(GuestChannelFake, FloodIsBoundedByCreditAndFullyDelivered) {
  auto p = make_pair_with_fake();
  p.host->hello({}, in(5s));
  size_t total = 0;
  p.host->exec(p.host->open_stream(), {{"argv", {"flood", "5000000"}}}, nullptr,
               {.on_output =
                    [&](int, std::string_view b) {
                      total += b.size();
                      if (total < 1000000) std::this_thread::sleep_for(1ms);  // slow consumer
                      return true;
                    }},
               in(30s));
  EXPECT_EQ(total, 5000000u);
  EXPECT_LE(p.guest->max_in_flight(), protocol::kInitialCredit);
}

TEST(GuestChannelFake, StdinIsStreamedWithinCredit) {
  auto p = make_pair_with_fake();
  p.host->hello({}, in(5s));
  std::string input(3 * 1024 * 1024 + 17, '\0');
  for (size_t i = 0; i < input.size(); ++i) input[i] = static_cast<char>(i * 7);
  std::string out;
  auto r = p.host->exec(p.host->open_stream(), {{"argv", {"cat"}}}, from_string(input, 70000),
                        {.on_output =
                             [&](int, std::string_view b) {
                               out += b;
                               return true;
                             }},
                        in(30s));
  EXPECT_EQ(out, input);
  EXPECT_EQ(r["stdin_bytes"], input.size());
}

TEST(GuestChannelFake, ConsumerReturningFalseKillsAndDrains) {
  auto p = make_pair_with_fake();
  p.host->hello({}, in(5s));
  size_t calls = 0;
  auto r = p.host->exec(p.host->open_stream(), {{"argv", {"flood", "2000000"}}}, nullptr,
                        {.on_output =
                             [&](int, std::string_view) {
                               ++calls;
                               return false;
                             }},
                        in(30s));
  EXPECT_EQ(calls, 1u);
  EXPECT_EQ(p.guest->signals(), std::vector<int>{9});
  EXPECT_TRUE(r.contains("exit_code"));
}

TEST(GuestChannelFake, HostDeadlineKillsAndReportsTimedOut) {
  auto p = make_pair_with_fake();
  p.host->hello({}, in(5s));
  auto start = Clock::now();
  auto r = p.host->exec(p.host->open_stream(), {{"argv", {"hang"}}}, nullptr, {}, in(300ms));
  EXPECT_LT(Clock::now() - start, 5s);
  EXPECT_EQ(r["signal"], 9);
  EXPECT_EQ(r["timed_out"], true);
}

TEST(GuestChannelFake, SignalFromAnotherThread) {
  auto p = make_pair_with_fake();
  p.host->hello({}, in(5s));
  uint32_t s = p.host->open_stream();
  std::thread killer([&] {
    std::this_thread::sleep_for(200ms);
    p.host->signal(s, 15);
  });
  auto r = p.host->exec(s, {{"argv", {"hang"}}}, nullptr, {}, in(10s));
  killer.join();
  EXPECT_EQ(r["signal"], 15);
}

TEST(GuestChannelFake, GuestErrorsMapToErrc) {
  auto p = make_pair_with_fake();
  p.host->hello({}, in(5s));
  try {
    p.host->exec(p.host->open_stream(), {{"argv", {"nosuch"}}}, nullptr, {}, in(5s));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::not_found);
    EXPECT_NE(std::string(e.what()).find("exec nosuch"), std::string::npos);
  }
  try {
    p.host->call({{"op", "mkdir"}, {"path", "/x"}}, in(5s));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::conflict);
  }
}

TEST(GuestChannelFake, ConnectionLossFailsEveryWaiterPromptly) {
  auto p = make_pair_with_fake();
  p.host->hello({}, in(5s));
  std::atomic<int> failed{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < 3; ++i) {
    waiters.emplace_back([&] {
      try {
        p.host->exec(p.host->open_stream(), {{"argv", {"hang"}}}, nullptr, {});
      } catch (const Error& e) {
        if (e.code() == Errc::guest_error &&
            std::string(e.what()).find("connection lost") != std::string::npos)
          ++failed;
      }
    });
  }
  std::this_thread::sleep_for(200ms);
  auto start = Clock::now();
  EXPECT_THROW(p.host->exec(p.host->open_stream(), {{"argv", {"die"}}}, nullptr, {}), Error);
  for (auto& t : waiters) t.join();
  EXPECT_LT(Clock::now() - start, 2s);
  EXPECT_EQ(failed.load(), 3);
  EXPECT_TRUE(p.host->closed());
  // Later calls fail at once too.
  EXPECT_THROW(p.host->call({{"op", "ping"}}, in(5s)), Error);
}

TEST(GuestChannelFake, CreditOverrunFailsOnlyThatStream) {
  auto p = make_pair_with_fake();
  p.host->hello({}, in(5s));
  try {
    p.host->exec(p.host->open_stream(), {{"argv", {"overrun"}}}, nullptr,
                 {.on_output =
                      [](int, std::string_view) {
                        std::this_thread::sleep_for(50ms);
                        return true;
                      }},
                 in(10s));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::guest_error);
    EXPECT_NE(std::string(e.what()).find("credit"), std::string::npos) << e.what();
  }
  EXPECT_EQ(p.host->call({{"op", "ping"}}, in(5s))["op"], "ping");
}

TEST(GuestChannelFake, FilesRoundTrip) {
  std::string content(1 << 20, 'z');
  auto p = make_pair_with_fake({{"/data", content}});
  p.host->hello({}, in(5s));
  EXPECT_EQ(p.host->write_file("/w", 0644, true, from_string(std::string(700000, 'a')), in(10s)),
            700000u);
  std::string got;
  EXPECT_EQ(p.host->read_file(
                "/data",
                [&](std::string_view b) {
                  got += b;
                  return true;
                },
                in(10s)),
            content.size());
  EXPECT_EQ(got, content);
  try {
    p.host->read_file(
        "/missing", [](std::string_view) { return true; }, in(5s));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::not_found);
  }
}

TEST(GuestChannelFake, DeadlineOnSilentGuest) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  auto host = GuestChannel::from_fd(sv[0]);
  auto start = Clock::now();
  try {
    host->hello({}, in(200ms));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::timeout);
  }
  EXPECT_LT(Clock::now() - start, 2s);
  ::close(sv[1]);
}

TEST(GuestChannelFake, ConnectTimesOutOnMissingSocket) {
  auto start = Clock::now();
  try {
    GuestChannel::connect("/tmp/airlock-no-such-dir/agent.sock", in(300ms));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::timeout);
  }
  EXPECT_LT(Clock::now() - start, 2s);
}

// ---- Against the real agent (airlock-guest --listen-fd N on this host). ----

#ifdef AIRLOCK_GUEST_BIN
TEST_F(RealAgent, HelloAndExec) {
  EXPECT_EQ(hello_["version"], protocol::kVersion);
  EXPECT_TRUE(hello_.contains("agent_version"));
  std::string out, err;
  auto r = run({"sh", "-c", "printf hi; printf oops >&2; exit 3"}, &out, &err);
  EXPECT_EQ(out, "hi");
  EXPECT_EQ(err, "oops");
  EXPECT_EQ(r["exit_code"], 3);
}

// post() (the pool's clock at hand-out): nobody waits for the answer; an
// error answer is counted as ignored. The agent handles requests in order,
// so the answers are in before a later exec's.
TEST_F(RealAgent, PostedRequestsAreAnsweredInOrderAndDropped) {
  auto before = ch_->ignored_messages();
  ch_->post({{"op", "set_time"}, {"time_ns", 1}});  // host mode: this host's clock stays
  ch_->post({{"op", "set_time"}});                  // time_ns missing: refused
  EXPECT_EQ(run({"true"})["exit_code"], 0);
  EXPECT_EQ(ch_->ignored_messages(), before + 1);
  EXPECT_NE(ch_->last_ignored().find("time_ns"), std::string::npos) << ch_->last_ignored();
  EXPECT_GT(std::chrono::system_clock::now().time_since_epoch(), std::chrono::hours(24 * 365));
}

TEST_F(RealAgent, BinaryOutputAndStdinRoundTrip) {
  std::string input;
  for (int rep = 0; rep < 4096; ++rep)
    for (int b = 0; b < 256; ++b) input.push_back(static_cast<char>(b));  // 1 MiB
  std::string out;
  auto r = run({"cat"}, &out, nullptr, from_string(input, 100000));
  EXPECT_EQ(r["exit_code"], 0);
  EXPECT_EQ(out.size(), input.size());
  EXPECT_TRUE(out == input);
}

// Streamed stdin: the exec keeps stdin open while another thread feeds it;
// each line is answered before the next is sent (an interactive shell over
// a pipe), and eof ends it.
TEST_F(RealAgent, SlowConsumerFloodIsDeliveredCompletely) {
  size_t total = 0;
  auto r =
      ch_->exec(ch_->open_stream(), {{"argv", {"head", "-c", "4000000", "/dev/zero"}}}, nullptr,
                {.on_output =
                     [&](int, std::string_view b) {
                       total += b.size();
                       if (total < 600000) std::this_thread::sleep_for(2ms);
                       return true;
                     }},
                in(60s));
  EXPECT_EQ(total, 4000000u);
  EXPECT_EQ(r["exit_code"], 0);
}

TEST_F(RealAgent, ConsumerAbortKillsTheProcess) {
  auto start = Clock::now();
  auto r = ch_->exec(ch_->open_stream(), {{"argv", {"sh", "-c", "yes"}}}, nullptr,
                     {.on_output = [&](int, std::string_view) { return false; }}, in(30s));
  EXPECT_LT(Clock::now() - start, 10s);
  EXPECT_TRUE(r["exit_code"].is_null());
  EXPECT_EQ(r["signal"], 9);
}

TEST_F(RealAgent, GuestTimeoutAndHostSignal) {
  auto r = run({"sleep", "30"}, nullptr, nullptr, nullptr, {{"timeout_ms", 300}});
  EXPECT_EQ(r["timed_out"], true);
  uint32_t s = ch_->open_stream();
  std::thread killer([&] {
    std::this_thread::sleep_for(300ms);
    ch_->signal(s, 15);
  });
  r = ch_->exec(s, {{"argv", {"sleep", "30"}}}, nullptr, {}, in(30s));
  killer.join();
  EXPECT_EQ(r["signal"], 15);
}

TEST_F(RealAgent, ErrorsMapToErrc) {
  try {
    run({"/no/such/binary"});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::not_found) << e.what();
  }
  try {
    ch_->call({{"op", "stat"}, {"path", dir_ + "/missing"}}, in(10s));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::not_found) << e.what();
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos);
  }
  ch_->call({{"op", "mkdir"}, {"path", dir_ + "/d"}}, in(10s));
  try {
    ch_->call({{"op", "mkdir"}, {"path", dir_ + "/d"}}, in(10s));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::conflict) << e.what();
  }
}

TEST_F(RealAgent, FilesRoundTrip) {
  std::string blob(10 * 1024 * 1024 + 3, '\0');
  for (size_t i = 0; i < blob.size(); ++i) blob[i] = static_cast<char>((i * 131) >> 3);
  std::string path = dir_ + "/sub/blob.bin";
  auto t0 = Clock::now();
  EXPECT_EQ(ch_->write_file(path, 0600, true, from_string(blob, 1 << 20), in(60s)), blob.size());
  std::string back;
  EXPECT_EQ(ch_->read_file(
                path,
                [&](std::string_view b) {
                  back += b;
                  return true;
                },
                in(60s)),
            blob.size());
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
  std::cout << "20 MiB through the channel in " << ms << " ms\n";
  EXPECT_TRUE(back == blob);
  auto st = ch_->call({{"op", "stat"}, {"path", path}}, in(10s));
  EXPECT_EQ(st["size"], blob.size());
  EXPECT_EQ(st["mode"], 0600);
  auto ls = ch_->call({{"op", "list"}, {"path", dir_ + "/sub"}}, in(10s));
  ASSERT_EQ(ls["entries"].size(), 1u);
  EXPECT_EQ(ls["entries"][0]["name"], "blob.bin");
  ch_->call({{"op", "remove"}, {"path", dir_ + "/sub"}, {"recursive", true}}, in(10s));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/sub"));
  // An aborted download stops delivering and leaves the channel usable.
  size_t got = 0;
  std::string big = dir_ + "/big";
  ch_->write_file(big, 0644, false, from_string(std::string(3 << 20, 'q')), in(60s));
  ch_->read_file(
      big,
      [&](std::string_view b) {
        got += b.size();
        return false;
      },
      in(60s));
  EXPECT_LE(got, protocol::kMaxPayload);
  EXPECT_TRUE(ch_->call({{"op", "ping"}}, in(10s)).is_object());
}

TEST_F(RealAgent, UploadWhoseSourceFailsLeavesNothingInTheGuest) {
  // The caller's source breaks off after some data (a client's body that
  // ended early): the guest must drop its temp file, not keep it open.
  std::string dir = dir_ + "/up";
  std::filesystem::create_directory(dir);
  int calls = 0;
  auto source = [&]() -> std::optional<std::string> {
    if (++calls > 2) throw Error(Errc::invalid_argument, "the body ended inside a part");
    return std::string(64 * 1024, 'x');
  };
  EXPECT_THROW(ch_->write_file(dir + "/f", 0644, false, source, in(30s)), Error);
  // Frames are handled in order, so the abort is done before this answers.
  auto ls = ch_->call({{"op", "list"}, {"path", dir}}, in(10s));
  EXPECT_TRUE(ls["entries"].empty()) << ls.dump();
  EXPECT_TRUE(std::filesystem::is_empty(dir));
}

TEST_F(RealAgent, ConcurrentExecsAndAgentDeath) {
  std::vector<std::thread> ts;
  std::atomic<int> ok{0};
  for (int i = 0; i < 4; ++i) {
    ts.emplace_back([&, i] {
      std::string out;
      auto r = run({"sh", "-c", "echo " + std::to_string(i)}, &out);
      if (r["exit_code"] == 0 && out == std::to_string(i) + "\n") ++ok;
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(ok.load(), 4);

  std::atomic<bool> lost{false};
  std::thread waiter([&] {
    try {
      run({"sleep", "60"});
    } catch (const Error& e) {
      lost = std::string(e.what()).find("connection lost") != std::string::npos;
    }
  });
  std::this_thread::sleep_for(300ms);
  auto start = Clock::now();
  ::kill(pid_, SIGKILL);
  waiter.join();
  EXPECT_LT(Clock::now() - start, 3s);
  EXPECT_TRUE(lost.load());
}
#endif

}  // namespace
}  // namespace airlock::channel

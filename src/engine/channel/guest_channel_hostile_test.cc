// GuestChannel against a guest that forges: the test itself plays the guest
// over a socketpair, frame by frame, sending what the real agent never would
// (deeply nested JSON, repeated or ill-typed `started` events, frames for
// streams that are not open). The channel must fail only the call concerned,
// or drop and count the frame, and never throw anything but airlock::Error.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <future>

#include "common/error.h"
#include "engine/channel/guest_channel.h"
#include "protocol/messages.h"

namespace airlock::channel {
namespace {

using protocol::Frame;
using protocol::Type;
using namespace std::chrono_literals;

Deadline in(std::chrono::milliseconds d) { return Clock::now() + d; }

// The deepest [[[...]]] one frame can carry (64 KiB), inside an object.
std::string deepest_json() {
  size_t n = protocol::kMaxPayload / 2 - 4;
  return "{\"a\":" + std::string(n, '[') + std::string(n, ']') + "}";
}

class ForgingGuest {
 public:
  ForgingGuest() {
    int sv[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    host = GuestChannel::from_fd(sv[0]);
    fd_ = sv[1];
  }
  ~ForgingGuest() {
    host.reset();
    ::close(fd_);
  }

  void put(Type type, uint32_t stream, std::string payload, uint8_t channel = 0) {
    std::string w = protocol::encode(Frame{type, channel, stream, std::move(payload)});
    for (size_t off = 0; off < w.size();) {
      ssize_t n = ::send(fd_, w.data() + off, w.size() - off, MSG_NOSIGNAL);
      ASSERT_GT(n, 0);
      off += static_cast<size_t>(n);
    }
  }

  // The next frame from the host that is not credit (credit is what the
  // host returns for output; these tests never run out of it).
  Frame next() {
    for (;;) {
      if (auto f = dec_.next()) {
        if (f->type == Type::credit) continue;
        return *f;
      }
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 10000) <= 0) {
        ADD_FAILURE() << "the host sent nothing";
        return {};
      }
      char buf[65536];
      ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) {
        ADD_FAILURE() << "the host closed the connection";
        return {};
      }
      dec_.feed(buf, static_cast<size_t>(n));
    }
  }

  // Answers the host's hello with `reply` and returns what hello() did.
  nlohmann::json hello(const std::string& reply) {
    auto r = std::async(std::launch::async, [&] { return host->hello({}, in(10s)); });
    EXPECT_EQ(next().type, Type::hello);
    put(Type::hello, 0, reply);
    return r.get();
  }
  void hello() { hello(R"({"version":2,"agent_version":"forger"})"); }

  // A round trip on a fresh stream: once it is answered, every frame sent
  // before it has been through the host's reader.
  void sync() {
    auto r = std::async(std::launch::async, [&] { return host->call({{"op", "ping"}}, in(10s)); });
    Frame req = next();
    EXPECT_EQ(req.type, Type::request);
    put(Type::response, req.stream, R"({"pong":true})");
    EXPECT_EQ(r.get()["pong"], true);
  }

  std::unique_ptr<GuestChannel> host;

 private:
  int fd_ = -1;
  protocol::Decoder dec_;
};

// One exec driven by the forging guest: what the handlers saw.
struct ExecSeen {
  std::vector<int> starts;  // pid of every on_start call
  std::string out;
  bool output_before_start = false;
};

std::future<nlohmann::json> start_exec(ForgingGuest& g, uint32_t id, ExecSeen& seen) {
  return std::async(std::launch::async, [&g, id, &seen] {
    return g.host->exec(id, {{"argv", {"x"}}}, nullptr,
                        {.on_start = [&seen](int pid) { seen.starts.push_back(pid); },
                         .on_output =
                             [&seen](int, std::string_view b) {
                               if (seen.starts.empty()) seen.output_before_start = true;
                               seen.out += b;
                               return true;
                             }},
                        in(10s));
  });
}

TEST(GuestChannelHostile, DeeplyNestedHelloIsAProtocolError) {
  ForgingGuest g;
  for (const std::string& reply :
       {"{\"version\":" + std::string(40, '[') + "1" + std::string(40, ']') + "}", deepest_json(),
        std::string(protocol::kMaxPayload, '[')}) {
    try {
      g.hello(reply);
      FAIL() << "a hello nesting too deep was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::protocol_error) << e.what();
      EXPECT_NE(std::string(e.what()).find("nests deeper than 32 levels"), std::string::npos)
          << e.what();
    }
  }
  // The connection survives: a proper hello still works.
  EXPECT_EQ(g.hello(R"({"version":2,"agent_version":"ok"})")["agent_version"], "ok");
}

TEST(GuestChannelHostile, DeeplyNestedResponsesFailOnlyTheirCall) {
  ForgingGuest g;
  g.hello();
  // stat/list/jobs replies (call), an exec result, a write_file result.
  for (const std::string& payload :
       {deepest_json(), std::string(protocol::kMaxPayload, '['),
        R"({"jobs":[{"argv":)" + std::string(33, '[') + std::string(33, ']') + "}]}"}) {
    auto r = std::async(std::launch::async, [&] {
      return g.host->call({{"op", "jobs"}}, in(10s));
    });
    Frame req = g.next();
    g.put(Type::response, req.stream, payload);
    try {
      r.get();
      FAIL() << "a response nesting too deep was returned";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::guest_error);
      EXPECT_NE(std::string(e.what()).find("nests deeper"), std::string::npos) << e.what();
    }
  }
  {
    ExecSeen seen;
    auto r = start_exec(g, g.host->open_stream(), seen);
    Frame req = g.next();
    g.put(Type::event, req.stream, R"({"started":true,"pid":9})");
    g.put(Type::response, req.stream, deepest_json());
    EXPECT_THROW(r.get(), Error);
  }
  {
    auto r = std::async(std::launch::async, [&] {
      return g.host->write_file(
          "/f", 0644, false, [] { return std::nullopt; }, in(10s));
    });
    Frame req = g.next();
    EXPECT_EQ(g.next().type, Type::eof);
    g.put(Type::response, req.stream, deepest_json());
    EXPECT_THROW(r.get(), Error);
  }
  EXPECT_FALSE(g.host->closed());
  g.sync();
}

TEST(GuestChannelHostile, ForgedStartedEventsAreIgnoredAndCounted) {
  ForgingGuest g;
  g.hello();
  ASSERT_EQ(g.host->ignored_messages(), 0u);
  uint64_t ignored = 0;
  auto expect_ignored = [&](uint64_t more, const char* what) {
    ignored += more;
    EXPECT_EQ(g.host->ignored_messages(), ignored) << what << ": " << g.host->last_ignored();
  };

  // Ill-typed or malformed events before the real one: none starts anything.
  ExecSeen seen;
  auto r = start_exec(g, g.host->open_stream(), seen);
  uint32_t id = g.next().stream;
  for (const std::string& ev : std::vector<std::string>{
           R"({"started":"yes","pid":5})", R"({"started":1})", R"({"started":false})",
           R"({"started":true,"pid":"5"})", R"({"started":true,"pid":-1})",
           R"({"started":true,"pid":1e3})", R"({"started":true,"pid":99999999999})",
           R"({"progress":1})", "[true]", "not json", "{\"started\":" + std::string(40, '[')})
    g.put(Type::event, id, ev);
  g.put(Type::event, id, R"({"started":true,"pid":7})");
  // Repeated: a second and a third `started`.
  g.put(Type::event, id, R"({"started":true,"pid":8})");
  g.put(Type::data, id, "out", 1);
  g.put(Type::event, id, R"({"started":true,"pid":9})");
  // Wrong types in the result are the caller's to read, not a throw here.
  g.put(Type::response, id, R"({"exit_code":"zero","signal":[1],"timed_out":"yes"})");
  nlohmann::json res = r.get();
  EXPECT_EQ(res["exit_code"], "zero");
  EXPECT_EQ(seen.starts, std::vector<int>{7});
  EXPECT_EQ(seen.out, "out");
  expect_ignored(13, "forged events on an open exec");

  // `started` after the end of the exec (its response): the stream is closed.
  g.put(Type::event, id, R"({"started":true,"pid":10})");
  g.sync();
  EXPECT_EQ(seen.starts, std::vector<int>{7});
  expect_ignored(1, "started after the response");
  EXPECT_NE(g.host->last_ignored().find("not open"), std::string::npos) << g.host->last_ignored();

  // `started` after output: the daemon has already begun its response then.
  ExecSeen late;
  auto r2 = start_exec(g, g.host->open_stream(), late);
  uint32_t id2 = g.next().stream;
  g.put(Type::data, id2, "early", 2);
  g.put(Type::event, id2, R"({"started":true,"pid":11})");
  g.put(Type::response, id2, R"({"exit_code":0})");
  r2.get();
  EXPECT_TRUE(late.starts.empty());
  EXPECT_EQ(late.out, "early");
  expect_ignored(1, "started after output");
  EXPECT_FALSE(g.host->closed());
}

TEST(GuestChannelHostile, FramesForNoOpenStreamAreIgnoredAndCounted) {
  ForgingGuest g;
  g.hello();
  // Streams the host never opened, and stream 0 with other than hello.
  g.put(Type::response, 999, R"({"exit_code":0})");
  g.put(Type::data, 12345, "x", 1);
  g.put(Type::event, 77, R"({"started":true,"pid":1})");
  g.put(Type::response, 0, R"({"exit_code":0})");
  g.put(Type::event, 0, R"({"started":true})");
  // Unsolicited hellos beyond what a hello() could want.
  for (int i = 0; i < 10; ++i) g.put(Type::hello, 0, R"({"version":2})");
  g.sync();
  EXPECT_EQ(g.host->ignored_messages(), 5u + 2u) << g.host->last_ignored();

  // Events and data on a JSON-only stream (stat): dropped, the call answers.
  auto r = std::async(std::launch::async, [&] {
    return g.host->call({{"op", "stat"}, {"path", "/"}}, in(10s));
  });
  uint32_t id = g.next().stream;
  g.put(Type::event, id, R"({"started":true,"pid":3})");
  g.put(Type::data, id, "junk", 1);
  g.put(Type::response, id, R"({"type":"dir"})");
  EXPECT_EQ(r.get()["type"], "dir");
  EXPECT_EQ(g.host->ignored_messages(), 9u) << g.host->last_ignored();
  EXPECT_FALSE(g.host->closed());
}

// A forging guest's watch lines: only well-formed events reach the
// consumer, rebuilt from their known fields; lines split across frames are
// joined; an endless line fails the call instead of growing host memory.
TEST(GuestChannelHostile, WatchEventsAreCheckedAndRebuilt) {
  ForgingGuest g;
  g.hello();
  std::vector<nlohmann::json> seen;
  auto r = std::async(std::launch::async, [&] {
    return g.host->watch("/w", true,
                         {.on_event =
                              [&](const nlohmann::json& e) {
                                seen.push_back(e);
                                return true;
                              }},
                         in(10s));
  });
  Frame req = g.next();
  ASSERT_EQ(req.type, Type::request);
  EXPECT_EQ(protocol::parse_json(req)["op"], "watch");
  const uint32_t id = req.stream;
  g.put(Type::event, id, R"({"watching":true,"dirs":2})");
  std::string lines = R"({"type":"created","path":"/w/a","is_dir":false,"evil":"x"})"
                      "\n"
                      R"({"type":"created","path":"relative","is_dir":false})"
                      "\n"
                      R"({"type":"renamed","path":"/w/b","is_dir":false})"
                      "\n"
                      R"({"type":"explode","path":"/w/c","is_dir":false})"
                      "\n"
                      "not json\n"
                      R"({"type":"overflow","dropped":-1})"
                      "\n"
                      R"({"type":"overflow","dropped":7})"
                      "\n"
                      R"({"type":"renamed","path":"/w/d","old_path":"/w/c","is_dir":true})"
                      "\n"
                      R"({"type":"deleted","path":"/w/spl)";
  g.put(Type::data, id, lines, 1);
  g.put(Type::data, id, std::string(R"(it","is_dir":false})") + "\n", 1);
  g.put(Type::response, id, R"({"reason":"path_deleted","events":9,"dropped":7})");
  auto end = r.get();
  EXPECT_EQ(end["reason"], "path_deleted");
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(seen[0], nlohmann::json({{"type", "created"}, {"path", "/w/a"}, {"is_dir", false}}));
  EXPECT_EQ(seen[1], nlohmann::json({{"type", "overflow"}, {"dropped", 7}}));
  EXPECT_EQ(seen[2]["old_path"], "/w/c");
  EXPECT_EQ(seen[3]["path"], "/w/split");
  EXPECT_GE(g.host->ignored_messages(), 5u);

  // A line that never ends.
  auto r2 = std::async(std::launch::async, [&] { return g.host->watch("/w", false, {}, in(10s)); });
  req = g.next();
  g.put(Type::event, req.stream, R"({"watching":true})");
  std::string junk(60000, 'x');
  g.put(Type::data, req.stream, junk, 1);
  g.put(Type::data, req.stream, junk, 1);
  try {
    r2.get();
    FAIL() << "an endless watch line was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::guest_error);
    EXPECT_NE(std::string(e.what()).find("watch event line"), std::string::npos) << e.what();
  }
  g.sync();  // the connection is fine
}

}  // namespace
}  // namespace airlock::channel

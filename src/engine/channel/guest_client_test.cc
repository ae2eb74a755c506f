// The typed guest client against (1) the real airlock-guest in its host mode
// (every operation, requests as the agent understands them, replies decoded)
// and (2) a scripted peer that answers each request with a forged reply: an
// ill-typed or oversized field is either Error(guest_error) naming the op and
// the field, or taken as absent, as guest_client.h says per field.
#include "engine/channel/guest_client.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <functional>
#include <thread>

#include "common/error.h"
#include "engine/channel/real_agent_fixture.h"
#include "protocol/messages.h"

namespace airlock::channel {
namespace {

using nlohmann::json;
using protocol::Frame;
using protocol::Type;
using namespace std::chrono_literals;
using test_support::in;

// ---- the scripted peer -------------------------------------------------

// Plays the guest over a socketpair: every request frame is answered by
// `answer(request)` as its response (after `events(request)`, if set).
class ScriptedGuest {
 public:
  using Answer = std::function<json(const json& request)>;
  explicit ScriptedGuest(Answer answer, Answer events = nullptr)
      : answer_(std::move(answer)), events_(std::move(events)) {
    int sv[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    host = GuestChannel::from_fd(sv[0]);
    fd_ = sv[1];
    thread_ = std::thread([this] { run(); });
  }
  ~ScriptedGuest() {
    stop_ = true;
    host.reset();
    thread_.join();
    ::close(fd_);
  }
  json last_request() {
    std::lock_guard l(mu_);
    return last_;
  }
  std::unique_ptr<GuestChannel> host;

 private:
  void put(const Frame& f) {
    std::string w = protocol::encode(f);
    for (size_t off = 0; off < w.size();) {
      ssize_t n = ::send(fd_, w.data() + off, w.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return;
      off += static_cast<size_t>(n);
    }
  }
  void run() {
    protocol::Decoder dec;
    char buf[65536];
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) return;
      dec.feed(buf, static_cast<size_t>(n));
      while (auto f = dec.next()) {
        // Uploads (job_stdin) end with eof; answer then.
        if (f->type != Type::request && f->type != Type::eof) continue;
        if (f->type == Type::request) {
          json r = protocol::parse_json(*f);
          {
            std::lock_guard l(mu_);
            last_ = r;
          }
          if (r.value("op", "") == "job_stdin") continue;
          if (events_) put(protocol::json_frame(Type::event, f->stream, events_(r)));
          put(protocol::json_frame(Type::response, f->stream, answer_(r)));
        } else {
          put(protocol::json_frame(Type::response, f->stream, answer_(last_request())));
        }
      }
    }
  }
  Answer answer_, events_;
  int fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  json last_;
};

// The message of the GuestReplyError `f` throws ("" if none, "other
// error" if an Error of another type or code).
template <class F>
std::string guest_error(F f) {
  try {
    f();
  } catch (const GuestReplyError& e) {
    return e.code() == Errc::guest_error ? e.what() : "other code: " + std::string(e.what());
  } catch (const Error& e) {
    return "other error: " + std::string(e.what());
  }
  return "";
}

// ---- requests ------------------------------------------------------------

TEST(GuestClientRequest, ExecSendsOnlyWhatIsSet) {
  EXPECT_EQ(exec_request({.argv = {"true"}}), json({{"argv", {"true"}}}));
  ExecParams p{.argv = {"sh"},
               .env = {{"A", "1"}},
               .cwd = "/",
               .pty = PtySize{100, 30},
               .user = "u",
               .timeout_ms = 1500,
               .limit_pids = 5,
               .limit_memory_mb = 64,
               .limit_cpu_seconds = 0.5,
               .output_limit_bytes = 9,
               .exec_id = "ex-1",
               .output_buffer_bytes = 4096,
               .stdin_stream = true};
  EXPECT_EQ(exec_request(p), json::parse(R"({"argv":["sh"],"env":{"A":"1"},"cwd":"/",
      "pty":{"cols":100,"rows":30},"user":"u","timeout_ms":1500,
      "limits":{"pids":5,"memory_mb":64,"cpu_seconds":0.5},"output_limit_bytes":9,
      "exec_id":"ex-1","output_buffer_bytes":4096,"stdin":true})"));
}

TEST(GuestClientRequest, HelloNetworkNamesEveryAddress) {
  EXPECT_EQ(hello_network_json({.address = "10.0.2.15/24",
                                .gateway = "10.0.2.2",
                                .dns = "10.0.2.3",
                                .address6 = "fec0::15/64",
                                .gateway6 = "fec0::2",
                                .mac = "52:54:00:12:34:56"}),
            json::parse(R"({"address":"10.0.2.15/24","gateway":"10.0.2.2","dns":"10.0.2.3",
                "address6":"fec0::15/64","gateway6":"fec0::2","mac":"52:54:00:12:34:56"})"));
}

// ---- hostile replies, one decoder at a time --------------------------------

TEST(GuestClientHostile, ExecOutcomeTakesOnlyWellTypedFields) {
  ExecOutcome o = decode_outcome(json::parse(
      R"({"exit_code":"0","signal":1e3,"timed_out":"yes","reason":"pwned","duration_ms":-5,
          "stdout_dropped":-1,"stderr_dropped":7,"agent_us":1.5,"spawn_us":[1]})"));
  EXPECT_FALSE(o.exit_code);
  EXPECT_FALSE(o.signal);
  EXPECT_FALSE(o.timed_out);
  EXPECT_EQ(o.reason, "exited");  // not one of ours: derived
  EXPECT_EQ(o.duration_ms, 0);
  EXPECT_EQ(o.stdout_dropped, 0u);
  EXPECT_EQ(o.stderr_dropped, 7u);
  EXPECT_EQ(o.agent_us, 0u);
  // Every phase is there, 0 when the guest sent none.
  ASSERT_EQ(o.spawn_us.size(), std::size(kSpawnPhases));
  for (const auto& [k, v] : o.spawn_us) EXPECT_EQ(v, 0u) << k;
  o = decode_outcome(json::parse(R"({"spawn_us":{"clone":5,"exec":-1,"evil":9}})"));
  EXPECT_EQ(o.spawn_us.size(), std::size(kSpawnPhases));
  EXPECT_EQ(o.spawn_us["clone"], 5u);
  EXPECT_EQ(o.spawn_us["exec"], 0u);
  EXPECT_FALSE(o.spawn_us.count("evil"));
  // Out of an int's range: absent, never narrowed.
  o = decode_outcome({{"exit_code", int64_t{1} << 40}, {"signal", 9}, {"reason", "oom_killed"}});
  EXPECT_FALSE(o.exit_code);
  EXPECT_EQ(o.signal, 9);
  EXPECT_EQ(o.reason, "oom_killed");
  EXPECT_EQ(decode_outcome(json::array()).reason, "exited");
  EXPECT_EQ(decode_outcome({{"signal", 15}}).reason, "signaled");
  EXPECT_EQ(decode_outcome({{"timed_out", true}, {"signal", 9}}).reason, "timeout");
}

TEST(GuestClientHostile, JobsNeedAValidExecId) {
  for (json id : {json(nullptr), json(""), json(7), json(std::string(65, 'x'))}) {
    ScriptedGuest g([&](const json&) { return json{{"exec_id", id}, {"running", true}}; });
    EXPECT_EQ(guest_error([&] { wait_job(*g.host, "ex-1", 0, in(5s)); }),
              "guest job has no valid exec_id")
        << id.dump();
  }
  ScriptedGuest g([](const json&) {
    return json{{"exec_id", "ex-1"},
                {"argv", {"a", 1, "b"}},
                {"pid", "12"},
                {"running", "no"},
                {"exit_code", 3}};
  });
  Job j = wait_job(*g.host, "ex-1", 250, in(5s));
  EXPECT_EQ(g.last_request(), json({{"op", "wait_job"}, {"exec_id", "ex-1"}, {"timeout_ms", 250}}));
  EXPECT_EQ(j.argv, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(j.pid, 0);
  EXPECT_FALSE(j.running);  // only the value true is running
  EXPECT_EQ(j.outcome.exit_code, 3);
}

TEST(GuestClientHostile, BackgroundStartMustNameTheAskedExec) {
  ScriptedGuest g([](const json&) { return json{{"exec_id", "ex-other"}, {"running", true}}; });
  EXPECT_EQ(
      guest_error([&] { start_background(*g.host, {.argv = {"x"}, .exec_id = "ex-1"}, in(5s)); }),
      "guest started background exec ex-other, asked for ex-1");
  EXPECT_EQ(g.last_request()["background"], true);
  EXPECT_EQ(g.last_request()["op"], "exec");
}

TEST(GuestClientHostile, JobsIsAnArrayAndBounded) {
  {
    ScriptedGuest g([](const json&) { return json{{"jobs", "none"}}; });
    EXPECT_EQ(guest_error([&] { jobs(*g.host, in(5s)); }), "guest jobs response has no jobs array");
  }
  json many = json::array();
  for (size_t i = 0; i < kMaxJobs + 5; ++i) many.push_back({{"exec_id", "j" + std::to_string(i)}});
  many.push_back(7);  // not an object: skipped
  ScriptedGuest g([&](const json&) { return json{{"jobs", many}}; });
  EXPECT_EQ(jobs(*g.host, in(5s)).size(), kMaxJobs);
}

TEST(GuestClientHostile, KillJobCollectsOnlyOnExplicitFalses) {
  {
    ScriptedGuest g([](const json&) { return json{{"background", 0}, {"attached", false}}; });
    EXPECT_FALSE(kill_job(*g.host, "ex-1", 9, in(5s)).collect);
    EXPECT_EQ(g.last_request(), json({{"op", "kill_job"}, {"exec_id", "ex-1"}, {"signal", 9}}));
  }
  {
    ScriptedGuest g([](const json&) {
      return json{{"background", false}, {"attached", false}, {"end", 42}};
    });
    KillReply k = kill_job(*g.host, "ex-1", 15, in(5s));
    EXPECT_TRUE(k.collect);
    EXPECT_EQ(k.end, 42u);
  }
  ScriptedGuest g([](const json&) {
    return json{{"background", false}, {"attached", false}, {"end", "far"}};
  });
  EXPECT_EQ(guest_error([&] { kill_job(*g.host, "ex-1", 9, in(5s)); }),
            "guest kill_job reply: end is not a byte offset");
}

TEST(GuestClientHostile, JobStdinCountsAreUnsignedOrZero) {
  ScriptedGuest g([](const json&) {
    return json{{"stdin_bytes", -3}, {"stdin_total", 10}, {"stdin_closed", "true"}};
  });
  bool sent = false;
  JobStdinReply w = job_stdin(
      *g.host, "ex-1",
      [&]() -> std::optional<std::string> {
        if (sent) return std::nullopt;
        sent = true;
        return "abc";
      },
      false, in(5s));
  EXPECT_EQ(w.bytes, 0u);
  EXPECT_EQ(w.total, 10u);
  EXPECT_FALSE(w.closed);
}

TEST(GuestClientHostile, ListNeedsEntriesAndChecksEachOne) {
  {
    ScriptedGuest g([](const json&) { return json{{"entries", {{"a", 1}}}}; });
    EXPECT_EQ(guest_error([&] { list(*g.host, "/", 1, 0, in(5s)); }),
              "guest list response has no entries array");
  }
  {
    ScriptedGuest g([](const json&) {
      return json{{"entries",
                   {{{"name", "a"}, {"type", "file"}, {"size", -1}, {"mode", 420}, {"mtime", 1}}}}};
    });
    EXPECT_EQ(guest_error([&] { list(*g.host, "/", 1, 0, in(5s)); }),
              "guest file entry: size is out of range");
  }
  ScriptedGuest g([](const json&) {
    return json{{"entries",
                 {{{"name", "a"},
                   {"type", "file"},
                   {"size", 1},
                   {"mode", 420},
                   {"mtime", 1},
                   {"evil", 1}}}},
                {"truncated", "yes"}};
  });
  ListReply r = list(*g.host, "/x", 2, 7, in(5s));
  EXPECT_EQ(g.last_request(), json({{"op", "list"}, {"path", "/x"}, {"depth", 2}, {"offset", 7}}));
  ASSERT_EQ(r.entries.size(), 1u);
  EXPECT_FALSE(r.entries[0].contains("evil"));
  EXPECT_FALSE(r.truncated);
}

TEST(GuestClientHostile, StatAndMoveEntriesAreChecked) {
  ScriptedGuest g([](const json&) {
    return json{{"name", std::string(300, 'n')},
                {"type", "file"},
                {"size", 1},
                {"mode", 420},
                {"mtime", 1}};
  });
  EXPECT_EQ(guest_error([&] { stat(*g.host, "/a", in(5s)); }),
            "guest file entry: name is too long");
  EXPECT_EQ(guest_error([&] { move(*g.host, "/a", "/b", true, "u", in(5s)); }),
            "guest file entry: name is too long");
  EXPECT_EQ(
      g.last_request(),
      json({{"op", "move"}, {"path", "/a"}, {"dest", "/b"}, {"parents", true}, {"owner", "u"}}));
}

TEST(GuestClientHostile, UserHomeIsAbsoluteAndBounded) {
  for (json home : {json(7), json(""), json("rel/dir"), json("/" + std::string(4096, 'h')),
                    json(std::string("/a\0b", 4))}) {
    ScriptedGuest g([&](const json&) { return json{{"home", home}}; });
    EXPECT_EQ(guest_error([&] { user_home(*g.host, "alice", in(5s)); }),
              "the guest named no usable home directory for alice");
  }
  ScriptedGuest g([](const json&) { return json{{"home", "/home/alice"}}; });
  EXPECT_EQ(user_home(*g.host, "", in(5s)), "/home/alice");
  EXPECT_EQ(g.last_request(), json({{"op", "user"}}));
}

TEST(GuestClientHostile, AttachedEventAndEndAreDecoded) {
  ScriptedGuest g(
      [](const json&) {
        return json{{"exit_code", 2}, {"output_end", "9"}, {"stdout_bytes", 5}};
      },
      [](const json&) {
        return json{{"attached", true}, {"offset", 3}, {"end", 1}};
      });
  Attached seen;
  AttachReply r =
      attach(*g.host, "ex-1", 3, {.on_attached = [&](const Attached& a) { seen = a; }}, in(5s));
  EXPECT_EQ(g.last_request(), json({{"op", "attach"}, {"exec_id", "ex-1"}, {"offset", 3}}));
  EXPECT_EQ(seen.offset, 3u);
  EXPECT_EQ(seen.end, 3u);  // an end before the offset is the offset
  EXPECT_FALSE(r.detached);
  EXPECT_EQ(r.outcome.exit_code, 2);
  EXPECT_EQ(r.outcome.output_end, 0u);
  EXPECT_EQ(r.outcome.stdout_bytes, 5u);
}

TEST(GuestClientHostile, OpsWithoutAReplyIgnoreItsFields) {
  ScriptedGuest g([](const json& r) { return json{{"op", r["op"]}, {"anything", {1, 2}}}; });
  EXPECT_NO_THROW(ping(*g.host, in(5s)));
  EXPECT_NO_THROW(sync(*g.host, in(5s)));
  EXPECT_EQ(g.last_request(), json({{"op", "sync"}}));
  EXPECT_NO_THROW(mkdir(*g.host, "/d", false, "", in(5s)));
  EXPECT_EQ(g.last_request(), json({{"op", "mkdir"}, {"path", "/d"}, {"parents", false}}));
  EXPECT_NO_THROW(remove(*g.host, "/d", true, in(5s)));
  EXPECT_EQ(g.last_request(), json({{"op", "remove"}, {"path", "/d"}, {"recursive", true}}));
  EXPECT_EQ(info(*g.host, in(5s))["op"], "info");  // passed on as the API documents
}

// A failed operation is a plain Error with the guest's code, never a
// GuestReplyError (callers map the two differently).
TEST(GuestClientHostile, GuestErrorsKeepTheirCode) {
  ScriptedGuest g([](const json&) { return protocol::error_json("not_found", "no such job"); });
  try {
    wait_job(*g.host, "ex-1", 0, in(5s));
    FAIL();
  } catch (const GuestReplyError&) {
    FAIL() << "a guest error is not an unusable reply";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::not_found);
  }
}

// ---- the real agent ------------------------------------------------------

#ifdef AIRLOCK_GUEST_BIN
using test_support::RealAgent;

TEST_F(RealAgent, ClientRunsAForegroundExec) {
  std::string out;
  ExecOutcome o =
      run_exec(*ch_, ch_->open_stream(),
               {.argv = {"sh", "-c", "printf \"$A\"; exit 3"}, .env = {{"A", "hi"}}}, nullptr,
               {.on_output =
                    [&](int c, std::string_view b) {
                      if (c == 1) out += b;
                      return true;
                    }},
               in(30s));
  EXPECT_EQ(out, "hi");
  EXPECT_EQ(o.exit_code, 3);
  EXPECT_FALSE(o.signal);
  EXPECT_EQ(o.reason, "exited");
  EXPECT_EQ(o.stdout_dropped, 0u);
  EXPECT_GT(o.agent_us, 0u);
  ExecOutcome cut =
      run_exec(*ch_, ch_->open_stream(),
               {.argv = {"sh", "-c", "printf 0123456789"}, .output_limit_bytes = 4}, nullptr,
               {.on_output = [](int, std::string_view) { return true; }}, in(30s));
  EXPECT_EQ(cut.stdout_dropped, 6u);
}

TEST_F(RealAgent, ClientDrivesBackgroundJobs) {
  Job j = start_background(
      *ch_, {.argv = {"sh", "-c", "read x; exit 5"}, .exec_id = "ex-bg", .stdin_stream = true},
      in(10s));
  EXPECT_EQ(j.exec_id, "ex-bg");
  EXPECT_TRUE(j.running);
  EXPECT_GT(j.pid, 0);
  EXPECT_EQ(j.argv, (std::vector<std::string>{"sh", "-c", "read x; exit 5"}));
  bool sent = false;
  JobStdinReply w = job_stdin(
      *ch_, "ex-bg",
      [&]() -> std::optional<std::string> {
        if (sent) return std::nullopt;
        sent = true;
        return "line\n";
      },
      true, in(10s));
  EXPECT_EQ(w.bytes, 5u);
  EXPECT_EQ(w.total, 5u);
  EXPECT_TRUE(w.closed);
  Job done = wait_job(*ch_, "ex-bg", 10000, in(20s));
  EXPECT_FALSE(done.running);
  EXPECT_EQ(done.outcome.exit_code, 5);
  auto all = jobs(*ch_, in(10s));
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].exec_id, "ex-bg");

  start_background(*ch_, {.argv = {"sleep", "100"}, .exec_id = "ex-sleep"}, in(10s));
  EXPECT_FALSE(kill_job(*ch_, "ex-sleep", 9, in(10s)).collect);  // a job: nothing to collect
  Job killed = wait_job(*ch_, "ex-sleep", 10000, in(20s));
  EXPECT_EQ(killed.outcome.signal, 9);
  EXPECT_EQ(killed.outcome.reason, "killed");
  try {
    wait_job(*ch_, "ex-none", 0, in(10s));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::not_found);
  }
}

TEST_F(RealAgent, ClientFileOps) {
  mkdir(*ch_, dir_ + "/a/b", true, "", in(10s));
  { std::ofstream(dir_ + "/a/b/f") << "xyz"; }
  ListReply l = list(*ch_, dir_ + "/a", 2, 0, in(10s));
  ASSERT_EQ(l.entries.size(), 2u);
  EXPECT_EQ(l.entries[0]["name"], "b");
  EXPECT_EQ(l.entries[1]["path"], dir_ + "/a/b/f");
  EXPECT_FALSE(l.truncated);
  EXPECT_EQ(list(*ch_, dir_ + "/a", 2, 1, in(10s)).entries.size(), 1u);  // offset passes over
  EXPECT_EQ(stat(*ch_, dir_ + "/a/b/f", in(10s))["size"], 3);
  json moved = move(*ch_, dir_ + "/a/b/f", dir_ + "/c/g", true, "", in(10s));
  EXPECT_EQ(moved["path"], dir_ + "/c/g");
  remove(*ch_, dir_ + "/a", true, in(10s));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/a"));
  try {
    stat(*ch_, dir_ + "/a", in(10s));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::not_found);
  }
  EXPECT_EQ(user_home(*ch_, "root", in(10s)), "/root");
}

TEST_F(RealAgent, ClientWatchEndsWithItsCounts) {
  int events = 0;
  WatchReply w = watch(*ch_, dir_, false,
                       {.on_start = [&](const json&) { std::ofstream(dir_ + "/new") << "x"; },
                        .on_event = [&](const json&) { return ++events < 1; },
                        .tick = 50ms},
                       in(10s));
  EXPECT_EQ(w.reason, "cancelled");
  EXPECT_GE(w.events, 1u);
  EXPECT_EQ(w.dropped, 0u);
}

TEST_F(RealAgent, ClientMachineOps) {
  EXPECT_NO_THROW(ping(*ch_, in(10s)));
  EXPECT_NO_THROW(sync(*ch_, in(30s)));
  EXPECT_TRUE(info(*ch_, in(10s)).contains("kernel"));
}

// A named exec outlives its host's call (a new hello) and is collected by
// an attach from its start: the outcome and the log's figures decoded.
TEST_F(RealAgent, ClientAttachDecodesTheEnd) {
  std::string go = dir_ + "/go";
  std::atomic<bool> first_out{false};
  std::thread old_host([&] {
    EXPECT_THROW(
        run_exec(*ch_, ch_->open_stream(),
                 {.argv = {"sh", "-c",
                           "printf abc; while [ ! -e " + go + " ]; do sleep 0.05; done; exit 4"},
                  .exec_id = "ex-att"},
                 nullptr,
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
      ch.close("test over");
      th.join();
    }
  } joiner{*ch_, old_host};
  for (int i = 0; i < 600 && !first_out; ++i) std::this_thread::sleep_for(50ms);
  ASSERT_TRUE(first_out);
  ch_->hello({.hostname = "sb-test"}, in(10s));
  Attached seen;
  std::string got;
  AttachReply r = attach(*ch_, "ex-att", 1,
                         {.on_attached =
                              [&](const Attached& a) {
                                seen = a;
                                std::ofstream(go) << "";
                              },
                          .on_output =
                              [&](int, std::string_view b) {
                                got += b;
                                return true;
                              }},
                         in(10s));
  EXPECT_EQ(seen.offset, 1u);
  EXPECT_EQ(seen.dropped, 0u);
  EXPECT_EQ(seen.end, 3u);
  EXPECT_EQ(got, "bc");
  EXPECT_FALSE(r.detached);
  EXPECT_EQ(r.outcome.exit_code, 4);
  EXPECT_EQ(r.outcome.output_end, 3u);
  EXPECT_EQ(r.outcome.stdout_bytes, 3u);
}
#endif

}  // namespace
}  // namespace airlock::channel

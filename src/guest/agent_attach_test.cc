// Detach and attach (api/guest-protocol.md §5, version 2) against the real
// airlock-guest binary: a foreground exec with an exec_id survives its host
// (here: a new hello, which is what the agent sees of a restarted daemon)
// and is resumed from an offset of its output log.
#include "guest/agent_test_support.h"

namespace airlock::guest {
namespace {

// Receives frames until `pred` holds (or 30 s pass).
template <typename Pred>
bool pump_until(Agent& a, Pred pred) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!pred() && std::chrono::steady_clock::now() < deadline)
    if (auto f = a.recv(200)) a.dispatch(*f);
  return pred();
}

std::string sh_wait_for(const fs::path& go) {
  return "while [ ! -e " + go.string() + " ]; do sleep 0.05; done";
}

TEST(AgentAttach, ExecSurvivesItsHostAndResumesFromAnOffset) {
  Agent a;
  a.hello();
  a.next_id_ = 100;  // below: streams the test numbers itself
  fs::path go = temp_dir() / "go-1";
  fs::remove(go);
  a.send_json(
      Type::request, 1,
      {{"op", "exec"},
       {"exec_id", "ex-t1"},
       {"argv",
        {"sh", "-c",
         "echo one; sleep 0.2; echo two >&2; " + sh_wait_for(go) + "; echo three; exit 4"}}});
  ASSERT_TRUE(pump_until(a, [&] { return a.streams_[1].err == "two\n"; }));
  EXPECT_EQ(a.streams_[1].out, "one\n");
  a.hello();  // a new host: the exec is detached, not killed

  // A second attach while one is attached: `exists`.
  a.send_json(Type::request, 10, {{"op", "attach"}, {"exec_id", "ex-t1"}, {"offset", 4}});
  ASSERT_TRUE(pump_until(a, [&] { return a.streams_[10].err == "two\n"; }));
  ASSERT_FALSE(a.streams_[10].events.empty());
  json ev = a.streams_[10].events[0];
  EXPECT_EQ(ev["attached"], true);
  EXPECT_EQ(ev["offset"], 4);
  EXPECT_EQ(ev["dropped"], 0);
  EXPECT_EQ(ev["end"], 8);
  EXPECT_EQ(ev["running"], true);
  EXPECT_EQ(a.streams_[10].out, "");  // "one\n" is before the offset
  EXPECT_EQ(a.call({{"op", "attach"}, {"exec_id", "ex-t1"}, {"offset", 0}})["error"]["code"],
            "exists");
  // Detach by signal: the exec runs on; the answer says how far it got.
  a.send_json(Type::signal, 10, {{"detach", true}});
  a.wait(10);
  EXPECT_EQ(a.streams_[10].response["detached"], true);
  EXPECT_EQ(a.streams_[10].response["offset"], 8);
  // Beyond the end: invalid_argument. Unknown: not_found.
  EXPECT_EQ(a.call({{"op", "attach"}, {"exec_id", "ex-t1"}, {"offset", 9}})["error"]["code"],
            "invalid_argument");
  EXPECT_EQ(a.call({{"op", "attach"}, {"exec_id", "ex-nope"}})["error"]["code"], "not_found");

  // From 0: everything again, then the rest live, then the result.
  std::ofstream(go.string()) << "";
  a.send_json(Type::request, 20, {{"op", "attach"}, {"exec_id", "ex-t1"}, {"offset", 0}});
  StreamResult& r = a.wait(20);
  EXPECT_EQ(r.out, "one\nthree\n");
  EXPECT_EQ(r.err, "two\n");
  EXPECT_TRUE(r.eof[1] && r.eof[2]);
  EXPECT_EQ(r.response["exit_code"], 4);
  EXPECT_EQ(r.response["exec_id"], "ex-t1");
  EXPECT_EQ(r.response["output_end"], 14);
  EXPECT_EQ(r.response["output_lost"], 0);
  // Delivered: forgotten.
  EXPECT_EQ(a.call({{"op", "attach"}, {"exec_id", "ex-t1"}})["error"]["code"], "not_found");
  fs::remove(go);
}

TEST(AgentAttach, DetachedOutputBeyondTheBufferDropsTheOldestCounted) {
  Agent a;
  a.hello();
  a.next_id_ = 100;  // below: streams the test numbers itself
  fs::path go = temp_dir() / "go-2", done = temp_dir() / "done-2";
  fs::remove(go);
  fs::remove(done);
  a.send_json(
      Type::request, 1,
      {{"op", "exec"},
       {"exec_id", "ex-t2"},
       {"output_buffer_bytes", 65536},
       {"argv",
        {"sh", "-c", sh_wait_for(go) + "; yes x | head -c 200000; touch " + done.string()}}});
  ASSERT_TRUE(pump_until(a, [&] { return !a.streams_[1].events.empty(); }));  // started
  a.hello();  // detached before any output
  std::ofstream(go.string()) << "";
  ASSERT_TRUE(pump_until(a, [&] { return fs::exists(done); }));
  a.send_json(Type::request, 5, {{"op", "attach"}, {"exec_id", "ex-t2"}, {"offset", 0}});
  StreamResult& r = a.wait(5);
  ASSERT_FALSE(r.events.empty());
  // The agent may still be draining the last pipe-full when the attach
  // arrives: then the rest follows live.
  const uint64_t first = r.events[0]["offset"];
  EXPECT_GE(first, 200000u - 2 * 65536);
  EXPECT_EQ(r.events[0]["dropped"], first);
  EXPECT_EQ(r.events[0]["lost"], first);
  EXPECT_EQ(first + r.out.size(), 200000u);
  EXPECT_EQ(r.out.find_first_not_of("x\n"), std::string::npos);
  EXPECT_EQ(r.response["exit_code"], 0);
  EXPECT_EQ(r.response["output_lost"], first);
  EXPECT_EQ(r.response["stdout_bytes"], 200000);
  fs::remove(go);
  fs::remove(done);
}

// Sends `data` on channel 0 of `stream` (within the initial credit) without eof.
void send_stdin(Agent& a, uint32_t stream, const std::string& data) {
  Frame f;
  f.type = Type::data;
  f.stream = stream;
  f.payload = data;
  a.send(f);
  a.streams_[stream].in_credit -= data.size();
}

// A detached exec keeps its stdin: a new host feeds the rest by exec_id
// (job_stdin), and the process gets every byte once, in order.
TEST(AgentAttach, DetachedExecKeepsItsStdinForTheNextHost) {
  Agent a;
  a.hello();
  a.next_id_ = 100;
  a.send_json(Type::request, 1,
              {{"op", "exec"}, {"exec_id", "ex-in"}, {"stdin", true}, {"argv", {"cat"}}});
  send_stdin(a, 1, "one\n");
  ASSERT_TRUE(pump_until(a, [&] { return a.streams_[1].out == "one\n"; }));
  send_stdin(a, 1, "two\n");  // sent by the old host just before it went away
  a.hello();
  // While the exec stream of the old host is gone, job_stdin reaches it.
  a.send_json(Type::request, 5, {{"op", "job_stdin"}, {"exec_id", "ex-in"}});
  send_stdin(a, 5, "three\n");
  a.send_eof(5);
  StreamResult& w = a.wait(5);
  EXPECT_EQ(w.response["stdin_bytes"], 6);
  EXPECT_EQ(w.response["stdin_total"], 14);  // everything the process was given
  EXPECT_EQ(w.response["stdin_closed"], false);
  EXPECT_EQ(w.in_credit, protocol::kInitialCredit);  // all credited back
  // A second feeder runs after the first; close: the process reads eof.
  a.send_json(Type::request, 6, {{"op", "job_stdin"}, {"exec_id", "ex-in"}, {"close", true}});
  send_stdin(a, 6, "four\n");
  a.send_eof(6);
  EXPECT_EQ(a.wait(6).response["stdin_closed"], true);
  a.send_json(Type::request, 7, {{"op", "attach"}, {"exec_id", "ex-in"}, {"offset", 0}});
  StreamResult& r = a.wait(7);
  EXPECT_EQ(r.out, "one\ntwo\nthree\nfour\n");
  EXPECT_EQ(r.response["exit_code"], 0);
  EXPECT_EQ(r.response["stdin_bytes"], 19);
  // Closed, then gone: typed errors.
  EXPECT_EQ(a.call({{"op", "job_stdin"}, {"exec_id", "ex-in"}})["error"]["code"], "not_found");
}

TEST(AgentAttach, DetachedStdinIsClosedAfterItsLinger) {
  Agent a;
  a.hello();
  a.next_id_ = 100;
  a.send_json(Type::request, 1,
              {{"op", "exec"},
               {"exec_id", "ex-linger"},
               {"stdin", true},
               {"detached_stdin_ms", 300},
               {"argv", {"sh", "-c", "cat; echo eof"}}});
  ASSERT_TRUE(pump_until(a, [&] { return !a.streams_[1].events.empty(); }));
  int pid = a.streams_[1].events.at(0)["pid"];
  a.hello();
  // Nobody attaches or feeds it: after 300 ms cat reads eof and the exec ends.
  EXPECT_TRUE(pump_until(a, [&] { return ::kill(pid, 0) != 0; })) << "stdin was kept open";
  a.send_json(Type::request, 5, {{"op", "attach"}, {"exec_id", "ex-linger"}, {"offset", 0}});
  StreamResult& r = a.wait(5);
  EXPECT_EQ(r.out, "eof\n");
  EXPECT_EQ(r.response["exit_code"], 0);
  // An exec without streamed stdin cannot be fed.
  a.send_json(Type::request, 6,
              {{"op", "exec"}, {"exec_id", "ex-nostdin"}, {"argv", {"sleep", "30"}}});
  ASSERT_TRUE(pump_until(a, [&] { return !a.streams_[6].events.empty(); }));
  a.hello();
  EXPECT_EQ(a.call({{"op", "job_stdin"}, {"exec_id", "ex-nostdin"}})["error"]["code"], "exists");
  a.call({{"op", "kill_job"}, {"exec_id", "ex-nostdin"}});
}

// kill_job reaches a detached foreground exec by exec_id; its end (reason
// killed) waits for the next attach.
TEST(AgentAttach, KillJobSignalsADetachedExec) {
  Agent a;
  a.hello();
  a.next_id_ = 100;
  a.send_json(Type::request, 1,
              {{"op", "exec"}, {"exec_id", "ex-k"}, {"argv", {"sh", "-c", "echo up; sleep 30"}}});
  ASSERT_TRUE(pump_until(a, [&] { return a.streams_[1].out == "up\n"; }));
  int pid = a.streams_[1].events.at(0)["pid"];
  a.hello();
  json k = a.call({{"op", "kill_job"}, {"exec_id", "ex-k"}, {"signal", 9}});
  EXPECT_EQ(k["exec_id"], "ex-k");
  EXPECT_EQ(k["attached"], false);
  EXPECT_EQ(k["background"], false);
  EXPECT_EQ(k["end"], 3);
  EXPECT_TRUE(pump_until(a, [&] { return ::kill(pid, 0) != 0; }));
  a.send_json(Type::request, 5, {{"op", "attach"}, {"exec_id", "ex-k"}, {"offset", 3}});
  StreamResult& r = a.wait(5);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.response["reason"], "killed");
  EXPECT_EQ(r.response["signal"], 9);
  EXPECT_EQ(a.call({{"op", "kill_job"}, {"exec_id", "ex-k"}})["error"]["code"], "not_found");
}

// A pty exec with an exec_id is parked like a piped one: its terminal
// output goes to the log, and the attach stream types into it and resizes it.
TEST(AgentAttach, PtyExecSurvivesItsHostAndTakesInputOnTheAttachStream) {
  Agent a;
  a.hello();
  a.next_id_ = 100;
  a.send_json(Type::request, 1,
              {{"op", "exec"},
               {"exec_id", "ex-pty"},
               {"pty", {{"cols", 80}, {"rows", 24}}},
               {"argv",
                {"sh", "-c",
                 "echo ready; read line; echo got=$line; trap 'stty size; exit 6' WINCH; "
                 "echo armed; while :; do sleep 0.05; done"}}});
  ASSERT_TRUE(pump_until(a, [&] { return a.streams_[1].out.find("ready") != std::string::npos; }));
  const uint64_t seen = a.streams_[1].out.size();
  a.hello();  // detached, not killed
  a.send_json(Type::request, 5, {{"op", "attach"}, {"exec_id", "ex-pty"}, {"offset", seen}});
  send_stdin(a, 5, "hello\r");
  ASSERT_TRUE(pump_until(a, [&] { return a.streams_[5].out.find("armed") != std::string::npos; }))
      << a.streams_[5].out;
  EXPECT_NE(a.streams_[5].out.find("got=hello"), std::string::npos);
  EXPECT_EQ(a.streams_[5].in_credit, protocol::kInitialCredit);  // typed and credited
  a.send_json(Type::signal, 5, {{"resize", {{"cols", 111}, {"rows", 33}}}});
  StreamResult& r = a.wait(5);
  EXPECT_EQ(r.response["exit_code"], 6) << r.response.dump();
  EXPECT_NE(r.out.find("33 111"), std::string::npos) << r.out;
}

// Without an exec_id (a version 1 host) an exec still dies with its host.
TEST(AgentAttach, ExecWithoutAnIdIsAbortedByANewHello) {
  Agent a;
  a.hello();
  a.next_id_ = 100;  // below: streams the test numbers itself
  a.send_json(Type::request, 1, {{"op", "exec"}, {"argv", {"sh", "-c", "echo up; sleep 30"}}});
  ASSERT_TRUE(pump_until(a, [&] { return a.streams_[1].out == "up\n"; }));
  int pid = a.streams_[1].events.at(0)["pid"];
  a.hello();
  EXPECT_TRUE(pump_until(a, [&] { return ::kill(pid, 0) != 0; })) << "the exec outlived its host";
}

}  // namespace
}  // namespace airlock::guest

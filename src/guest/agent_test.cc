// Drives the real airlock-guest binary over a socketpair with the real
// protocol (api/guest-protocol.md), as the host engine would.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "guest/agent_test_support.h"
#include "protocol/frame.h"
#include "protocol/messages.h"

namespace airlock::guest {
namespace {

using nlohmann::json;
using protocol::Frame;
using protocol::Type;
namespace fs = std::filesystem;

TEST(Agent, Hello) {
  Agent a;
  json h = a.hello();
  EXPECT_EQ(h["version"], 1);
  EXPECT_EQ(h["agent_version"], "0.1.0");
  EXPECT_FALSE(h["kernel"].get<std::string>().empty());
  EXPECT_EQ(a.call({{"op", "ping"}}), json::object());
  // Version mismatch: an error, and the agent waits for a good hello.
  a.send_json(Type::hello, 0, {{"version", 99}});
  auto f = a.recv();
  ASSERT_TRUE(f);
  EXPECT_EQ(protocol::parse_json(*f)["error"]["code"], "unsupported_version");
  EXPECT_EQ(a.hello()["version"], 1);
  EXPECT_EQ(a.call({{"op", "ping"}}), json::object());
}

TEST(Agent, ExecAllByteValuesStdoutStderrApart) {
  Agent a;
  a.hello();
  auto& r = a.exec({{"argv",
                     {"sh", "-c",
                      "i=0; while [ $i -lt 256 ]; do printf \"\\\\$(printf %o $i)\"; "
                      "i=$((i+1)); done; echo oops >&2; exit 3"}}});
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  EXPECT_EQ(r.out, all);
  EXPECT_EQ(r.err, "oops\n");
  EXPECT_EQ(r.response["exit_code"], 3);
  EXPECT_TRUE(r.response["signal"].is_null());
  EXPECT_EQ(r.response["stdout_bytes"], 256);
  EXPECT_EQ(r.response["stderr_bytes"], 5);
  EXPECT_EQ(r.response["timed_out"], false);
  ASSERT_EQ(r.events.size(), 1u);
  EXPECT_EQ(r.events[0]["started"], true);
  EXPECT_TRUE(r.eof[1] && r.eof[2]);
}

TEST(Agent, ExecEnvCwdStdinSignal) {
  Agent a;
  a.hello();
  auto d = temp_dir();
  auto& r = a.exec({{"argv", {"sh", "-c", "echo $FOO; pwd; echo $PATH"}},
                    {"env", {{"FOO", "bar baz"}}},
                    {"cwd", d.string()}});
  EXPECT_EQ(r.out, "bar baz\n" + d.string() +
                       "\n/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n");
  std::string input(300000, 'q');
  input += "end";
  auto& s = a.exec({{"argv", {"sh", "-c", "wc -c; tail -c 3"}}}, &input);
  EXPECT_EQ(s.response["stdin_bytes"], input.size());
  EXPECT_NE(s.out.find("300003"), std::string::npos) << s.out;
  auto& k = a.exec({{"argv", {"sh", "-c", "kill -TERM $$"}}});
  EXPECT_TRUE(k.response["exit_code"].is_null());
  EXPECT_EQ(k.response["signal"], SIGTERM);
  // A signal frame from the host.
  uint32_t id = a.next_id_++;
  a.send_json(Type::request, id, {{"op", "exec"}, {"argv", {"sleep", "30"}}});
  while (a.streams_[id].events.empty()) {
    auto f = a.recv();
    ASSERT_TRUE(f);
    a.dispatch(*f);
  }
  a.send_json(Type::signal, id, {{"signal", 9}});
  EXPECT_EQ(a.wait(id).response["signal"], 9);
  fs::remove_all(d);
}

TEST(Agent, ExecFailuresNameTheProblem) {
  Agent a;
  a.hello();
  auto& r = a.exec({{"argv", {"/no/such/binary"}}});
  EXPECT_EQ(r.response["error"]["code"], "not_found");
  EXPECT_NE(r.response["error"]["message"].get<std::string>().find("/no/such/binary"),
            std::string::npos);
  EXPECT_TRUE(r.events.empty());
  auto& c = a.exec({{"argv", {"true"}}, {"cwd", "/no/such/dir"}});
  EXPECT_NE(c.response["error"]["message"].get<std::string>().find("cwd /no/such/dir"),
            std::string::npos);
  auto& u = a.exec({{"argv", {"true"}}, {"user", "no-such-user-xyz"}});
  EXPECT_EQ(u.response["error"]["code"], "not_found");
  auto& e = a.exec({{"argv", json::array()}});
  EXPECT_EQ(e.response["error"]["code"], "invalid_argument");
  auto& t = a.exec({{"argv", {"true"}}, {"timeout_ms", "soon"}});
  EXPECT_NE(t.response["error"]["message"].get<std::string>().find("timeout_ms"),
            std::string::npos);
  // Non-root user by uid.
  auto& n = a.exec({{"argv", {"id", "-u"}}, {"user", 65534}});
  EXPECT_EQ(n.out, "65534\n");
}

TEST(Agent, TimeoutKillsWholeTree) {
  std::string cg = test_cgroup_root();
  {
    Agent a(cg);
    a.hello();
    auto d = temp_dir();
    std::string marker = (d / "escaped").string();
    // A grandchild in its own session: only the cgroup reaches it.
    std::string script = cg.empty() ? "sleep 30 & sleep 30"
                                    : "setsid sh -c 'sleep 2; touch " + marker + "' & sleep 30";
    auto t0 = std::chrono::steady_clock::now();
    auto& r = a.exec({{"argv", {"sh", "-c", script}}, {"timeout_ms", 500}});
    auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    EXPECT_EQ(r.response["timed_out"], true);
    EXPECT_EQ(r.response["signal"], SIGKILL);
    EXPECT_LT(ms, 5000);
    if (!cg.empty()) {
      sleep(3);
      EXPECT_FALSE(fs::exists(marker)) << "setsid grandchild survived the timeout";
    }
    fs::remove_all(d);
  }
  if (!cg.empty()) {
    // The agent removed its exec cgroups.
    int left = 0;
    for (auto& e : fs::directory_iterator(cg))
      if (e.is_directory()) ++left;
    EXPECT_EQ(left, 0);
    rmdir(cg.c_str());
  }
}

TEST(Agent, ConcurrentExecs) {
  Agent a;
  a.hello();
  for (uint32_t id = 1; id <= 6; ++id)
    a.send_json(
        Type::request, id,
        {{"op", "exec"}, {"argv", {"sh", "-c", "sleep 0.3; echo stream" + std::to_string(id)}}});
  a.next_id_ = 7;
  auto t0 = std::chrono::steady_clock::now();
  for (uint32_t id = 1; id <= 6; ++id)
    EXPECT_EQ(a.wait(id).out, "stream" + std::to_string(id) + "\n");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1500));
}

TEST(Agent, OneMiBStdoutUnderCreditFlowControl) {
  Agent a;
  a.hello();
  a.hold_credit = true;
  uint32_t id = a.next_id_++;
  a.send_json(Type::request, id,
              {{"op", "exec"}, {"argv", {"head", "-c", "1048576", "/dev/zero"}}});
  // Without credit the guest stops at the initial window and the process blocks.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
  while (std::chrono::steady_clock::now() < deadline)
    if (auto f = a.recv(100)) a.dispatch(*f);
  EXPECT_EQ(a.streams_[id].out.size(), protocol::kInitialCredit);
  EXPECT_FALSE(a.streams_[id].done);
  // Grant credit for what we "consumed"; the rest flows.
  a.hold_credit = false;
  a.send(protocol::make_credit(id, 1, a.streams_[id].out.size()));
  auto& r = a.wait(id);
  EXPECT_EQ(r.out.size(), 1048576u);
  EXPECT_EQ(r.out, std::string(1048576, '\0'));
  EXPECT_EQ(r.response["exit_code"], 0);
}

// Output beyond output_limit_bytes is read and dropped without any credit:
// the process finishes although the host never granted more.
TEST(Agent, OutputCapDropsAndCountsWithoutCredit) {
  Agent a;
  a.hello();
  a.hold_credit = true;
  auto& r =
      a.exec({{"argv", {"sh", "-c", "head -c 3000000 /dev/zero; head -c 70000 /dev/zero >&2"}},
              {"output_limit_bytes", 100000}});
  EXPECT_EQ(r.response["exit_code"], 0);
  EXPECT_EQ(r.response["reason"], "exited");
  EXPECT_EQ(r.out.size(), 100000u);
  EXPECT_EQ(r.err.size(), 70000u);
  EXPECT_EQ(r.response["truncated"], true);
  EXPECT_EQ(r.response["stdout_bytes"], 3000000);
  EXPECT_EQ(r.response["stdout_dropped"], 2900000);
  EXPECT_EQ(r.response["stderr_bytes"], 70000);
  EXPECT_EQ(r.response["stderr_dropped"], 0);
  // Below the cap nothing is dropped.
  a.hold_credit = false;
  auto& ok = a.exec({{"argv", {"echo", "hi"}}, {"output_limit_bytes", 100000}});
  EXPECT_EQ(ok.response["truncated"], false);
  EXPECT_EQ(ok.response["stdout_dropped"], 0);
}

TEST(Agent, TypedReasons) {
  Agent a;
  a.hello();
  EXPECT_EQ(a.exec({{"argv", {"sh", "-c", "exit 4"}}}).response["reason"], "exited");
  EXPECT_EQ(a.exec({{"argv", {"sh", "-c", "kill -TERM $$"}}}).response["reason"], "signaled");
  auto& t = a.exec({{"argv", {"sleep", "30"}}, {"timeout_ms", 200}});
  EXPECT_EQ(t.response["reason"], "timeout");
  EXPECT_EQ(t.response["timed_out"], true);
  // A host signal frame: "killed".
  uint32_t id = a.next_id_++;
  a.send_json(Type::request, id, {{"op", "exec"}, {"argv", {"sleep", "30"}}});
  while (a.streams_[id].events.empty())
    if (auto f = a.recv(1000)) a.dispatch(*f);
  a.send_json(Type::signal, id, {{"signal", 9}});
  EXPECT_EQ(a.wait(id).response["reason"], "killed");
  // CPU time: RLIMIT_CPU at least (no cgroup here).
  auto& c = a.exec({{"argv", {"sh", "-c", "while :; do :; done"}},
                    {"limits", {{"cpu_seconds", 1}}},
                    {"timeout_ms", 20000}});
  EXPECT_EQ(c.response["reason"], "cpu_limit") << c.response.dump();
}

// A full disk does not hide why the agent ended an exec: a timeout is a
// timeout (it used to read no_space whenever the disk was full at the end).
TEST(Agent, TimeoutOnAFullDiskIsTimeout) {
  auto d = temp_dir() / "small";
  fs::create_directories(d);
  if (!can_make_small_fs(d)) {
    fs::remove_all(d.parent_path());
    GTEST_SKIP() << "cannot mount a tmpfs in a private mount namespace here";
  }
  {
    Agent a("", d);
    a.hello();
    // Fill it: the write fails with ENOSPC, so the exec is no_space.
    auto& full = a.exec({{"argv", {"sh", "-c", "cat /dev/zero > fill"}}, {"cwd", d.string()}});
    EXPECT_EQ(full.response["reason"], "no_space") << full.response.dump() << full.err;
    EXPECT_NE(full.response["exit_code"], 0);
    // Still full: a program that then hangs is ended by its timeout.
    auto& t = a.exec({{"argv", {"sleep", "100"}}, {"cwd", d.string()}, {"timeout_ms", 500}});
    EXPECT_EQ(t.response["reason"], "timeout") << t.response.dump();
    EXPECT_EQ(t.response["timed_out"], true);
    EXPECT_EQ(t.response["signal"], SIGKILL);
    // And one that fills the disk and then hangs, in one exec.
    auto& both = a.exec({{"argv", {"sh", "-c", "rm fill; cat /dev/zero > fill2; sleep 100"}},
                         {"cwd", d.string()},
                         {"timeout_ms", 1000}});
    EXPECT_EQ(both.response["reason"], "timeout") << both.response.dump();
  }
  fs::remove_all(d.parent_path());
}

TEST(Agent, LimitsAreValidatedNamingTheField) {
  Agent a;
  a.hello();
  for (auto [limits, field] :
       std::vector<std::pair<json, std::string>>{{{{"pids", 0}}, "limits.pids"},
                                                 {{{"memory_mb", "big"}}, "limits.memory_mb"},
                                                 {{{"cpu_seconds", -1}}, "limits.cpu_seconds"},
                                                 {{{"nice", 3}}, "limits.nice"},
                                                 {json(7), "limits"}}) {
    auto& r = a.exec({{"argv", {"true"}}, {"limits", limits}});
    EXPECT_EQ(r.response["error"]["code"], "invalid_argument") << limits.dump();
    EXPECT_NE(r.response["error"]["message"].get<std::string>().find(field), std::string::npos)
        << r.response.dump();
  }
  // pids/memory need a cgroup: refused (not silently ignored) without one.
  auto& r = a.exec({{"argv", {"true"}}, {"limits", {{"pids", 10}}}});
  EXPECT_EQ(r.response["error"]["code"], "invalid_argument");
}

// When the main process ends, what it left behind is killed; with a cgroup
// also setsid'ed daemons that still hold the exec's stdout.
TEST(Agent, ExecEndKillsWhatItLeftBehind) {
  std::string cg = test_cgroup_root();
  {
    Agent a(cg);
    a.hello();
    auto d = temp_dir();
    std::string marker = (d / "survived").string();
    std::string script = cg.empty() ? "(sleep 2; touch " + marker + ") & echo started"
                                    : "setsid sh -c 'sleep 2; touch " + marker +
                                          "' & (setsid sleep 30 &); echo started";
    auto t0 = std::chrono::steady_clock::now();
    auto& r = a.exec({{"argv", {"sh", "-c", script}}});
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
    EXPECT_EQ(r.out, "started\n");
    EXPECT_EQ(r.response["reason"], "exited");
    sleep(3);
    EXPECT_FALSE(fs::exists(marker)) << "a process of the exec outlived it";
    fs::remove_all(d);
  }
  if (!cg.empty()) rmdir(cg.c_str());
}

TEST(Agent, BackgroundJobsListedWaitedKilled) {
  std::string cg = test_cgroup_root();
  {
    Agent a(cg);
    a.hello();
    json bg = a.call({{"op", "exec"},
                      {"argv", {"sh", "-c", "sleep 30"}},
                      {"background", true},
                      {"exec_id", "ex-a"}});
    EXPECT_EQ(bg["exec_id"], "ex-a");
    EXPECT_EQ(bg["running"], true);
    EXPECT_GT(bg["pid"].get<int>(), 0);
    json quick = a.call({{"op", "exec"}, {"argv", {"sh", "-c", "exit 3"}}, {"background", true}});
    EXPECT_EQ(a.call({{"op", "exec"},
                      {"argv", {"true"}},
                      {"background", true},
                      {"exec_id", "ex-a"}})["error"]["code"],
              "exists");
    json done = a.call({{"op", "wait_job"}, {"exec_id", quick["exec_id"]}, {"timeout_ms", 10000}});
    EXPECT_EQ(done["running"], false);
    EXPECT_EQ(done["exit_code"], 3);
    EXPECT_EQ(done["reason"], "exited");
    json list = a.call({{"op", "jobs"}})["jobs"];
    ASSERT_EQ(list.size(), 2u);
    EXPECT_EQ(list[0]["exec_id"], "ex-a");
    EXPECT_EQ(list[0]["running"], true);
    EXPECT_EQ(list[0]["argv"], json({"sh", "-c", "sleep 30"}));
    // A wait that times out answers with the job still running.
    EXPECT_EQ(a.call({{"op", "wait_job"}, {"exec_id", "ex-a"}, {"timeout_ms", 100}})["running"],
              true);
    // A waiter is answered when the job is killed.
    uint32_t w = a.next_id_++;
    a.send_json(Type::request, w, {{"op", "wait_job"}, {"exec_id", "ex-a"}, {"timeout_ms", 20000}});
    EXPECT_EQ(a.call({{"op", "kill_job"}, {"exec_id", "ex-a"}})["exec_id"], "ex-a");
    json killed = a.wait(w).response;
    EXPECT_EQ(killed["running"], false);
    EXPECT_EQ(killed["reason"], "killed");
    EXPECT_EQ(a.call({{"op", "wait_job"}, {"exec_id", "nope"}})["error"]["code"], "not_found");
  }
  {
    // One left running: the agent kills it when it goes (the sandbox ends).
    pid_t pid;
    {
      Agent a(cg);
      a.hello();
      pid = a.call({{"op", "exec"}, {"argv", {"sleep", "30"}}, {"background", true}})["pid"];
      EXPECT_EQ(kill(pid, 0), 0);
    }  // waits for the agent to exit
    // Dead (possibly a zombie for a moment until init reaps it).
    auto state = [&] {
      std::ifstream st("/proc/" + std::to_string(pid) + "/stat");
      std::string a, b, c;
      st >> a >> b >> c;
      return c;
    };
    for (int i = 0; i < 100 && !state().empty() && state() != "Z"; ++i) usleep(20000);
    EXPECT_TRUE(state().empty() || state() == "Z") << "background job outlived the agent";
  }
  if (!cg.empty()) rmdir(cg.c_str());
}

TEST(Agent, FilesRoundTripBinary) {
  Agent a;
  a.hello();
  auto d = temp_dir();
  std::string content;
  for (int i = 0; i < 3 * 1024 * 1024 + 7; ++i)
    content.push_back(static_cast<char>(i * 7 + i / 256));
  std::string path = (d / "sub/dir/blob.bin").string();
  uint32_t w = a.next_id_++;
  a.send_json(Type::request, w,
              {{"op", "write_file"}, {"path", path}, {"mode", 0600}, {"parents", true}});
  a.send_input(w, content);
  EXPECT_EQ(a.wait(w).response["size"], content.size());
  uint32_t r = a.next_id_++;
  a.send_json(Type::request, r, {{"op", "read_file"}, {"path", path}});
  auto& rr = a.wait(r);
  EXPECT_EQ(rr.response["size"], content.size());
  EXPECT_TRUE(rr.out == content);
  EXPECT_TRUE(rr.eof[1]);

  json st = a.call({{"op", "stat"}, {"path", path}});
  EXPECT_EQ(st["type"], "file");
  EXPECT_EQ(st["mode"], 0600);
  EXPECT_EQ(st["size"], content.size());
  EXPECT_EQ(st["name"], "blob.bin");

  EXPECT_EQ(a.call({{"op", "mkdir"}, {"path", (d / "m").string()}}), json::object());
  EXPECT_EQ(a.call({{"op", "mkdir"}, {"path", (d / "m").string()}})["error"]["code"], "exists");
  EXPECT_EQ(a.call({{"op", "mkdir"}, {"path", (d / "m/x/y").string()}, {"parents", true}}),
            json::object());
  json ls = a.call({{"op", "list"}, {"path", d.string()}});
  ASSERT_EQ(ls["entries"].size(), 2u);
  EXPECT_EQ(ls["entries"][0]["name"], "m");
  EXPECT_EQ(ls["entries"][0]["type"], "dir");
  EXPECT_EQ(ls["entries"][1]["name"], "sub");
  // No temp files left beside the written file.
  EXPECT_EQ(a.call({{"op", "list"}, {"path", (d / "sub/dir").string()}})["entries"].size(), 1u);

  EXPECT_EQ(a.call({{"op", "remove"}, {"path", (d / "m").string()}})["error"]["code"], "not_empty");
  EXPECT_EQ(a.call({{"op", "remove"}, {"path", (d / "m").string()}, {"recursive", true}}),
            json::object());
  EXPECT_FALSE(fs::exists(d / "m"));
  EXPECT_EQ(a.call({{"op", "stat"}, {"path", (d / "m").string()}})["error"]["code"], "not_found");

  uint32_t bad = a.next_id_++;
  a.send_json(Type::request, bad, {{"op", "read_file"}, {"path", d.string()}});
  EXPECT_EQ(a.wait(bad).response["error"]["code"], "is_a_directory");
  EXPECT_EQ(a.call({{"op", "list"}, {"path", "relative"}})["error"]["code"], "invalid_argument");
  json info = a.call({{"op", "info"}});
  EXPECT_GT(info["mem_total_kb"], 0);
  EXPECT_GT(info["disk_total_bytes"], 0);
  EXPECT_GE(info["cpus"], 1);
  fs::remove_all(d);
}

TEST(Agent, SurvivesMalformedInput) {
  Agent a;
  a.hello();
  // Bad JSON, non-object, unknown op, missing and ill-typed fields.
  for (const char* p : {"{", "[1]", R"({"op":"frobnicate"})", R"({"op":"stat"})",
                        R"({"op":"stat","path":5})", R"({"nop":1})"}) {
    uint32_t id = a.next_id_++;
    Frame f;
    f.type = Type::request;
    f.stream = id;
    f.payload = p;
    a.send(f);
    json r = a.wait(id).response;
    EXPECT_EQ(r["error"]["code"], "invalid_argument") << p << " -> " << r;
  }
  // Frames for unknown streams are ignored; the agent keeps serving.
  a.send(protocol::make_credit(999, 1, 10));
  a.send_eof(998);
  EXPECT_EQ(a.call({{"op", "ping"}}), json::object());
  // Undecodable bytes: the agent resynchronises on the next hello.
  a.raw(std::string("\xff\xff\xff\xff garbage that is not a frame", 36));
  a.raw(std::string(protocol::kHeaderSize + protocol::kMaxPayload, '\0'));
  EXPECT_EQ(a.hello()["version"], 1);
  EXPECT_EQ(a.call({{"op", "ping"}}), json::object());
  auto& r = a.exec({{"argv", {"echo", "still here"}}});
  EXPECT_EQ(r.out, "still here\n");
}

// Reads frames until `pred` holds for stream `id` (or the stream ends).
template <typename Pred>
bool pump_until(Agent& a, uint32_t id, Pred pred, int timeout_ms = 20000) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!pred(a.streams_[id]) && !a.streams_[id].done &&
         std::chrono::steady_clock::now() < deadline)
    if (auto f = a.recv(200)) a.dispatch(*f);
  return pred(a.streams_[id]);
}

Frame data_frame(uint32_t stream, const std::string& bytes) {
  Frame f;
  f.type = Type::data;
  f.stream = stream;
  f.payload = bytes;
  return f;
}

TEST(Agent, PtyExecIsATerminalFollowsResizeAndReadsInput) {
  Agent a;
  ASSERT_EQ(a.hello()["version"], 1);
  uint32_t id = a.next_id_++;
  a.send_json(Type::request, id,
              {{"op", "exec"},
               {"argv",
                {"sh", "-c",
                 "stty size; [ -t 0 ] && [ -t 1 ] && [ -t 2 ] && echo TTY=$TERM; read line; "
                 "echo got=$line; trap 'stty size; exit 5' WINCH; echo armed; "
                 "while :; do sleep 0.05; done"}},
               {"pty", {{"cols", 100}, {"rows", 30}}}});
  auto has = [](const std::string& s) {
    return [s](const StreamResult& r) { return r.out.find(s) != std::string::npos; };
  };
  ASSERT_TRUE(pump_until(a, id, has("TTY=xterm-256color"))) << a.streams_[id].out;
  EXPECT_NE(a.streams_[id].out.find("30 100"), std::string::npos) << a.streams_[id].out;
  EXPECT_TRUE(a.streams_[id].err.empty());  // a terminal has one output stream
  a.send(data_frame(id, "hello\r"));
  ASSERT_TRUE(pump_until(a, id, has("armed"))) << a.streams_[id].out;
  EXPECT_NE(a.streams_[id].out.find("got=hello"), std::string::npos);
  a.send_json(Type::signal, id, {{"resize", {{"cols", 120}, {"rows", 40}}}});
  StreamResult& r = a.wait(id);
  EXPECT_EQ(r.response["exit_code"], 5) << r.response.dump();
  EXPECT_NE(r.out.find("40 120"), std::string::npos) << r.out;
}

TEST(Agent, PtyCtrlCAndCtrlDAreTheLineDisciplines) {
  Agent a;
  a.hello();
  // Ctrl-C (byte 3) is SIGINT for the terminal's foreground group.
  uint32_t id = a.next_id_++;
  a.send_json(Type::request, id,
              {{"op", "exec"},
               {"argv", {"sh", "-c", "echo go; sleep 100; echo not-interrupted"}},
               {"pty", {{"cols", 80}, {"rows", 24}}}});
  ASSERT_TRUE(pump_until(
      a, id, [](const StreamResult& r) { return r.out.find("go") != std::string::npos; }));
  // Once sleep runs (a ^C racing sh's own start-up is not the point).
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto t0 = std::chrono::steady_clock::now();
  a.send(data_frame(id, "\x03"));
  StreamResult& r = a.wait(id);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  EXPECT_EQ(r.response["signal"], SIGINT) << r.response.dump();
  EXPECT_EQ(r.out.find("not-interrupted"), std::string::npos);
  // Ctrl-D (byte 4) at the start of a line is end of input.
  uint32_t id2 = a.next_id_++;
  a.send_json(Type::request, id2,
              {{"op", "exec"},
               {"argv", {"sh", "-c", "echo go; cat >/dev/null; echo eof-seen"}},
               {"pty", {{"cols", 80}, {"rows", 24}}}});
  ASSERT_TRUE(pump_until(
      a, id2, [](const StreamResult& r) { return r.out.find("go") != std::string::npos; }));
  a.send(data_frame(id2, "\x04"));
  StreamResult& r2 = a.wait(id2);
  EXPECT_EQ(r2.response["exit_code"], 0) << r2.response.dump();
  EXPECT_NE(r2.out.find("eof-seen"), std::string::npos) << r2.out;
}

TEST(Agent, PtyRequestsAreValidated) {
  Agent a;
  a.hello();
  auto& bad = a.exec({{"argv", {"true"}}, {"pty", {{"cols", 0}, {"rows", 24}}}});
  EXPECT_EQ(bad.response["error"]["code"], "invalid_argument") << bad.response.dump();
  auto& bg =
      a.exec({{"argv", {"true"}}, {"background", true}, {"pty", {{"cols", 80}, {"rows", 24}}}});
  EXPECT_EQ(bg.response["error"]["code"], "invalid_argument") << bg.response.dump();
  // A resize on an exec without a pty fails that exec's stream.
  uint32_t id = a.next_id_++;
  a.send_json(Type::request, id, {{"op", "exec"}, {"argv", {"sleep", "30"}}});
  a.send_json(Type::signal, id, {{"resize", {{"cols", 80}, {"rows", 24}}}});
  StreamResult& r = a.wait(id);
  EXPECT_EQ(r.response["error"]["code"], "protocol_error") << r.response.dump();
  // An ill-formed resize is refused naming the field.
  uint32_t id2 = a.next_id_++;
  a.send_json(Type::request, id2,
              {{"op", "exec"}, {"argv", {"sleep", "30"}}, {"pty", {{"cols", 80}, {"rows", 24}}}});
  a.send_json(Type::signal, id2, {{"resize", {{"cols", 80}}}});
  StreamResult& r2 = a.wait(id2);
  EXPECT_EQ(r2.response["error"]["code"], "invalid_argument") << r2.response.dump();
  EXPECT_NE(r2.response["error"]["message"].get<std::string>().find("resize.rows"),
            std::string::npos);
}

}  // namespace
}  // namespace airlock::guest

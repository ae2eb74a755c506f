// The CLI's client against airlockd's real HTTP layer (server, router,
// request parsing) over a real unix socket, with the fake engine of
// daemon/fake_service_test_support.h: everything but the VM.
#include "client/client.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "cli/args.h"
#include "common/error.h"
#include "daemon/base64.h"
#include "daemon/fake_service_test_support.h"
#include "daemon/server.h"

namespace airlock::cli {
namespace {

using nlohmann::json;

class ApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/airlock-api-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    socket_ = dir_ / "d.sock";
    server_ = std::make_unique<daemon::Server>(socket_);
    server_->bind();
    engine_ = std::make_unique<daemon::FakeSandboxService>();
    thread_ = std::thread([this] { server_->run(*engine_); });
  }
  void TearDown() override {
    server_->stop();
    thread_.join();
    std::filesystem::remove_all(dir_);
  }

  // Raw HTTP exchange, for what the client never sends.
  std::string raw(const std::string& request) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, socket_.c_str(), sizeof addr.sun_path - 1);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    EXPECT_EQ(::write(fd, request.data(), request.size()), ssize_t(request.size()));
    std::string out;
    char buf[4096];
    for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) out.append(buf, size_t(n));
    ::close(fd);
    return out;
  }

  Error expect_error(const std::function<void()>& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return e;
    }
    ADD_FAILURE() << "expected an error";
    return Error(Errc::internal, "none");
  }

  std::filesystem::path dir_, socket_;
  std::unique_ptr<daemon::Server> server_;
  std::unique_ptr<engine::SandboxService> engine_;
  std::thread thread_;
};

TEST_F(ApiTest, SocketIsPrivateAndSecondServerRefused) {
  EXPECT_EQ(std::filesystem::status(socket_).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  daemon::Server second(socket_);
  Error e = expect_error([&] { second.bind(); });
  EXPECT_EQ(e.code(), Errc::conflict);
  EXPECT_NE(std::string(e.what()).find("another airlockd"), std::string::npos);
}

TEST_F(ApiTest, SandboxLifecycle) {
  client::Client c(socket_);
  EXPECT_TRUE(c.ping());
  json info = c.call("GET", "/v1/info");
  EXPECT_EQ(info["daemon"]["version"], AIRLOCK_VERSION);
  json sb = c.call("POST", "/v1/sandboxes", {{"cpus", 2}, {"metadata", {{"team", "a"}}}});
  std::string id = sb["id"];
  EXPECT_EQ(sb["cpus"], 2);
  EXPECT_EQ(sb["state"], "running");
  c.call("POST", "/v1/sandboxes", json::object());
  EXPECT_EQ(c.call("GET", "/v1/sandboxes").size(), 2u);
  json filtered = c.call("GET", "/v1/sandboxes?metadata.team=a");
  ASSERT_EQ(filtered.size(), 1u);
  EXPECT_EQ(filtered[0]["id"], id);
  EXPECT_EQ(c.call("GET", "/v1/sandboxes/" + id)["id"], id);
  EXPECT_TRUE(c.call("DELETE", "/v1/sandboxes/" + id).is_null());
  EXPECT_EQ(c.call("GET", "/v1/sandboxes").size(), 1u);
  EXPECT_EQ(c.call("GET", "/v1/sandboxes?all=true").size(), 2u);
  json logs = c.call("GET", "/v1/sandboxes/" + id + "/logs");
  ASSERT_EQ(logs.size(), 2u);
  EXPECT_EQ(logs[1]["event"], "deleted");
  EXPECT_EQ(c.call("GET", "/v1/sandboxes/" + std::string(sb["id"]) + "/info")["kernel"],
            "6.1.0-fake");
}

// The CLI's check for a daemon (spawn.cc): a connect whose connection then
// carries the first request, instead of a GET /v1/info of its own.
TEST_F(ApiTest, ListeningKeepsItsConnectionForTheNextCall) {
  client::Client absent(dir_ / "absent.sock");
  EXPECT_FALSE(absent.listening());

  // Checked, then moved (main.cc's connect() returns it to its caller).
  client::Client checked(socket_);
  ASSERT_TRUE(checked.listening());
  client::Client c = std::move(checked);
  // The call went over the kept connection: it is the only one open.
  json info = c.call("GET", "/v1/info");
  EXPECT_EQ(info["daemon"]["connections"]["open"], 1) << info.dump();
  EXPECT_EQ(c.call("GET", "/v1/sandboxes").size(), 0u);  // then a new one per call

  // A copy does not share it; a kept connection past 2 s is not used (the
  // daemon may have closed it meanwhile), the call opens a new one.
  ASSERT_TRUE(c.listening());
  client::Client copy = c;
  EXPECT_EQ(copy.call("GET", "/v1/sandboxes").size(), 0u);
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  EXPECT_EQ(c.call("GET", "/v1/info")["daemon"]["version"], AIRLOCK_VERSION);
}

TEST_F(ApiTest, BadInputNamesTheField) {
  client::Client c(socket_);
  Error e = expect_error([&] { c.call("POST", "/v1/sandboxes", {{"cpus", "2"}}); });
  EXPECT_EQ(e.code(), Errc::invalid_argument);
  EXPECT_EQ(e.field(), "cpus");
  e = expect_error([&] { c.call("POST", "/v1/sandboxes", {{"bogus", 1}}); });
  EXPECT_EQ(e.field(), "bogus");
  e = expect_error([&] { c.call("POST", "/v1/sandboxes", {{"image", "nope"}}); });
  EXPECT_EQ(e.code(), Errc::not_found);
  EXPECT_EQ(e.field(), "image");
  e = expect_error([&] { c.call("GET", "/v1/sandboxes/sb-000000000999"); });
  EXPECT_EQ(e.code(), Errc::not_found);
  e = expect_error([&] { c.call("GET", "/v1/sandboxes/bad%20id"); });
  EXPECT_EQ(e.field(), "id");
  e = expect_error([&] { c.call("GET", "/v1/sandboxes?colour=red"); });
  EXPECT_EQ(e.field(), "colour");
  e = expect_error([&] { c.call("GET", "/v1/nothing"); });
  EXPECT_EQ(e.code(), Errc::not_found);
}

TEST_F(ApiTest, RawHttpErrors) {
  std::string r =
      raw("POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n"
          "Connection: close\r\n\r\n{\"cpus\":}");
  EXPECT_NE(r.find("HTTP/1.1 400"), std::string::npos) << r;
  EXPECT_NE(r.find("malformed JSON at byte 9"), std::string::npos) << r;
  r = raw("PATCH /v1/sandboxes HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_NE(r.find("HTTP/1.1 405"), std::string::npos) << r;
  EXPECT_NE(r.find("Allow: POST, GET"), std::string::npos) << r;
  r = raw("POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\n{");
  EXPECT_NE(r.find("HTTP/1.1 413"), std::string::npos) << r;
  r = raw("garbage\r\n\r\n");
  EXPECT_NE(r.find("HTTP/1.1 400"), std::string::npos) << r;
  // Keep-alive: two requests on one connection, both answered.
  r =
      raw("GET /v1/info HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/info HTTP/1.1\r\nHost: x\r\n"
          "Connection: close\r\n\r\n");
  EXPECT_EQ(r.find("HTTP/1.1 200"), 0u);
  EXPECT_NE(r.find("HTTP/1.1 200", 10), std::string::npos) << r;
}

TEST_F(ApiTest, ExecStreamsEventsAndExitCodes) {
  client::Client c(socket_);
  std::string id = c.call("POST", "/v1/sandboxes", json::object())["id"];
  std::vector<json> events;
  json exit = c.exec(id, exec_body({}, {"bytes"}, std::nullopt),
                     [&](const json& ev) { events.push_back(ev); });
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0]["type"], "start");
  EXPECT_EQ(events[0]["pid"], 42);
  EXPECT_EQ(events[1]["type"], "stdout");
  std::string all;
  for (int i = 0; i < 256; ++i) all += static_cast<char>(i);
  EXPECT_EQ(daemon::base64_decode(events[1]["data"].get<std::string>()).value(), all);
  EXPECT_EQ(events[2]["type"], "stderr");
  EXPECT_EQ(exit["type"], "exit");
  EXPECT_EQ(exit["stdout_bytes"], 256);
  EXPECT_EQ(exit_code_of(exit), 0);

  std::string echoed;
  c.exec(id, exec_body({}, {"cat"}, std::string("in\0put", 6)), [&](const json& ev) {
    if (ev["type"] == "stdout") echoed += *daemon::base64_decode(ev["data"].get<std::string>());
  });
  EXPECT_EQ(echoed, std::string("in\0put", 6));
  auto noop = [](const json&) {};
  EXPECT_EQ(exit_code_of(c.exec(id, exec_body({}, {"exit", "7"}, std::nullopt), noop)), 7);
  EXPECT_EQ(exit_code_of(c.exec(id, exec_body({}, {"kill9"}, std::nullopt), noop)), 137);
  EXPECT_EQ(exit_code_of(c.exec(id, exec_body({}, {"slow", "3"}, std::nullopt), noop)), 124);
  // Refused before the process starts: a plain 4xx, not a stream.
  Error e = expect_error([&] { c.exec(id, exec_body({}, {"fail-early"}, std::nullopt), noop); });
  EXPECT_EQ(e.field(), "argv");
  e = expect_error([&] { c.exec(id, {{"argv", {"x"}}, {"pty", true}}, noop); });
  EXPECT_EQ(e.field(), "pty");
  // Failing after the stream started: an error event.
  e = expect_error([&] { c.exec(id, exec_body({}, {"fail-late"}, std::nullopt), noop); });
  EXPECT_EQ(e.code(), Errc::guest_error);
}

// stdin_stream: the exec's stdin is fed by POST .../stdin while the output
// streams; a line is answered before the next is sent; eof closes it (409
// after), and the route's errors name what was wrong.
TEST_F(ApiTest, StreamedStdinOverHttp) {
  client::Client c(socket_);
  std::string id = c.call("POST", "/v1/sandboxes", json::object())["id"];
  std::mutex mu;
  std::condition_variable cv;
  std::string exec_id, out;
  json body = exec_body({}, {"cat"}, std::nullopt);
  body["stdin_stream"] = true;
  json exit;
  std::thread t([&] {
    exit = c.exec(id, body, [&](const json& ev) {
      std::lock_guard lock(mu);
      if (ev["type"] == "start") exec_id = ev["exec_id"];
      if (ev["type"] == "stdout") out += *daemon::base64_decode(ev["data"].get<std::string>());
      cv.notify_all();
    });
  });
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return !exec_id.empty(); }));
  }
  client::StdinSender sender(socket_, id, exec_id);
  json r = sender.send("one\n", false);
  EXPECT_EQ(r["stdin_bytes"], 4);
  EXPECT_EQ(r["exec_id"], exec_id);
  {
    std::unique_lock lock(mu);
    EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return out == "one\n"; }));
  }
  // A chunked body with Expect: 100-continue, as curl sends it.
  std::string raw_answer =
      raw("POST /v1/sandboxes/" + id + "/exec/" + exec_id +
          "/stdin HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
          "Expect: 100-continue\r\nConnection: close\r\n\r\n3\r\ntwo\r\n1\r\n\n\r\n0\r\n\r\n");
  EXPECT_NE(raw_answer.find("HTTP/1.1 100 Continue"), std::string::npos) << raw_answer;
  EXPECT_NE(raw_answer.find("HTTP/1.1 200"), std::string::npos) << raw_answer;
  EXPECT_NE(raw_answer.find("\"stdin_bytes\":4"), std::string::npos) << raw_answer;
  // Bad query, then the closing write.
  Error e = expect_error([&] {
    raw_answer = raw("POST /v1/sandboxes/" + id + "/exec/" + exec_id +
                     "/stdin?eof=maybe HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"
                     "Connection: close\r\n\r\n");
    if (raw_answer.find("HTTP/1.1 400") != std::string::npos &&
        raw_answer.find("\"field\":\"eof\"") != std::string::npos)
      throw Error(Errc::invalid_argument, "bad eof", "eof");
  });
  EXPECT_EQ(e.field(), "eof") << raw_answer;
  r = sender.send("end", true);
  EXPECT_EQ(r["stdin_closed"], true);
  t.join();
  EXPECT_EQ(out, "one\ntwo\nend");
  EXPECT_EQ(exit["stdin_bytes"], 11);
  e = expect_error([&] { sender.send("more", false); });
  EXPECT_EQ(e.code(), Errc::conflict);
  client::StdinSender unknown(socket_, id, "ex-nope");
  e = expect_error([&] { unknown.send("x", false); });
  EXPECT_EQ(e.code(), Errc::not_found);
  // stdin and stdin_stream together are refused, naming the field.
  body["stdin"] = "x";
  e = expect_error([&] { c.exec(id, body, [](const json&) {}); });
  EXPECT_EQ(e.field(), "stdin_stream");
}

// Output reaches the caller as it is produced, not when 64 KiB piled up or
// the command ended: "a" arrives while the command still waits (it only goes
// on to print "b" once the test kills it).
TEST_F(ApiTest, ExecOutputArrivesWhileTheCommandRuns) {
  client::Client c(socket_);
  std::string id = c.call("POST", "/v1/sandboxes", json::object())["id"];
  std::mutex mu;
  std::condition_variable cv;
  std::string exec_id, out;
  std::thread runner([&] {
    c.exec(id, exec_body({}, {"drip"}, std::nullopt), [&](const json& ev) {
      std::lock_guard lock(mu);
      if (ev["type"] == "start") exec_id = ev["exec_id"];
      if (ev["type"] == "stdout") out += *daemon::base64_decode(ev["data"].get<std::string>());
      cv.notify_all();
    });
  });
  {
    std::unique_lock lock(mu);
    bool got_a = cv.wait_for(lock, std::chrono::seconds(5), [&] { return out == "a\n"; });
    EXPECT_TRUE(got_a) << "first line not delivered while the command ran; got '" << out << "'";
  }
  std::string victim;
  {
    std::unique_lock lock(mu);
    cv.wait_for(lock, std::chrono::seconds(5), [&] { return !exec_id.empty(); });
    victim = exec_id;
  }
  ASSERT_FALSE(victim.empty());
  c.call("DELETE", "/v1/sandboxes/" + id + "/exec/" + victim);  // lets it print "b" and end
  runner.join();
  EXPECT_EQ(out, "a\nb\n");
}

// A daemon that vanishes mid-stream: what arrived was delivered, then a
// ConnectionLost (the CLI's distinct exit code), not a generic error.
TEST_F(ApiTest, ConnectionLostMidStreamIsItsOwnError) {
  client::Client c(socket_);
  std::string id = c.call("POST", "/v1/sandboxes", json::object())["id"];
  std::string out;
  std::thread stopper;
  try {
    c.exec(id, exec_body({}, {"drip"}, std::nullopt), [&](const json& ev) {
      if (ev["type"] != "stdout") return;
      out += *daemon::base64_decode(ev["data"].get<std::string>());
      if (!stopper.joinable())
        stopper = std::thread([this] { server_->stop(); });  // shuts every connection down
    });
    ADD_FAILURE() << "exec returned though the daemon went away";
  } catch (const client::ConnectionLost& e) {
    EXPECT_NE(std::string(e.what()).find("lost the connection to airlockd"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(out, "a\n");
  stopper.join();  // the hangup watch kills the drip exec, so run() returns
}

TEST_F(ApiTest, ClientHangupKillsExec) {
  client::Client c(socket_);
  std::string id = c.call("POST", "/v1/sandboxes", json::object())["id"];
  std::string req_body = R"({"argv":["hang"]})";
  std::string request = "POST /v1/sandboxes/" + id +
                        "/exec HTTP/1.1\r\nHost: x\r\n"
                        "Content-Type: application/json\r\nContent-Length: " +
                        std::to_string(req_body.size()) + "\r\n\r\n" + req_body;
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket_.c_str(), sizeof addr.sun_path - 1);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::write(fd, request.data(), request.size()), ssize_t(request.size()));
  char buf[4096];
  ASSERT_GT(::read(fd, buf, sizeof buf), 0);  // headers + start event
  ::close(fd);
  // The watcher notices the hangup and kills the exec, which is journaled.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  bool killed = false;
  while (!killed && std::chrono::steady_clock::now() < deadline) {
    for (const auto& ev : c.call("GET", "/v1/sandboxes/" + id + "/logs"))
      killed = killed || ev["event"] == "killed";
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(killed);
}

TEST_F(ApiTest, FilesRoundTripStreamed) {
  client::Client c(socket_);
  std::string id = c.call("POST", "/v1/sandboxes", json::object())["id"];
  std::string data;
  for (int i = 0; i < (3 << 20); ++i) data += static_cast<char>((i * 7) ^ (i >> 9));
  auto src = dir_ / "src.bin";
  auto dst = dir_ / "dst.bin";
  {
    FILE* f = std::fopen(src.c_str(), "wb");
    std::fwrite(data.data(), 1, data.size(), f);
    std::fclose(f);
  }
  int in = ::open(src.c_str(), O_RDONLY);
  EXPECT_EQ(c.upload(id, "/tmp/a b.bin", 0600, in), data.size());
  ::close(in);
  EXPECT_EQ(c.call("GET", "/v1/sandboxes/" + id +
                              "/files/stat?path=" + client::url_encode("/tmp/a b.bin"))["size"],
            data.size());
  int out = ::open(dst.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  EXPECT_EQ(c.download(id, "/tmp/a b.bin", out), data.size());
  ::close(out);
  std::string back(data.size(), '\0');
  FILE* f = std::fopen(dst.c_str(), "rb");
  ASSERT_EQ(std::fread(back.data(), 1, back.size() + 1, f), data.size());
  std::fclose(f);
  EXPECT_TRUE(back == data);

  Error e = expect_error([&] {
    int o = ::open(dst.c_str(), O_WRONLY);
    c.download(id, "/nope", o);
  });
  EXPECT_EQ(e.code(), Errc::not_found);
  e = expect_error([&] { c.call("GET", "/v1/sandboxes/" + id + "/files?path=relative"); });
  EXPECT_EQ(e.field(), "path");
  EXPECT_EQ(c.call("POST", "/v1/sandboxes/" + id + "/files/mkdir",
                   {{"path", "/d"}, {"parents", true}})["path"],
            "/d");
  EXPECT_TRUE(c.call("GET", "/v1/sandboxes/" + id + "/files/list?path=/").is_array());
  c.call("DELETE", "/v1/sandboxes/" + id + "/files?path=" + client::url_encode("/tmp/a b.bin"));
  e = expect_error(
      [&] { c.call("DELETE", "/v1/sandboxes/" + id + "/files?path=/tmp/x&recursive=perhaps"); });
  EXPECT_EQ(e.field(), "recursive");
  // An upload to a sandbox that does not exist is refused with its error.
  int in2 = ::open(src.c_str(), O_RDONLY);
  e = expect_error([&] { c.upload("sb-nope", "/x", 0644, in2); });
  ::close(in2);
  EXPECT_EQ(e.code(), Errc::not_found);
}

TEST_F(ApiTest, NetworkPolicyAtCreate) {
  client::Client c(socket_);
  json sb = c.call("POST", "/v1/sandboxes", json::object());
  EXPECT_EQ(sb["network"], (json{{"mode", "none"}}));
  sb = c.call("POST", "/v1/sandboxes",
              {{"network", {{"mode", "allowlist"}, {"allow", {"203.0.113.0/24"}}}}});
  EXPECT_EQ(sb["network"]["mode"], "allowlist");
  EXPECT_EQ(c.call("GET", "/v1/sandboxes/" + sb["id"].get<std::string>())["network"]["allow"],
            (json{"203.0.113.0/24"}));
  // Shape errors (daemon) and meaning errors (the engine's policy parser) both name the entry.
  Error e = expect_error([&] {
    c.call("POST", "/v1/sandboxes", {{"network", {{"mode", "open"}, {"bogus", 1}}}});
  });
  EXPECT_EQ(e.field(), "network.bogus");
  e = expect_error([&] {
    c.call("POST", "/v1/sandboxes",
           {{"network", {{"mode", "allowlist"}, {"allow", {"a.com", 7}}}}});
  });
  EXPECT_EQ(e.field(), "network.allow[1]");
  EXPECT_NE(std::string(e.what()).find("network.allow[1] must be a string"), std::string::npos);
  e = expect_error([&] {
    c.call("POST", "/v1/sandboxes",
           {{"network", {{"mode", "allowlist"}, {"allow", {"a.com", "169.254.169.254"}}}}});
  });
  EXPECT_EQ(e.code(), Errc::invalid_argument);
  EXPECT_EQ(e.field(), "network.allow[1]");
  EXPECT_NE(std::string(e.what()).find("always-denied"), std::string::npos) << e.what();
}

TEST_F(ApiTest, NetworkPatchAndEvents) {
  client::Client c(socket_);
  std::string id =
      c.call("POST", "/v1/sandboxes",
             {{"network", {{"mode", "allowlist"}, {"allow", {"203.0.113.0/24"}}}}})["id"];
  auto run = [&](std::vector<std::string> argv) {
    return c.exec(id, {{"argv", argv}}, [](const json&) {})["exit_code"].get<int>();
  };
  EXPECT_EQ(run({"connect", "203.0.113.7", "443"}), 0);
  EXPECT_EQ(run({"connect", "127.0.0.1", "22"}), 1);
  json events = c.call("GET", "/v1/sandboxes/" + id + "/network/events");
  ASSERT_EQ(events.size(), 3u);  // flow + flow_end allowed, flow denied
  EXPECT_EQ(events[0]["event"], "net_flow");
  EXPECT_EQ(events[1]["event"], "net_flow_end");
  EXPECT_EQ(events[2]["allowed"], false);
  EXPECT_EQ(events[2]["rule"], "always-deny 127.0.0.0/8");

  // Follow: the events so far, then the policy change, then the end.
  std::vector<json> followed;
  std::thread follower([&] {
    c.stream_lines("/v1/sandboxes/" + id + "/network/events?follow=true",
                   [&](const json& ev) { followed.push_back(ev); });
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  json answer = c.call("PATCH", "/v1/sandboxes/" + id + "/network",
                       {{"mode", "allowlist"}, {"allow", {"198.51.100.0/24"}}});
  EXPECT_EQ(answer["flows_cut"], 1);
  EXPECT_EQ(answer["policy"]["allow"], (json{"198.51.100.0/24"}));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  c.call("DELETE", "/v1/sandboxes/" + id);
  follower.join();  // the stream ends with the sandbox
  ASSERT_EQ(followed.size(), 4u);
  EXPECT_EQ(followed[3]["event"], "net_policy");

  // PATCH errors: bad entry 400 naming it; sandbox not running 409.
  std::string id2 = c.call("POST", "/v1/sandboxes", {{"network", {{"mode", "open"}}}})["id"];
  Error e = expect_error([&] {
    c.call("PATCH", "/v1/sandboxes/" + id2 + "/network",
           {{"mode", "allowlist"}, {"allow", {"a.com", "10.0.0.0/8"}}});
  });
  EXPECT_EQ(e.field(), "network.allow[1]");
  e = expect_error([&] { c.call("PATCH", "/v1/sandboxes/" + id2 + "/network", json::object()); });
  EXPECT_EQ(e.field(), "body");
  e = expect_error([&] {
    c.call("PATCH", "/v1/sandboxes/" + id + "/network", {{"mode", "open"}});
  });
  EXPECT_EQ(e.code(), Errc::conflict);
  std::string none = c.call("POST", "/v1/sandboxes", json::object())["id"];
  e = expect_error([&] {
    c.call("PATCH", "/v1/sandboxes/" + none + "/network", {{"mode", "open"}});
  });
  EXPECT_EQ(e.code(), Errc::conflict);
  e = expect_error([&] { c.call("GET", "/v1/sandboxes/nope/network/events?follow=true"); });
  EXPECT_EQ(e.code(), Errc::not_found);
  e = expect_error([&] { c.call("GET", "/v1/sandboxes/" + id + "/network/events?follow=maybe"); });
  EXPECT_EQ(e.field(), "follow");
}

// The connection's thread is the observable: it must end soon after the
// client hangs up, though the sandbox is alive and no events come.
size_t thread_count() {
  size_t n = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/task");
       it != std::filesystem::directory_iterator(); ++it)
    ++n;
  return n;
}

TEST_F(ApiTest, NetworkFollowEndsWhenClientHangsUp) {
  client::Client c(socket_);
  std::string id = c.call("POST", "/v1/sandboxes", {{"network", {{"mode", "open"}}}})["id"];
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // earlier connections' threads end
  size_t before = thread_count();
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket_.c_str(), sizeof addr.sun_path - 1);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  std::string req =
      "GET /v1/sandboxes/" + id + "/network/events?follow=true HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(::write(fd, req.data(), req.size()), ssize_t(req.size()));
  char buf[4096];
  ssize_t n = ::read(fd, buf, sizeof buf);  // the stream's head
  ASSERT_GT(n, 0);
  EXPECT_NE(std::string(buf, size_t(n)).find("application/x-ndjson"), std::string::npos);
  EXPECT_EQ(thread_count(), before + 1);
  ::close(fd);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (thread_count() > before && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(thread_count(), before);
}

}  // namespace
}  // namespace airlock::cli

// GET /v1/sandboxes/{id}/pty: the frame parsing, and whole sessions over the
// real server and a real Beast WebSocket client, with the fake engine of
// fake_service_test_support.h (its "pty" command echoes input back).
#include "daemon/pty.h"

#include <gtest/gtest.h>

#include <boost/asio/local/stream_protocol.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>
#include <chrono>
#include <thread>

#include "client/client.h"
#include "common/error.h"
#include "daemon/fake_service_test_support.h"
#include "daemon/server.h"

namespace airlock::daemon {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace websocket = beast::websocket;
using nlohmann::json;
using stream = net::local::stream_protocol;

std::string field_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument) << e.what();
    return e.field();
  }
  return "<no error>";
}

TEST(PtyParse, StartMessage) {
  auto r = parse_pty_start(R"({"argv":["vi","/x"],"cols":120,"rows":40,"env":{"TERM":"screen"},)"
                           R"("cwd":"/tmp","user":"nobody"})");
  EXPECT_EQ(r.argv, (std::vector<std::string>{"vi", "/x"}));
  ASSERT_TRUE(r.pty);
  EXPECT_EQ(r.pty->cols, 120);
  EXPECT_EQ(r.pty->rows, 40);
  EXPECT_EQ(r.env.at("TERM"), "screen");
  EXPECT_EQ(r.cwd, "/tmp");
  EXPECT_EQ(r.user, "nobody");
  EXPECT_EQ(r.limits.memory_mb, 0);  // none given: none
  // A terminal's process tree in a cgroup of its own, as an exec's.
  auto limited = parse_pty_start(
      R"({"cols":80,"rows":24,"limits":{"memory_mb":64,"pids":32,"cpu_seconds":5}})");
  EXPECT_EQ(limited.limits.memory_mb, 64);
  EXPECT_EQ(limited.limits.pids, 32);
  EXPECT_EQ(limited.limits.cpu_seconds, 5);
  // No argv: the login shell (an empty argv the guest fills in).
  auto shell = parse_pty_start(R"({"cols":80,"rows":24})");
  EXPECT_TRUE(shell.argv.empty());
  EXPECT_TRUE(shell.cmd.empty());
}

TEST(PtyParse, StartMessageErrorsNameTheField) {
  EXPECT_EQ(field_of([] { parse_pty_start(R"({"rows":24})"); }), "cols");
  EXPECT_EQ(field_of([] { parse_pty_start(R"({"cols":0,"rows":24})"); }), "cols");
  EXPECT_EQ(field_of([] { parse_pty_start(R"({"cols":80,"rows":5000})"); }), "rows");
  EXPECT_EQ(field_of([] { parse_pty_start(R"({"cols":"80","rows":24})"); }), "cols");
  EXPECT_EQ(field_of([] { parse_pty_start(R"({"cols":80,"rows":24,"tty":1})"); }), "tty");
  EXPECT_EQ(field_of([] { parse_pty_start(R"({"cols":80,"rows":24,"argv":[]})"); }), "argv");
  EXPECT_EQ(field_of([] { parse_pty_start(R"({"cols":80,"rows":24,"cwd":"rel"})"); }), "cwd");
  EXPECT_EQ(field_of([] { parse_pty_start(R"({"cols":80,"rows":24,"limits":{"memory_mb":0}})"); }),
            "limits.memory_mb");
  EXPECT_EQ(field_of([] { parse_pty_start(R"({"cols":80,"rows":24,"limits":{"swap":1}})"); }),
            "swap");
  EXPECT_EQ(field_of([] { parse_pty_start("[1]"); }), "body");
  EXPECT_EQ(field_of([] { parse_pty_start("not json"); }), "body");
}

TEST(PtyParse, AttachMessage) {
  EXPECT_FALSE(parse_pty_attach(R"({"cols":80,"rows":24})"));  // a start message
  auto a = parse_pty_attach(R"({"exec_id":"ex-1","offset":42,"cols":100,"rows":30})");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->exec_id, "ex-1");
  EXPECT_EQ(a->offset, 42u);
  EXPECT_EQ(a->size, std::make_pair(100, 30));
  auto bare = parse_pty_attach(R"({"exec_id":"ex-1"})");
  ASSERT_TRUE(bare);
  EXPECT_EQ(bare->offset, 0u);
  EXPECT_FALSE(bare->size);
  EXPECT_EQ(field_of([] { parse_pty_attach(R"({"exec_id":"ex-1","offset":-1})"); }), "offset");
  EXPECT_EQ(field_of([] { parse_pty_attach(R"({"exec_id":"ex-1","offset":"1"})"); }), "offset");
  EXPECT_EQ(field_of([] { parse_pty_attach(R"({"exec_id":7})"); }), "exec_id");
  EXPECT_EQ(field_of([] { parse_pty_attach(R"({"exec_id":"ex-1","cols":80})"); }), "rows");
  EXPECT_EQ(field_of([] { parse_pty_attach(R"({"exec_id":"ex-1","argv":["sh"]})"); }), "argv");
}

TEST(PtyParse, ControlMessages) {
  auto r = parse_pty_control(R"({"resize":{"cols":100,"rows":30}})");
  ASSERT_TRUE(r.resize);
  EXPECT_EQ(r.resize->first, 100);
  EXPECT_EQ(r.resize->second, 30);
  EXPECT_FALSE(r.signal);
  auto s = parse_pty_control(R"({"signal":2})");
  ASSERT_TRUE(s.signal);
  EXPECT_EQ(*s.signal, 2);
  EXPECT_EQ(field_of([] { parse_pty_control(R"({"signal":0})"); }), "signal");
  EXPECT_EQ(field_of([] { parse_pty_control(R"({"signal":"INT"})"); }), "signal");
  EXPECT_EQ(field_of([] { parse_pty_control(R"({"resize":{"cols":10}})"); }), "resize.rows");
  EXPECT_EQ(field_of([] { parse_pty_control(R"({"resize":[1,2]})"); }), "resize");
  EXPECT_EQ(field_of([] { parse_pty_control(R"({"resize":{"cols":1,"rows":1},"signal":2})"); }),
            "body");
  EXPECT_EQ(field_of([] { parse_pty_control(R"({"type":"x"})"); }), "body");
}

class PtySessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/airlock-pty-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    socket_ = dir_ / "d.sock";
    server_ = std::make_unique<Server>(socket_, ServerLimits{});
    server_->bind();
    engine_ = std::make_unique<daemon::FakeSandboxService>();
    thread_ = std::thread([this] { server_->run(*engine_); });
    sid_ = engine_->create({}).id;
  }
  void TearDown() override {
    server_->stop();
    thread_.join();
    std::filesystem::remove_all(dir_);
  }

  // A connected, upgraded client (the handshake's HTTP status in `status`).
  std::unique_ptr<websocket::stream<stream::socket>> open(const std::string& target,
                                                          beast::error_code& ec, int& status) {
    auto ws = std::make_unique<websocket::stream<stream::socket>>(io_);
    beast::get_lowest_layer(*ws).connect(stream::endpoint(socket_.string()));
    websocket::response_type res;
    ws->handshake(res, "localhost", target, ec);
    status = res.result_int();
    body_ = res.body();
    return ws;
  }
  std::unique_ptr<websocket::stream<stream::socket>> open_ok(const json& start) {
    beast::error_code ec;
    int status = 0;
    auto ws = open("/v1/sandboxes/" + sid_ + "/pty", ec, status);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_EQ(status, 101);
    ws->text(true);
    ws->write(net::buffer(start.dump()));
    return ws;
  }
  // The next message: (is text, payload); ("", close) at the end.
  static std::pair<bool, std::string> next(websocket::stream<stream::socket>& ws) {
    beast::flat_buffer b;
    beast::error_code ec;
    ws.read(b, ec);
    if (ec) return {false, "<" + ec.message() + ">"};
    return {ws.got_text(), beast::buffers_to_string(b.data())};
  }
  static json next_json(websocket::stream<stream::socket>& ws) {
    auto [text, payload] = next(ws);
    EXPECT_TRUE(text) << payload;
    return json::parse(payload, nullptr, false);
  }
  static void send_text(websocket::stream<stream::socket>& ws, const json& j) {
    ws.text(true);
    ws.write(net::buffer(j.dump()));
  }
  static void send_bytes(websocket::stream<stream::socket>& ws, const std::string& s) {
    ws.binary(true);
    ws.write(net::buffer(s));
  }

  net::io_context io_;
  std::filesystem::path dir_, socket_;
  std::unique_ptr<Server> server_;
  std::unique_ptr<engine::SandboxService> engine_;
  std::thread thread_;
  std::string sid_, body_;
};

TEST_F(PtySessionTest, BytesBothWaysResizeAndExitCode) {
  auto ws = open_ok({{"cols", 80}, {"rows", 24}});
  json start = next_json(*ws);
  EXPECT_EQ(start["type"], "start");
  EXPECT_TRUE(start["exec_id"].is_string());
  EXPECT_EQ(next(*ws), std::make_pair(false, std::string("size 80x24\r\n")));
  send_bytes(*ws, "hello");
  EXPECT_EQ(next(*ws), std::make_pair(false, std::string("hello")));
  send_text(*ws, {{"resize", {{"cols", 132}, {"rows", 50}}}});
  EXPECT_EQ(next(*ws), std::make_pair(false, std::string("size 132x50\r\n")));
  send_bytes(*ws, std::string("bye\x04", 4));  // Ctrl-D: the fake exits 0
  EXPECT_EQ(next(*ws), std::make_pair(false, std::string("bye")));
  json exit = next_json(*ws);
  EXPECT_EQ(exit["type"], "exit");
  EXPECT_EQ(exit["exit_code"], 0);
  auto end = next(*ws);
  EXPECT_EQ(end.second, "<The WebSocket stream was gracefully closed at both endpoints>");
}

TEST_F(PtySessionTest, SignalEndsTheExec) {
  auto ws = open_ok({{"cols", 80}, {"rows", 24}});
  EXPECT_EQ(next_json(*ws)["type"], "start");
  next(*ws);  // size line
  send_text(*ws, {{"signal", 15}});
  json exit = next_json(*ws);
  EXPECT_EQ(exit["type"], "exit");
  EXPECT_EQ(exit["signal"], 15);
  EXPECT_TRUE(exit["exit_code"].is_null());
  EXPECT_EQ(next(*ws).first, false);  // the close
}

TEST_F(PtySessionTest, BadMessagesGetAnErrorFrameThenClose) {
  {
    auto ws = open_ok({{"cols", 80}});
    json e = next_json(*ws);
    EXPECT_EQ(e["type"], "error");
    EXPECT_EQ(e["error"]["code"], "invalid_argument");
    EXPECT_EQ(e["error"]["field"], "rows");
    EXPECT_EQ(next(*ws).first, false);  // closed
  }
  {
    auto ws = open_ok({{"cols", 80}, {"rows", 24}});
    EXPECT_EQ(next_json(*ws)["type"], "start");
    next(*ws);
    send_text(*ws, {{"resize", {{"cols", 0}, {"rows", 1}}}});
    json e = next_json(*ws);
    EXPECT_EQ(e["type"], "error");
    EXPECT_EQ(e["error"]["field"], "resize.cols");
  }
}

TEST_F(PtySessionTest, ErrorsBeforeTheUpgradeArePlainHttp) {
  beast::error_code ec;
  int status = 0;
  open("/v1/sandboxes/sb-nosuch/pty", ec, status);
  EXPECT_EQ(ec, websocket::error::upgrade_declined) << ec.message();
  client::Client c(socket_);
  try {
    c.call("GET", "/v1/sandboxes/sb-nosuch/pty");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::not_found);
  }
  try {
    c.call("GET", "/v1/sandboxes/" + sid_ + "/pty");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_EQ(e.field(), "upgrade");
  }
}

TEST_F(PtySessionTest, ClientGoneKillsTheExec) {
  std::string exec_id;
  {
    auto ws = open_ok({{"cols", 80}, {"rows", 24}});
    exec_id = next_json(*ws)["exec_id"];
    next(*ws);
    beast::get_lowest_layer(*ws).close();  // no close handshake: just gone
  }
  // The fake's exec ends once killed; then input is refused as not running.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  bool ended = false;
  while (!ended && std::chrono::steady_clock::now() < deadline) {
    try {
      engine_->pty_input(sid_, exec_id, "x");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } catch (const Error& e) {
      ended = e.code() == Errc::not_found;
    }
  }
  EXPECT_TRUE(ended);
}

}  // namespace
}  // namespace airlock::daemon

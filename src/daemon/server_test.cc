// airlockd's connection bounds (cap, idle timeout) and stream robustness,
// over a real unix socket with the fake engine of
// fake_service_test_support.h standing in for libairlock.
#include "daemon/server.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

#include "auth/auth.h"
#include "client/client.h"
#include "common/error.h"
#include "daemon/exchange.h"
#include "daemon/fake_service_test_support.h"
#include "daemon/listener.h"
#include "daemon/router.h"

namespace airlock::daemon {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

class ServerTest : public ::testing::Test {
 protected:
  void start(ServerLimits limits, const std::function<void(Server&)>& before_run = {}) {
    char tmpl[] = "/tmp/airlock-srv-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    socket_ = dir_ / "d.sock";
    server_ = std::make_unique<Server>(socket_, limits);
    server_->bind();
    if (before_run) before_run(*server_);
    engine_ = std::make_unique<daemon::FakeSandboxService>();
    thread_ = std::thread([this] { server_->run(*engine_); });
  }
  void TearDown() override {
    for (int fd : fds_) ::close(fd);
    if (server_) {
      server_->stop();
      thread_.join();
    }
    std::filesystem::remove_all(dir_);
  }

  int connect_raw() {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, socket_.c_str(), sizeof addr.sun_path - 1);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    fds_.push_back(fd);
    return fd;
  }
  // A connection to the TCP listener on 127.0.0.1:port.
  int connect_tcp(int port) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    fds_.push_back(fd);
    return fd;
  }
  static void send_all(int fd, const std::string& s) {
    ASSERT_EQ(::send(fd, s.data(), s.size(), MSG_NOSIGNAL), ssize_t(s.size()));
  }
  // Everything until EOF (or `limit` elapsed).
  static std::string read_until_eof(int fd, std::chrono::milliseconds limit = 5000ms) {
    std::string out;
    auto deadline = std::chrono::steady_clock::now() + limit;
    char buf[4096];
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      ssize_t n = ::read(fd, buf, sizeof buf);
      if (n <= 0) return out;
      out.append(buf, size_t(n));
    }
    out += "<no EOF>";
    return out;
  }
  // Waits for a counter of GET /v1/info's daemon.connections to reach `want`.
  bool wait_counter(const char* key, int want, std::chrono::milliseconds limit = 5000ms) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      if (server_->counters()[key].get<int>() >= want) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }

  std::filesystem::path dir_, socket_;
  std::unique_ptr<Server> server_;
  std::unique_ptr<engine::SandboxService> engine_;
  std::thread thread_;
  std::vector<int> fds_;
};

const std::string kInfo = "GET /v1/info HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

TEST_F(ServerTest, ConnectionsBeyondTheCapGetA503AndAreCounted) {
  start({.max_connections = 3, .idle_timeout = 60s});
  for (int i = 0; i < 3; ++i) connect_raw();  // held open, sending nothing
  ASSERT_TRUE(wait_counter("open", 3));
  int extra = connect_raw();
  send_all(extra, kInfo);
  std::string r = read_until_eof(extra);
  EXPECT_EQ(r.rfind("HTTP/1.1 503", 0), 0u) << r;
  json body = json::parse(r.substr(r.find("\r\n\r\n") + 4));
  EXPECT_EQ(body["error"]["code"], "unavailable");
  EXPECT_NE(body["error"]["message"].get<std::string>().find("maximum of 3 connections"),
            std::string::npos);
  EXPECT_EQ(server_->counters()["refused"], 1);
  EXPECT_EQ(server_->counters()["open"], 3);
  // The CLI sees a running daemon (it must not start another) and the error.
  client::Client c(socket_);
  EXPECT_TRUE(c.ping());
  try {
    c.call("GET", "/v1/info");
    ADD_FAILURE() << "a call over the cap succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::unavailable);
    EXPECT_NE(std::string(e.what()).find("--max-connections"), std::string::npos) << e.what();
  }
  EXPECT_EQ(server_->counters()["refused"], 3);
  // A freed slot serves again.
  ::close(fds_[0]);
  fds_.erase(fds_.begin());
  auto deadline = std::chrono::steady_clock::now() + 5s;
  while (server_->counters()["open"].get<int>() > 2 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(10ms);
  int again = connect_raw();
  send_all(again, kInfo);
  r = read_until_eof(again);
  EXPECT_EQ(r.rfind("HTTP/1.1 200", 0), 0u) << r;
  EXPECT_NE(r.find("\"refused\":3"), std::string::npos) << r;  // counted in /v1/info
}

TEST(ConnectionCaps, NetworkLeavesTheUnixReserveAndSourcesAndTenantsAreCapped) {
  ServerLimits l{.max_connections = 8, .unix_reserve = 2, .max_per_source = 4, .max_per_tenant = 3};
  ConnectionCaps caps;
  std::vector<ConnSlot> tcp(7);
  for (int i = 0; i < 6; ++i) {
    tcp[i] = {.network = true, .source = i < 4 ? "10.0.0.1" : "10.0.0.2"};
    EXPECT_EQ(caps.open(l, tcp[i]), "") << i;
  }
  // The network's share (8 less 2) is full; one source holds at most 4.
  tcp[6] = {.network = true, .source = "10.0.0.3"};
  EXPECT_NE(caps.open(l, tcp[6]).find("--unix-socket-reserve 2"), std::string::npos);
  ConnSlot fifth{.network = true, .source = "10.0.0.1"};
  caps.close(tcp[5]);
  EXPECT_NE(caps.open(l, fifth).find("--max-connections-per-source"), std::string::npos);
  // The operator still gets in, up to the total.
  ConnSlot u1, u2, u3;
  EXPECT_EQ(caps.open(l, u1), "");
  EXPECT_EQ(caps.open(l, u2), "");
  EXPECT_EQ(caps.open(l, tcp[5]), "");  // back in the network's share
  EXPECT_NE(caps.open(l, u3).find("--max-connections"), std::string::npos);
  // Tenants: three connections each, a fourth refused, the slot unchanged.
  for (int i = 0; i < 3; ++i) EXPECT_EQ(caps.claim(l, tcp[i], "acme"), "");
  EXPECT_NE(caps.claim(l, tcp[3], "acme").find("--max-connections-per-tenant"), std::string::npos);
  EXPECT_EQ(tcp[3].tenant, "");
  EXPECT_EQ(caps.claim(l, tcp[3], "other"), "");
  EXPECT_EQ(caps.claim(l, tcp[0], "acme"), "");  // the same tenant again: no change
  json j = caps.to_json(true);
  EXPECT_EQ(j["tenants"]["acme"], 3);
  EXPECT_EQ(j["tenants"]["other"], 1);
  EXPECT_EQ(j["sources"]["10.0.0.1"], 4);
  EXPECT_EQ(j["tcp_open"], 6);
  EXPECT_EQ(j["unix_open"], 2);
  EXPECT_EQ(j["refused_tenant_cap"], 1);
  EXPECT_EQ(j["refused_source_cap"], 1);
  EXPECT_FALSE(caps.to_json(false).contains("tenants"));
  // Closing gives everything back, once.
  caps.close(tcp[0]);
  caps.close(tcp[0]);
  EXPECT_EQ(caps.claim(l, tcp[3], "acme"), "");  // moves from other to acme
  j = caps.to_json(true);
  EXPECT_EQ(j["tenants"]["acme"], 3);
  EXPECT_FALSE(j["tenants"].contains("other"));
  EXPECT_EQ(j["tcp_open"], 5);
}

TEST(ConnectionCaps, ReserveIsAtMostHalf) {
  EXPECT_EQ((ServerLimits{.max_connections = 4, .unix_reserve = 16}).effective_reserve(), 2);
  EXPECT_EQ((ServerLimits{.max_connections = 256}).effective_reserve(), 16);
  EXPECT_EQ((ServerLimits{.max_connections = 1}).effective_reserve(), 0);
}

TEST_F(ServerTest, TrickledHeadersAreCutAtTheHeaderDeadline) {
  start({.max_connections = 8, .idle_timeout = 60s, .header_timeout = 400ms});
  int slow = connect_raw();
  send_all(slow, "GET /v1/info HTTP/1.1\r\n");
  auto t0 = std::chrono::steady_clock::now();
  std::string r;
  // A byte every 50 ms: no read waits anywhere near the idle timeout.
  while (std::chrono::steady_clock::now() - t0 < 3s) {
    if (::send(slow, "X", 1, MSG_NOSIGNAL) != 1) break;
    pollfd p{slow, POLLIN, 0};
    if (::poll(&p, 1, 50) > 0) {
      r = read_until_eof(slow);
      break;
    }
  }
  EXPECT_EQ(r.rfind("HTTP/1.1 408", 0), 0u) << r;
  EXPECT_NE(r.find("--header-timeout"), std::string::npos) << r;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  EXPECT_EQ(server_->counters()["header_timeouts"], 1);
  // A connection that says nothing is cut at the same deadline, not the idle one.
  int silent = connect_raw();
  t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(read_until_eof(silent), "");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  // Kept alive between requests, only the idle timeout applies.
  int kept = connect_raw();
  send_all(kept, "GET /v1/info HTTP/1.1\r\nHost: x\r\n\r\n");
  pollfd p{kept, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 2000), 1);
  char buf[65536];
  ASSERT_GT(::read(kept, buf, sizeof buf), 0);
  std::this_thread::sleep_for(800ms);
  send_all(kept, kInfo);
  EXPECT_EQ(read_until_eof(kept).rfind("HTTP/1.1 200", 0), 0u);
}

TEST_F(ServerTest, IdleConnectionIsClosedAfterTheTimeout) {
  start({.max_connections = 8, .idle_timeout = 300ms});
  int silent = connect_raw();
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(read_until_eof(silent), "");  // closed, nothing said
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 300ms);
  // Stopped mid-request: a 408 naming the timeout.
  int partial = connect_raw();
  send_all(partial, "GET /v1/info HTTP/1.1\r\nHo");
  std::string r = read_until_eof(partial);
  EXPECT_EQ(r.rfind("HTTP/1.1 408", 0), 0u) << r;
  EXPECT_NE(r.find("idle timeout"), std::string::npos) << r;
  // Mid-body (a stalled upload) too.
  std::string sb = client::Client(socket_).call("POST", "/v1/sandboxes", json::object())["id"];
  int upload = connect_raw();
  send_all(upload, "PUT /v1/sandboxes/" + sb +
                       "/files?path=/x HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc");
  r = read_until_eof(upload);
  EXPECT_NE(r.find("504"), std::string::npos) << r;
  EXPECT_NE(r.find("stalled"), std::string::npos) << r;
  EXPECT_GE(server_->counters()["idle_closed"].get<int>(), 3);
  // Keep-alive: idle after a complete exchange counts too.
  int keep = connect_raw();
  send_all(keep, "GET /v1/info HTTP/1.1\r\nHost: x\r\n\r\n");
  r = read_until_eof(keep);
  EXPECT_EQ(r.rfind("HTTP/1.1 200", 0), 0u) << r;
  EXPECT_EQ(r.find("<no EOF>"), std::string::npos);
}

// A declared upload over the 4 GiB limit is refused from the head alone as
// what it is (413 payload_too_large, as api/openapi.yaml documents), not as a
// malformed request.
TEST_F(ServerTest, UploadOverTheLimitIsA413) {
  start({.max_connections = 8, .idle_timeout = 5000ms});
  int fd = connect_raw();
  send_all(fd, "PUT /v1/sandboxes/sb-x/files?path=/x HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                   std::to_string((4ull << 30) + 1) + "\r\n\r\n");
  std::string r = read_until_eof(fd);
  EXPECT_EQ(r.rfind("HTTP/1.1 413", 0), 0u) << r;
  auto body = json::parse(r.substr(r.find("\r\n\r\n") + 4));
  EXPECT_EQ(body["error"]["code"], "payload_too_large");
  EXPECT_EQ(body["error"]["field"], "body");
}

// An extension answers every path under its prefix before the route table;
// what it throws is answered in the one error style; other paths still
// reach the routes.
TEST_F(ServerTest, ExtensionAnswersItsPrefix) {
  start({.max_connections = 8, .idle_timeout = 5000ms}, [](Server& s) {
    s.add_extension("/ext/", [](engine::SandboxService&, Exchange& ex, const Principal& who) {
      if (ex.path() == "/ext/fail") throw Error(Errc::not_found, "no such thing", "thing");
      if (ex.path() == "/ext/stream") {
        ex.begin_stream("application/x-ndjson");
        ex.write_chunk("{}\n");
        throw Error(Errc::internal, "broke mid-stream");
      }
      ex.send_json(200, {{"path", ex.path()}, {"operator", who.is_operator()}});
    });
  });
  auto get = [&](const std::string& path) {
    int fd = connect_raw();
    send_all(fd, "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    return read_until_eof(fd);
  };
  std::string r = get("/ext/a/b");
  ASSERT_EQ(r.rfind("HTTP/1.1 200", 0), 0u) << r;
  auto body = json::parse(r.substr(r.find("\r\n\r\n") + 4));
  EXPECT_EQ(body["path"], "/ext/a/b");
  EXPECT_EQ(body["operator"], true);  // the unix socket is the operator's door
  r = get("/ext/fail");
  ASSERT_EQ(r.rfind("HTTP/1.1 404", 0), 0u) << r;
  body = json::parse(r.substr(r.find("\r\n\r\n") + 4));
  EXPECT_EQ(body["error"]["field"], "thing");
  // A stream its handler broke off is cut (no terminating chunk), not left
  // waiting on a kept-alive connection.
  int fd = connect_raw();
  send_all(fd, "GET /ext/stream HTTP/1.1\r\nHost: x\r\n\r\n");  // keep-alive
  r = read_until_eof(fd, 3000ms);
  ASSERT_EQ(r.rfind("HTTP/1.1 200", 0), 0u) << r;
  EXPECT_EQ(r.find("<no EOF>"), std::string::npos) << r;
  EXPECT_EQ(r.find("\r\n0\r\n\r\n"), std::string::npos) << r;
  r = get("/v1/info");
  EXPECT_EQ(r.rfind("HTTP/1.1 200", 0), 0u) << r;
}

// A hook set with before_answer runs, once, before any byte of the answer
// leaves (E2B's audit record is on disk before its caller sees the answer):
// while the hook holds, the client reads nothing; a stream's head waits too.
TEST_F(ServerTest, BeforeAnswerRunsBeforeTheFirstByte) {
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::vector<int> seen;
  start({.max_connections = 8, .idle_timeout = 5000ms}, [&](Server& s) {
    s.add_extension("/ext/", [&](engine::SandboxService&, Exchange& ex, const Principal&) {
      ex.before_answer([&](int status) {
        std::unique_lock lock(mu);
        seen.push_back(status);
        cv.notify_all();
        cv.wait(lock, [&] { return release; });
      });
      if (ex.path() == "/ext/stream") {
        ex.begin_stream("text/plain");
        ex.write_chunk("x");
        ex.end_stream();
        return;
      }
      ex.send_empty(204);
      ex.send_empty(204);  // a second answer attempt does not run the hook again
    });
  });
  for (std::string path : {"/ext/plain", "/ext/stream"}) {
    release = false;
    int fd = connect_raw();
    send_all(fd, "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    size_t before = seen.size();
    {
      std::unique_lock lock(mu);
      ASSERT_TRUE(cv.wait_for(lock, 5s, [&] { return seen.size() > before; })) << path;
    }
    pollfd p{fd, POLLIN, 0};
    EXPECT_EQ(::poll(&p, 1, 200), 0) << path << ": bytes left before the hook returned";
    {
      std::lock_guard lock(mu);
      release = true;
    }
    cv.notify_all();
    std::string r = read_until_eof(fd);
    EXPECT_EQ(r.rfind(path == "/ext/plain" ? "HTTP/1.1 204" : "HTTP/1.1 200", 0), 0u) << r;
  }
  std::lock_guard lock(mu);
  EXPECT_EQ(seen, (std::vector<int>{204, 200}));
}

// Engine time is not idleness: a stream whose command is silent for longer
// than the timeout, between outputs or before its first, goes on.
TEST_F(ServerTest, ExecStreamOutlivesTheIdleTimeout) {
  start({.max_connections = 8, .idle_timeout = 200ms});
  client::Client c(socket_);
  std::string sb = c.call("POST", "/v1/sandboxes", json::object())["id"];
  int ticks = 0;
  json exit = c.exec(sb, {{"argv", {"tick", "500", "3"}}}, [&](const json& ev) {
    if (ev["type"] == "stdout") ++ticks;
  });
  EXPECT_EQ(ticks, 3);
  EXPECT_EQ(exit["exit_code"], 0);
  EXPECT_EQ(server_->counters()["idle_closed"], 0);
}

// A reader that stops taking a stream's bytes is cut (and its exec ended),
// instead of holding a thread and the exec forever.
TEST_F(ServerTest, StalledReaderIsCut) {
  start({.max_connections = 8, .idle_timeout = 300ms});
  std::string sb = client::Client(socket_).call("POST", "/v1/sandboxes", json::object())["id"];
  int fd = connect_raw();
  std::string body = R"({"argv":["flood","4096"]})";  // 256 MiB, never read
  send_all(fd, "POST /v1/sandboxes/" + sb + "/exec HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                   std::to_string(body.size()) + "\r\n\r\n" + body);
  EXPECT_TRUE(wait_counter("idle_closed", 1));
  EXPECT_TRUE(wait_counter("open", 0) || server_->counters()["open"] == 0);
  auto deadline = std::chrono::steady_clock::now() + 5s;
  while (server_->counters()["open"].get<int>() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(10ms);
  EXPECT_EQ(server_->counters()["open"], 0);  // its thread ended
}

// A second `started` (forged by the guest) must not put a second response
// head into the stream: the client sees one start, the output, the exit.
TEST_F(ServerTest, RepeatedExecStartIsIgnored) {
  start({});
  client::Client c(socket_);
  std::string sb = c.call("POST", "/v1/sandboxes", json::object())["id"];
  std::vector<json> events;
  json exit =
      c.exec(sb, {{"argv", {"start-twice"}}}, [&](const json& ev) { events.push_back(ev); });
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0]["type"], "start");
  EXPECT_EQ(events[0]["pid"], 42);
  EXPECT_EQ(events[1]["type"], "stdout");
  EXPECT_EQ(exit["exit_code"], 0);
  EXPECT_EQ(server_->counters()["duplicate_exec_starts_ignored"], 1);
  int fd = connect_raw();
  std::string body = R"({"argv":["start-twice"]})";
  send_all(fd, "POST /v1/sandboxes/" + sb +
                   "/exec HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: " +
                   std::to_string(body.size()) + "\r\n\r\n" + body);
  std::string r = read_until_eof(fd);
  EXPECT_EQ(r.find("HTTP/1.1"), 0u);
  EXPECT_EQ(r.find("HTTP/1.1", 1), std::string::npos) << r;
}

}  // namespace
}  // namespace airlock::daemon

namespace airlock::daemon {
namespace {

// Over TCP the server computes the principal: a token's tenant (Bearer or
// X-API-KEY), anonymous for an extension when there is none (a Basic
// Authorization, E2B's run-as user, is not a credential), and a 401 for
// native routes without a valid token.
TEST_F(ServerTest, TcpPrincipals) {
  char tmpl[] = "/tmp/airlock-auth-XXXXXX";
  std::filesystem::path data = ::mkdtemp(tmpl);
  auth::Auth auth(data);
  std::string secret = auth.tokens().create("acme", 0, auth::TokenFormat::e2b).secret;
  int port = 0;
  start({.max_connections = 8, .idle_timeout = 5000ms}, [&](Server& s) {
    s.set_auth(&auth);
    s.listen(parse_listen("127.0.0.1:0"), nullptr);
    port = s.tcp_ports().at(0);
    s.add_extension("/ext/", [](engine::SandboxService&, Exchange& ex, const Principal& who) {
      const char* kind = who.kind == Principal::Kind::tenant      ? "tenant"
                         : who.kind == Principal::Kind::anonymous ? "anonymous"
                                                                  : "operator";
      ex.send_json(200, {{"kind", kind}, {"tenant", who.tenant}, {"token", who.token_id}});
    });
  });
  auto get = [&](const std::string& path, const std::string& headers) {
    int fd = connect_tcp(port);
    send_all(fd,
             "GET " + path + " HTTP/1.1\r\nHost: x\r\n" + headers + "Connection: close\r\n\r\n");
    return read_until_eof(fd);
  };
  auto body = [](const std::string& r) { return json::parse(r.substr(r.find("\r\n\r\n") + 4)); };
  std::string r = get("/ext/x", "Authorization: Bearer " + secret + "\r\n");
  ASSERT_EQ(r.rfind("HTTP/1.1 200", 0), 0u) << r;
  EXPECT_EQ(body(r)["kind"], "tenant");
  EXPECT_EQ(body(r)["tenant"], "acme");
  r = get("/ext/x", "X-API-KEY: " + secret + "\r\n");
  EXPECT_EQ(body(r)["tenant"], "acme");
  r = get("/ext/x", "Authorization: Basic dXNlcjo=\r\n");
  EXPECT_EQ(body(r)["kind"], "anonymous");
  r = get("/ext/x", "");
  EXPECT_EQ(body(r)["kind"], "anonymous");
  r = get("/v1/info", "Authorization: Basic dXNlcjo=\r\n");
  ASSERT_EQ(r.rfind("HTTP/1.1 401", 0), 0u) << r;
  EXPECT_EQ(body(r)["error"]["code"], "unauthenticated");
  r = get("/v1/info", "Authorization: bearer " + secret + "\r\n");  // the scheme is case-blind
  EXPECT_EQ(r.rfind("HTTP/1.1 200", 0), 0u) << r;
  server_->stop();
  thread_.join();
  server_.reset();
  std::filesystem::remove_all(data);
}

// Who may call a route is its row's Access, checked before its handler runs:
// a tenant meets every operator route as one that does not exist, and every
// route on another tenant's sandbox as if the sandbox did not exist (and
// nothing happens to it); its own sandbox it reaches.
TEST_F(ServerTest, TenantMeetsEachRowsAccessBeforeItsHandler) {
  char tmpl[] = "/tmp/airlock-auth-XXXXXX";
  std::filesystem::path data = ::mkdtemp(tmpl);
  auth::Auth auth(data);
  std::string secret = auth.tokens().create("acme", 0, auth::TokenFormat::airlock).secret;
  int port = 0;
  start({.max_connections = 8, .idle_timeout = 5000ms}, [&](Server& s) {
    s.set_auth(&auth);
    s.listen(parse_listen("127.0.0.1:0"), nullptr);
    port = s.tcp_ports().at(0);
  });
  engine::SandboxSpec spec;
  spec.tenant = "other";
  const std::string theirs = engine_->create(spec).id;
  spec.tenant = "acme";
  const std::string own = engine_->create(spec).id;
  auto ask = [&](const std::string& method, const std::string& path) {
    int fd = connect_tcp(port);
    send_all(fd, method + " " + path + " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + secret +
                     "\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    return read_until_eof(fd);
  };
  auto body = [](const std::string& r) {
    return json::parse(r.substr(r.find("\r\n\r\n") + 4), nullptr, false);
  };
  auto fill = [](std::string path, const std::string& id) {
    for (auto [from, to] : {std::pair<std::string, std::string>{"{id}", id},
                            {"{exec_id}", "ex1"},
                            {"{host_port}", "8080"}})
      if (auto pos = path.find(from); pos != std::string::npos) path.replace(pos, from.size(), to);
    return path;
  };
  int checked = 0;
  for (const auto& row : routes()) {
    std::string op = std::string(row.method) + " " + row.path;
    if (row.access == Access::operator_only) {
      std::string path = fill(row.path, "x1");
      std::string r = ask(row.method, path);
      EXPECT_EQ(r.rfind("HTTP/1.1 404", 0), 0u) << op << ": " << r;
      EXPECT_EQ(body(r)["error"]["message"], "no route for " + std::string(row.method) + " " + path)
          << op;
      ++checked;
    } else if (row.access == Access::own_sandbox) {
      std::string r = ask(row.method, fill(row.path, theirs));
      EXPECT_EQ(r.rfind("HTTP/1.1 404", 0), 0u) << op << ": " << r;
      EXPECT_EQ(body(r)["error"]["message"], "no sandbox " + theirs) << op;
      ++checked;
    }
  }
  EXPECT_GT(checked, 40);
  EXPECT_EQ(engine_->get(theirs).state, engine::State::running);  // not deleted, not paused
  std::string r = ask("GET", "/v1/sandboxes/" + own);
  EXPECT_EQ(r.rfind("HTTP/1.1 200", 0), 0u) << r;
  r = ask("DELETE", "/v1/sandboxes/" + theirs);
  EXPECT_EQ(r.rfind("HTTP/1.1 404", 0), 0u) << r;
  server_->stop();
  thread_.join();
  server_.reset();
  std::filesystem::remove_all(data);
}

}  // namespace
}  // namespace airlock::daemon

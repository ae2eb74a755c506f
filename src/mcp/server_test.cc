// The MCP server's protocol and tools against airlockd's real HTTP layer over
// a real unix socket, with the fake engine of src/daemon (everything but the
// VM). tests/mcp drives `airlock mcp` against real VMs with the official SDK.
#include "daemon/server.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <thread>

#include "client/client.h"
#include "daemon/fake_service_test_support.h"
#include "mcp/guardian.h"
#include "mcp/modern.h"
#include "mcp/protocol.h"
#include "mcp/session.h"
#include "mcp/stdio.h"

namespace airlock::mcp {
namespace {

using nlohmann::json;

class McpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/airlock-mcp-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    socket_ = dir_ / "d.sock";
    server_ = std::make_unique<daemon::Server>(socket_);
    server_->bind();
    engine_ = std::make_unique<daemon::FakeSandboxService>();
    thread_ = std::thread([this] { server_->run(*engine_); });
    session_ = std::make_unique<Session>(client::Client(socket_));
    protocol_ = std::make_unique<Protocol>(*session_);
  }
  void TearDown() override {
    server_->stop();
    thread_.join();
    std::filesystem::remove_all(dir_);
  }

  json request(const std::string& method, json params = json::object(), json id = 7) {
    auto reply =
        protocol_->handle({{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", params}});
    EXPECT_TRUE(reply);
    EXPECT_EQ((*reply)["id"], id);
    return reply ? *reply : json();
  }
  json call(const std::string& tool, json args) {
    json r = request("tools/call", {{"name", tool}, {"arguments", args}});
    EXPECT_TRUE(r.contains("result")) << r.dump();
    return r["result"];
  }
  std::string text(const json& result) { return result["content"][0]["text"]; }

  std::filesystem::path dir_, socket_;
  std::unique_ptr<daemon::Server> server_;
  std::unique_ptr<engine::SandboxService> engine_;
  std::thread thread_;
  std::unique_ptr<Session> session_;
  std::unique_ptr<Protocol> protocol_;
};

TEST(Guardian, SessionTagsAreUnique) {
  std::string a = new_session_tag(), b = new_session_tag();
  EXPECT_NE(a, b);
  EXPECT_EQ(a.rfind("mcp-" + std::to_string(::getpid()) + "-", 0), 0u);
}

TEST(Negotiation, ClientVersionIfSupportedElseTheLatest) {
  EXPECT_EQ(negotiate_version("2025-11-25"), "2025-11-25");
  EXPECT_EQ(negotiate_version("2025-06-18"), "2025-06-18");
  EXPECT_EQ(negotiate_version("2025-03-26"), "2025-03-26");
  EXPECT_EQ(negotiate_version("2024-11-05"), "2025-11-25");
  EXPECT_EQ(negotiate_version("2099-01-01"), "2025-11-25");
}

TEST_F(McpTest, InitializeAnswersCapabilitiesAndTheNegotiatedVersion) {
  json r = request("initialize", {{"protocolVersion", "2025-06-18"},
                                  {"capabilities", json::object()},
                                  {"clientInfo", {{"name", "t"}, {"version", "1"}}}});
  EXPECT_EQ(r["result"]["protocolVersion"], "2025-06-18");
  EXPECT_TRUE(r["result"]["capabilities"].contains("tools"));
  EXPECT_EQ(r["result"]["serverInfo"]["name"], "airlock");
  json bad = request("initialize", {{"capabilities", json::object()}});
  EXPECT_EQ(bad["error"]["code"], kInvalidParams);
}

TEST_F(McpTest, ProtocolErrorsFollowJsonRpc) {
  EXPECT_EQ((*protocol_->handle_line("{nope"))["error"]["code"], kParseError);
  EXPECT_EQ((*protocol_->handle_line("[]"))["error"]["code"], kInvalidRequest);
  EXPECT_EQ((*protocol_->handle_line("3"))["error"]["code"], kInvalidRequest);
  EXPECT_EQ(
      (*protocol_->handle_line(R"({"jsonrpc":"1.0","id":1,"method":"ping"})"))["error"]["code"],
      kInvalidRequest);
  EXPECT_EQ(request("resources/list")["error"]["code"], kMethodNotFound);
  EXPECT_EQ(request("tools/call", {{"name", "no_such_tool"}})["error"]["code"], kInvalidParams);
  EXPECT_EQ(request("tools/call", {{"arguments", json::object()}})["error"]["code"],
            kInvalidParams);
  EXPECT_EQ(request("tools/call", {{"name", "sandbox_list"}, {"arguments", 3}})["error"]["code"],
            kInvalidParams);
  EXPECT_EQ(request("ping", json::object(), "abc")["result"], json::object());
  // Notifications and the client's own responses get no reply.
  EXPECT_FALSE(protocol_->handle_line(R"({"jsonrpc":"2.0","method":"notifications/initialized"})"));
  EXPECT_FALSE(protocol_->handle_line(R"({"jsonrpc":"2.0","id":3,"result":{}})"));
  // A 2025-03-26 batch: one reply per request, none for the notification.
  auto batch = protocol_->handle_line(
      R"([{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","method":"x"},)"
      R"({"jsonrpc":"2.0","id":2,"method":"nope"}])");
  ASSERT_TRUE(batch && batch->is_array());
  ASSERT_EQ(batch->size(), 2u);
  EXPECT_EQ((*batch)[1]["error"]["code"], kMethodNotFound);
}

TEST_F(McpTest, ToolsListHasEveryToolAndLegacyClientsGetNoOutputSchema) {
  json r = request("tools/list");
  std::set<std::string> names;
  for (const auto& t : r["result"]["tools"]) {
    names.insert(t["name"]);
    EXPECT_TRUE(t.contains("outputSchema"));
  }
  EXPECT_EQ(names,
            (std::set<std::string>{"sandbox_create", "sandbox_exec", "sandbox_write_file",
                                   "sandbox_read_file", "sandbox_list_files", "sandbox_set_network",
                                   "sandbox_logs", "sandbox_destroy", "sandbox_list"}));
  EXPECT_FALSE(r["result"].contains("nextCursor"));
  request("initialize", {{"protocolVersion", "2025-03-26"}});
  for (const auto& t : request("tools/list")["result"]["tools"])
    EXPECT_FALSE(t.contains("outputSchema"));
  json listed = call("sandbox_list", json::object());
  EXPECT_FALSE(listed.contains("structuredContent"));
}

// A 2026-07-28 request: the revision and capabilities in params._meta.
json stateless(json params = json::object()) {
  params["_meta"] = {{"io.modelcontextprotocol/protocolVersion", "2026-07-28"},
                     {"io.modelcontextprotocol/clientCapabilities", json::object()}};
  return params;
}

TEST_F(McpTest, StatelessRequestsNeedNoInitialize) {
  json d = request("server/discover", stateless());
  EXPECT_EQ(d["result"]["supportedVersions"], json({"2026-07-28"}));
  EXPECT_EQ(d["result"]["resultType"], "complete");
  EXPECT_EQ(d["result"]["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "airlock");
  json tools = request("tools/list", stateless())["result"];
  EXPECT_EQ(tools["resultType"], "complete");
  EXPECT_EQ(tools["cacheScope"], "private");
  EXPECT_EQ(tools["tools"].size(), 9u);
  json created = request("tools/call", stateless({{"name", "sandbox_create"}}))["result"];
  ASSERT_FALSE(created["isError"]) << created.dump();
  EXPECT_EQ(created["resultType"], "complete");
  std::string id = created["structuredContent"]["id"];
  EXPECT_EQ(session_->owned(), std::vector<std::string>{id});
  // Stateless: nothing was negotiated for the connection.
  EXPECT_EQ(protocol_->version(), "");
  // 2026-07-28 has no ping; the handshake revisions keep theirs.
  EXPECT_EQ(request("ping", stateless())["error"]["code"], kMethodNotFound);
  EXPECT_EQ(request("ping")["result"], json::object());
}

TEST_F(McpTest, StatelessRequestsWithABadEnvelopeRunNothing) {
  json p = stateless({{"name", "sandbox_create"}});
  p["_meta"]["io.modelcontextprotocol/protocolVersion"] = "2030-01-01";
  json r = request("tools/call", p);
  EXPECT_EQ(r["error"]["code"], kUnsupportedProtocolVersion);
  EXPECT_EQ(r["error"]["data"]["requested"], "2030-01-01");
  EXPECT_EQ(r["error"]["data"]["supported"][0], "2026-07-28");
  p = stateless({{"name", "sandbox_create"}});
  p["_meta"].erase("io.modelcontextprotocol/clientCapabilities");
  EXPECT_EQ(request("tools/call", p)["error"]["code"], kInvalidParams);
  EXPECT_TRUE(session_->owned().empty());
  EXPECT_EQ(request("server/discover")["error"]["code"], kMethodNotFound);  // needs _meta
}

TEST_F(McpTest, HandshakeAndStatelessRequestsShareAConnection) {
  request("initialize", {{"protocolVersion", "2025-03-26"}});
  // The 2025-03-26 session drops outputSchema; a 2026 request on the same
  // pipe still gets the full tools, and initialize still negotiates.
  for (const auto& t : request("tools/list", stateless())["result"]["tools"])
    EXPECT_TRUE(t.contains("outputSchema"));
  EXPECT_FALSE(request("tools/list")["result"].contains("resultType"));
  json i = request("initialize", stateless({{"protocolVersion", "2026-07-28"}}));
  EXPECT_EQ(i["result"]["protocolVersion"], "2025-11-25");  // not a handshake revision
}

TEST_F(McpTest, ToolsRunAgainstTheDaemon) {
  json created = call("sandbox_create", {{"metadata", {{"task", "t-1"}}}});
  ASSERT_FALSE(created["isError"]) << created.dump();
  std::string id = created["structuredContent"]["id"];
  EXPECT_EQ(created["structuredContent"]["keep"], false);
  EXPECT_EQ(session_->owned(), std::vector<std::string>{id});

  json ran = call("sandbox_exec", {{"sandbox_id", id}, {"argv", {"echo", "hi", "there"}}});
  ASSERT_FALSE(ran["isError"]) << ran.dump();
  EXPECT_EQ(ran["structuredContent"]["stdout"], "hi there\n");
  EXPECT_EQ(ran["structuredContent"]["exit_code"], 0);
  EXPECT_EQ(ran["structuredContent"]["stdout_truncated"], false);
  EXPECT_NE(text(ran).find("hi there"), std::string::npos);

  // Output that is not UTF-8 arrives with the bad bytes replaced, as valid JSON.
  json bytes = call("sandbox_exec", {{"sandbox_id", id}, {"argv", {"bytes"}}});
  EXPECT_EQ(bytes["structuredContent"]["stderr"], "err");
  EXPECT_NO_THROW(bytes.dump());

  json code = call("sandbox_exec", {{"sandbox_id", id}, {"argv", {"exit", "3"}}});
  EXPECT_FALSE(code["isError"]);  // the tool worked; the command failed
  EXPECT_EQ(code["structuredContent"]["exit_code"], 3);

  json in = call("sandbox_exec", {{"sandbox_id", id}, {"argv", {"cat"}}, {"stdin", "fed"}});
  EXPECT_EQ(in["structuredContent"]["stdout"], "fed");

  json wrote = call(
      "sandbox_write_file",
      {{"sandbox_id", id}, {"path", "/tmp/a"}, {"content", "AAEC/w=="}, {"encoding", "base64"}});
  ASSERT_FALSE(wrote["isError"]) << wrote.dump();
  EXPECT_EQ(wrote["structuredContent"]["bytes"], 4);
  json read = call("sandbox_read_file", {{"sandbox_id", id}, {"path", "/tmp/a"}});
  EXPECT_EQ(read["structuredContent"]["encoding"], "base64");  // not UTF-8
  EXPECT_EQ(read["structuredContent"]["content"], "AAEC/w==");
  call("sandbox_write_file", {{"sandbox_id", id}, {"path", "/tmp/t"}, {"content", "hello world"}});
  json part = call("sandbox_read_file", {{"sandbox_id", id}, {"path", "/tmp/t"}, {"max_bytes", 5}});
  EXPECT_EQ(part["structuredContent"]["content"], "hello");
  EXPECT_EQ(part["structuredContent"]["truncated"], true);

  json ls = call("sandbox_list_files", {{"sandbox_id", id}, {"path", "/tmp"}});
  ASSERT_FALSE(ls["isError"]) << ls.dump();
  EXPECT_EQ(ls["structuredContent"]["entries"][0]["name"], "a");

  json logs = call("sandbox_logs", {{"sandbox_id", id}});
  ASSERT_FALSE(logs["isError"]) << logs.dump();
  EXPECT_GE(logs["structuredContent"]["total"], 1);

  json list = call("sandbox_list", {{"metadata", {{"task", "t-1"}}}});
  ASSERT_EQ(list["structuredContent"]["sandboxes"].size(), 1u);
  EXPECT_EQ(
      call("sandbox_list", {{"metadata", {{"task", "other"}}}})["structuredContent"]["sandboxes"]
          .size(),
      0u);

  json gone = call("sandbox_destroy", {{"sandbox_id", id}});
  EXPECT_FALSE(gone["isError"]);
  EXPECT_TRUE(session_->owned().empty());
}

TEST_F(McpTest, FailuresAreToolResultsNamingTheDaemonsCodeAndField) {
  json r = call("sandbox_exec", {{"sandbox_id", "sb-nope"}, {"command", "true"}});
  EXPECT_EQ(r["isError"], true);
  EXPECT_NE(text(r).find("not_found"), std::string::npos) << text(r);
  r = call("sandbox_create", {{"image", "nonexistent"}});
  EXPECT_EQ(r["isError"], true);
  EXPECT_NE(text(r).find("field image"), std::string::npos) << text(r);
  r = call("sandbox_exec", {{"sandbox_id", "sb-1"}, {"argv", {"ls"}}, {"command", "ls"}});
  EXPECT_EQ(r["isError"], true);
  EXPECT_NE(text(r).find("exactly one of argv and command"), std::string::npos);
  r = call("sandbox_exec", {{"sandbox_id", "sb-1"}, {"argv", "ls"}});
  EXPECT_EQ(r["isError"], true);
  EXPECT_NE(text(r).find("argv must be an array"), std::string::npos);
  r = call("sandbox_write_file",
           {{"sandbox_id", "sb-1"}, {"path", "/a"}, {"content", "!!"}, {"encoding", "base64"}});
  EXPECT_NE(text(r).find("not valid base64"), std::string::npos);
  // A daemon that is not there is a tool error too, not a dead server.
  Session nowhere(client::Client(dir_ / "none.sock"));
  r = nowhere.call("sandbox_list", json::object());
  EXPECT_EQ(r["isError"], true);
  EXPECT_NE(text(r).find("unavailable"), std::string::npos);
}

TEST_F(McpTest, CloseDestroysWhatItCreatedButNotKeptOnes) {
  std::string mine = call("sandbox_create", json::object())["structuredContent"]["id"];
  std::string kept = call("sandbox_create", {{"keep", true}})["structuredContent"]["id"];
  session_->close();
  EXPECT_EQ(engine_->get(mine).state, engine::State::deleted);
  EXPECT_EQ(engine_->get(kept).state, engine::State::running);
  // After close, a create cannot leave anything behind.
  json late = call("sandbox_create", json::object());
  EXPECT_EQ(late["isError"], true);
  EXPECT_EQ(engine_->list({}, false).size(), 1u);
}

TEST_F(McpTest, ServeOverPipesAnswersEachLineAndCleansUpAtEof) {
  int in[2], out[2];
  ASSERT_EQ(::pipe(in), 0);
  ASSERT_EQ(::pipe(out), 0);
  Session session{client::Client(socket_)};
  int rc = -1;
  std::thread server([&] { rc = serve(session, in[0], out[1]); });
  auto send = [&](const std::string& text) {
    ASSERT_EQ(::write(in[1], text.data(), text.size()), ssize_t(text.size()));
  };
  std::map<int, json> replies;
  std::string output;
  auto read_until = [&](size_t count) {
    char buf[4096];
    while (replies.size() < count) {
      ssize_t n = ::read(out[0], buf, sizeof buf);
      ASSERT_GT(n, 0);
      output.append(buf, size_t(n));
      for (size_t nl; (nl = output.find('\n')) != std::string::npos; output.erase(0, nl + 1)) {
        json j = json::parse(output.substr(0, nl));
        replies[j["id"].get<int>()] = j;
      }
    }
  };
  send(R"({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25"}})"
       "\n");
  send(R"({"jsonrpc":"2.0","method":"notifications/initialized"})"
       "\n");
  // One message split across writes, then two in one write.
  send(R"({"jsonrpc":"2.0","id":2,"method":"tools/call",)");
  send(R"("params":{"name":"sandbox_create","arguments":{}}})"
       "\n"
       R"({"jsonrpc":"2.0","id":3,"method":"ping"})"
       "\n");
  read_until(3);
  EXPECT_EQ(replies[1]["result"]["protocolVersion"], "2025-11-25");
  EXPECT_EQ(replies[3]["result"], json::object());
  std::string id = replies[2]["result"]["structuredContent"]["id"];
  EXPECT_EQ(engine_->get(id).state, engine::State::running);
  send(R"({"jsonrpc":"2.0","id":4,"method":"ping"})");  // a last line without a newline
  ::close(in[1]);
  server.join();
  read_until(4);
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(engine_->get(id).state, engine::State::deleted);  // destroyed at EOF
  ::close(in[0]);
  ::close(out[0]);
  ::close(out[1]);
}

TEST_F(McpTest, CancelledCallKillsItsCommandAndGetsNoReply) {
  std::string id = call("sandbox_create", json::object())["structuredContent"]["id"];
  std::optional<json> reply;
  std::atomic<bool> done{false};
  json args = {{"sandbox_id", id}, {"argv", {"hang"}}};
  json request = {{"jsonrpc", "2.0"},
                  {"id", 41},
                  {"method", "tools/call"},
                  {"params", {{"name", "sandbox_exec"}, {"arguments", args}}}};
  std::thread caller([&] {
    reply = protocol_->handle(request);
    done = true;
  });
  // Until the command has started there is nothing to kill: retry.
  json cancel = {{"jsonrpc", "2.0"},
                 {"method", "notifications/cancelled"},
                 {"params", {{"requestId", 41}, {"reason", "user"}}}};
  for (int i = 0; i < 500 && !done; ++i) {
    EXPECT_FALSE(protocol_->handle(cancel));  // a notification: no reply of its own
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(done) << "the cancelled command was not killed";
  caller.join();
  EXPECT_FALSE(reply) << reply->dump();  // no response to a cancelled request
  EXPECT_FALSE(session_->cancel("41"));  // nothing runs under that id any more
}

TEST_F(McpTest, GuardianDestroysWhatIsStillOwnedWhenThePipeCloses) {
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  std::string a = call("sandbox_create", json::object())["structuredContent"]["id"];
  std::string b = call("sandbox_create", json::object())["structuredContent"]["id"];
  std::string text = "+" + a + "\n+" + b + "\n-" + b + "\n+sb-already-gone\n";
  ASSERT_EQ(::write(p[1], text.data(), text.size()), ssize_t(text.size()));
  // Created under the session's label but never reported (the server died
  // before its create returned): found by the label.
  Session tagged(client::Client(socket_), "mcp-test-tag");
  std::string c = tagged.call("sandbox_create", json::object())["structuredContent"]["id"];
  std::string k = tagged.call("sandbox_create", {{"keep", true}})["structuredContent"]["id"];
  ::close(p[1]);  // the server died
  EXPECT_EQ(guard_until_eof(p[0], socket_, "mcp-test-tag"), 2);
  EXPECT_EQ(engine_->get(a).state, engine::State::deleted);
  EXPECT_EQ(engine_->get(b).state, engine::State::running);
  EXPECT_EQ(engine_->get(c).state, engine::State::deleted);
  EXPECT_EQ(engine_->get(k).state, engine::State::running);  // keep: true has no label
}

TEST_F(McpTest, SessionTellsItsObserverWhatItOwns) {
  std::vector<std::string> seen;
  session_->set_observer(
      [&](const std::string& id, bool owned) { seen.push_back((owned ? "+" : "-") + id); });
  std::string a = call("sandbox_create", json::object())["structuredContent"]["id"];
  std::string b = call("sandbox_create", json::object())["structuredContent"]["id"];
  call("sandbox_create", {{"keep", true}});
  call("sandbox_destroy", {{"sandbox_id", a}});
  session_->close();
  EXPECT_EQ(seen, (std::vector<std::string>{"+" + a, "+" + b, "-" + a, "-" + b}));
}

// On the unix socket the daemon would show every tenant's sandboxes: the
// session acts only on those it created (kept ones too), unless --all.
TEST_F(McpTest, ActsOnlyOnSandboxesItCreatedUnlessAll) {
  std::string foreign = engine_->create(engine::SandboxSpec{}).id;
  std::string kept = call("sandbox_create", {{"keep", true}})["structuredContent"]["id"];
  for (auto [tool, args] : std::vector<std::pair<std::string, json>>{
           {"sandbox_exec", {{"argv", {"echo", "x"}}}},
           {"sandbox_write_file", {{"path", "/tmp/x"}, {"content", "x"}}},
           {"sandbox_read_file", {{"path", "/tmp/x"}}},
           {"sandbox_list_files", {{"path", "/tmp"}}},
           {"sandbox_set_network", {{"mode", "none"}}},
           {"sandbox_logs", json::object()},
           {"sandbox_destroy", json::object()}}) {
    args["sandbox_id"] = foreign;
    json r = call(tool, args);
    EXPECT_EQ(r["isError"], true) << tool;
    EXPECT_NE(text(r).find("error not_found: no sandbox " + foreign), std::string::npos)
        << tool << ": " << text(r);
  }
  EXPECT_EQ(engine_->get(foreign).state, engine::State::running);  // untouched
  json listed = call("sandbox_list", json::object())["structuredContent"]["sandboxes"];
  ASSERT_EQ(listed.size(), 1u) << listed.dump();
  EXPECT_EQ(listed[0]["id"], kept);
  // A kept sandbox is still this session's to use.
  EXPECT_FALSE(call("sandbox_exec", {{"sandbox_id", kept}, {"argv", {"echo", "k"}}})["isError"]);

  Session all(client::Client(socket_), "", Session::Scope::all);
  json ran = all.call("sandbox_exec", {{"sandbox_id", foreign}, {"argv", {"echo", "hi"}}});
  EXPECT_FALSE(ran["isError"]) << ran.dump();
  EXPECT_EQ(all.call("sandbox_list", json::object())["structuredContent"]["sandboxes"].size(), 2u);
  EXPECT_FALSE(all.call("sandbox_destroy", {{"sandbox_id", foreign}})["isError"]);
  EXPECT_EQ(engine_->get(foreign).state, engine::State::deleted);
}

}  // namespace
}  // namespace airlock::mcp

// The E2B control plane through the real Server (unix socket) with the fake
// engine. The principal normally comes from the TCP listener's token; here
// a test-only extension wrapper takes it from an X-Test-Tenant header, so
// tenant isolation is checked without a listener (the SDK test in
// tests/e2b does it with real tokens).
#include "e2b/api.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "auth/auth.h"
#include "daemon/fake_service_test_support.h"
#include "daemon/server.h"
#include "daemon/tenancy.h"

namespace airlock::e2b {
namespace {

using nlohmann::json;

struct Reply {
  int status = 0;
  std::string headers;
  json body;
};

class E2bApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/airlock-e2bapi-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    server_ = std::make_unique<daemon::Server>(dir_ / "d.sock", daemon::ServerLimits{});
    server_->bind();
    auto tokens = std::make_shared<const AccessTokens>(AccessTokens::from_key("test-key"));
    server_->add_extension("/e2b/api/",
                           [api = Api(tokens)](engine::SandboxService& e, daemon::Exchange& ex,
                                               const daemon::Principal& op) {
                             daemon::Principal who = op;
                             auto it = ex.request().find("X-Test-Tenant");
                             if (it != ex.request().end()) {
                               std::string t(it->value());
                               who = daemon::Principal{};
                               who.kind = t == "anonymous" ? daemon::Principal::Kind::anonymous
                                                           : daemon::Principal::Kind::tenant;
                               if (t != "anonymous") who.tenant = t;
                             }
                             api.serve(e, ex, who);
                           });
    engine_ = std::make_unique<daemon::FakeSandboxService>();
    thread_ = std::thread([this] { server_->run(*engine_); });
  }
  void TearDown() override {
    server_->stop();
    thread_.join();
    std::filesystem::remove_all(dir_);
  }

  Reply call(const std::string& method, const std::string& path, const std::string& body = "",
             const std::string& tenant = "") {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, (dir_ / "d.sock").c_str(), sizeof addr.sun_path - 1);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    std::string req = method + " /e2b/api" + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n";
    if (!tenant.empty()) req += "X-Test-Tenant: " + tenant + "\r\n";
    if (!body.empty())
      req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
             "\r\n";
    req += "\r\n" + body;
    EXPECT_EQ(::send(fd, req.data(), req.size(), MSG_NOSIGNAL), ssize_t(req.size()));
    std::string out;
    char buf[4096];
    for (;;) {
      ssize_t n = ::read(fd, buf, sizeof buf);
      if (n <= 0) break;
      out.append(buf, size_t(n));
    }
    ::close(fd);
    Reply r;
    r.status = std::stoi(out.substr(9, 3));
    size_t split = out.find("\r\n\r\n");
    r.headers = out.substr(0, split);
    std::string rest = out.substr(split + 4);
    if (!rest.empty()) r.body = json::parse(rest);
    return r;
  }
  std::string create(const std::string& tenant, const std::string& extra = "") {
    Reply r = call("POST", "/v2/sandboxes", R"({"templateID":"minimal","timeout":60)" + extra + "}",
                   tenant);
    EXPECT_EQ(r.status, 201) << r.body.dump();
    return r.body.value("sandboxID", "");
  }

  std::filesystem::path dir_;
  std::unique_ptr<daemon::Server> server_;
  std::unique_ptr<engine::SandboxService> engine_;
  std::thread thread_;
};

TEST_F(E2bApiTest, CreateGetListTimeoutKillAsTheSdkSeesThem) {
  Reply r = call(
      "POST", "/v2/sandboxes",
      R"({"templateID":"minimal","timeout":60,"metadata":{"run":"a"},"envVars":{"X":"1"}})", "t1");
  ASSERT_EQ(r.status, 201) << r.body.dump();
  std::string id = r.body["sandboxID"];
  EXPECT_EQ(r.body["templateID"], "minimal");
  EXPECT_EQ(r.body["envdVersion"], "0.5.7");
  // v2 sandboxes are secure: a per-sandbox token, the same again on connect.
  std::string token = r.body["envdAccessToken"];
  EXPECT_EQ(token, AccessTokens::from_key("test-key").token_for(id));
  // The engine got the spec, with the E2B facts kept under e2b.*.
  engine::SandboxInfo info = engine_->get(id);
  EXPECT_EQ(info.spec.tenant, "t1");
  EXPECT_EQ(info.spec.env.at("X"), "1");
  EXPECT_EQ(info.spec.metadata.at("e2b.template"), "minimal");
  EXPECT_EQ(info.spec.network["mode"], "open");

  r = call("GET", "/sandboxes/" + id, "", "t1");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.body["metadata"], json::parse(R"({"run":"a"})"));  // e2b.* hidden
  EXPECT_EQ(r.body["state"], "running");

  r = call("POST", "/sandboxes/" + id + "/timeout", R"({"timeout":5})", "t1");
  EXPECT_EQ(r.status, 204);
  EXPECT_EQ(engine_->get(id).spec.timeout_s, 5);
  r = call("POST", "/sandboxes/" + id + "/timeout", R"({"timeout":-1})", "t1");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body["code"], 400);

  r = call("POST", "/v2/sandboxes/" + id + "/connect", R"({"timeout":30})", "t1");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.body["envdAccessToken"], token);

  r = call("POST", "/sandboxes/" + id + "/pause", "{}", "t1");
  EXPECT_EQ(r.status, 501);
  EXPECT_NE(r.body["message"].get<std::string>().find("pause"), std::string::npos);

  r = call("DELETE", "/sandboxes/" + id, "", "t1");
  EXPECT_EQ(r.status, 204);
  // Gone: the SDK's kill() reads 404 as "was not there".
  r = call("DELETE", "/sandboxes/" + id, "", "t1");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.body["code"], 404);
  r = call("GET", "/sandboxes/" + id, "", "t1");
  EXPECT_EQ(r.status, 404);
}

TEST_F(E2bApiTest, AnotherTenantsSandboxIsNotFoundEverywhere) {
  std::string id = create("t1", R"(,"metadata":{"k":"v"})");
  for (auto [method, path, body] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"GET", "/sandboxes/" + id, ""},
           {"DELETE", "/sandboxes/" + id, ""},
           {"POST", "/sandboxes/" + id + "/timeout", R"({"timeout":9})"},
           {"POST", "/v2/sandboxes/" + id + "/connect", "{}"},
           {"POST", "/sandboxes/" + id + "/pause", "{}"}}) {
    Reply r = call(method, path, body, "t2");
    EXPECT_EQ(r.status, 404) << method << " " << path;
  }
  Reply r = call("GET", "/v2/sandboxes?metadata=k%3Dv", "", "t2");
  EXPECT_EQ(r.body, json::array());
  r = call("GET", "/v2/sandboxes?metadata=k%3Dv", "", "t1");
  ASSERT_EQ(r.body.size(), 1u);
  EXPECT_EQ(engine_->get(id).state, engine::State::running);  // untouched
  EXPECT_EQ(engine_->get(id).spec.timeout_s, 60);
  // No key at all: E2B's 401.
  r = call("GET", "/v2/sandboxes", "", "anonymous");
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(r.body["code"], 401);
}

TEST_F(E2bApiTest, ListFiltersByMetadataAndStateAndPages) {
  for (int i = 0; i < 5; ++i)
    create("t1", R"(,"metadata":{"batch":"b","i":")" + std::to_string(i) + "\"}");
  create("t1", R"(,"metadata":{"batch":"other"})");
  Reply r = call("GET", "/v2/sandboxes?metadata=batch%3Db&limit=2", "", "t1");
  ASSERT_EQ(r.status, 200);
  std::set<std::string> seen;
  int pages = 0;
  for (;;) {
    ++pages;
    for (const auto& s : r.body) {
      EXPECT_EQ(s["metadata"]["batch"], "b");
      EXPECT_TRUE(seen.insert(s["sandboxID"]).second) << "listed twice";
    }
    auto at = r.headers.find("x-next-token: ");
    if (at == std::string::npos) break;
    std::string token = r.headers.substr(at + 14, r.headers.find("\r\n", at) - at - 14);
    r = call("GET", "/v2/sandboxes?metadata=batch%3Db&limit=2&nextToken=" + token, "", "t1");
    ASSERT_EQ(r.status, 200);
  }
  EXPECT_EQ(seen.size(), 5u);
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(call("GET", "/v2/sandboxes?state=paused", "", "t1").body, json::array());
  EXPECT_EQ(call("GET", "/v2/sandboxes?state=running", "", "t1").body.size(), 6u);
  EXPECT_EQ(call("GET", "/sandboxes", "", "t1").body.size(), 6u);  // the v1 route
  EXPECT_EQ(call("GET", "/v2/sandboxes?state=dead", "", "t1").status, 400);
  EXPECT_EQ(call("GET", "/v2/sandboxes?limit=0", "", "t1").status, 400);
  EXPECT_EQ(call("GET", "/v2/sandboxes?nextToken=garbage", "", "t1").status, 400);
}

TEST_F(E2bApiTest, BadCreatesNameTheFieldAndCreateNothing) {
  Reply r = call("POST", "/sandboxes", R"({"templateID":"minimal","autoPause":true})", "t1");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body["message"].get<std::string>().find("autoPause"), std::string::npos);
  r = call("POST", "/sandboxes", R"({"templateID":"no-such-image"})", "t1");
  EXPECT_GE(r.status, 400);
  EXPECT_NE(r.body["message"].get<std::string>().find("no-such-image"), std::string::npos);
  r = call("POST", "/sandboxes", "not json", "t1");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(engine_->list().size(), 0u);
  // v1 route: secure unless the operator allows otherwise.
  r = call("POST", "/sandboxes", R"({"templateID":"minimal","secure":false})", "t1");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body["message"].get<std::string>().find("--e2b-allow-insecure"), std::string::npos);
  EXPECT_EQ(engine_->list().size(), 0u);
  r = call("POST", "/sandboxes", R"({"templateID":"minimal"})", "t1");
  ASSERT_EQ(r.status, 201);
  EXPECT_EQ(r.body["envdAccessToken"],
            AccessTokens::from_key("test-key").token_for(r.body["sandboxID"].get<std::string>()));
  EXPECT_EQ(call("GET", "/nope", "", "t1").status, 404);
}

// An E2B create is a tenant's create like any other: its quota holds (429
// in E2B's shape, which the SDK raises as RateLimitError) and nothing is
// half-created.
TEST_F(E2bApiTest, TheTenantsQuotaHoldsOnTheE2bSurfaceToo) {
  auth::Auth auth(dir_);
  auth.quotas().set("t1", auth::Quota{.max_sandboxes = 1});
  daemon::set_daemon_auth(&auth);
  create("t1");
  Reply r = call("POST", "/v2/sandboxes", R"({"templateID":"minimal"})", "t1");
  daemon::set_daemon_auth(nullptr);
  EXPECT_EQ(r.status, 429) << r.body.dump();
  EXPECT_EQ(r.body["code"], 429);
  EXPECT_NE(r.body["message"].get<std::string>().find("max_sandboxes"), std::string::npos)
      << r.body.dump();
  EXPECT_EQ(engine_->list().size(), 1u);
}

// Every call that changes a sandbox is on the daemon's audit log, refusals
// included, by route template and sandbox id (never the raw path).
TEST_F(E2bApiTest, MutatingCallsAreAudited) {
  auth::Auth auth(dir_);
  daemon::set_daemon_auth(&auth);
  std::string id = create("t1");
  EXPECT_EQ(call("POST", "/sandboxes/" + id + "/timeout", R"({"timeout":30})", "t1").status, 204);
  EXPECT_EQ(call("POST", "/v2/sandboxes/" + id + "/connect", "{}", "t1").status, 200);
  EXPECT_EQ(call("POST", "/sandboxes/" + id + "/pause", "{}", "t1").status, 501);
  EXPECT_EQ(call("DELETE", "/sandboxes/" + id, "", "t2").status, 404);
  EXPECT_EQ(call("POST", "/sandboxes/" + id + "/zzz", "{}", "t1").status, 404);
  EXPECT_EQ(call("GET", "/sandboxes/" + id, "", "t1").status, 200);  // a read: not audited
  EXPECT_EQ(call("DELETE", "/sandboxes/" + id, "", "t1").status, 204);
  daemon::set_daemon_auth(nullptr);
  std::vector<std::tuple<std::string, std::string, std::string, std::string, int>> got;
  for (const json& r : auth.audit().tail(100)) {
    EXPECT_EQ(r.value("source", ""), "unix") << r.dump();
    got.emplace_back(r.value("method", ""), r.value("route", ""), r.value("tenant", ""),
                     r.value("outcome", ""), r.value("status", 0));
    if (r.value("route", "") != "create_sandbox") EXPECT_EQ(r.value("sandbox", ""), id);
  }
  using T = decltype(got)::value_type;
  EXPECT_EQ(got,
            (std::vector<T>{
                T{"POST", "create_sandbox", "t1", "sandbox_created", 201},
                T{"POST", "/e2b/api/sandboxes/{id}/timeout", "t1", "timeout_set", 204},
                T{"POST", "/e2b/api/v2/sandboxes/{id}/connect", "t1", "sandbox_connected", 200},
                T{"POST", "/e2b/api/sandboxes/{id}/pause", "t1", "refused", 501},
                T{"DELETE", "/e2b/api/sandboxes/{id}", "t2", "not_found", 404},
                T{"POST", "/e2b/api/sandboxes/{id}/{action}", "t1", "refused", 404},
                T{"DELETE", "/e2b/api/sandboxes/{id}", "t1", "sandbox_deleted", 204},
            }));
}

}  // namespace
}  // namespace airlock::e2b

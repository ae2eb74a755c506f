#include "cli/args.h"

#include <gtest/gtest.h>

#include "daemon/base64.h"

namespace airlock::cli {
namespace {

using nlohmann::json;

TEST(Args, KeyValue) {
  EXPECT_EQ(parse_kv("A=1", "--env"), (std::pair<std::string, std::string>{"A", "1"}));
  EXPECT_EQ(parse_kv("A=", "--env").second, "");
  EXPECT_EQ(parse_kv("A=b=c", "--env").second, "b=c");
  try {
    parse_kv("NOEQUALS", "--env");
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--env expects KEY=VALUE"), std::string::npos);
  }
  EXPECT_THROW(parse_kv("=v", "--meta"), UsageError);
}

TEST(Args, CreateBodyHasOnlyGivenOptions) {
  EXPECT_EQ(create_body({}), json::object());
  CreateOptions o;
  o.image = "debian";
  o.cpus = 2;
  o.memory_mb = 512;
  o.timeout_s = 60;
  o.env = {"A=1"};
  o.meta = {"team=x"};
  json j = create_body(o);
  EXPECT_EQ(j, json::parse(R"({"image":"debian","cpus":2,"memory_mb":512,"timeout":60,
                              "env":{"A":"1"},"metadata":{"team":"x"}})"));
  o.env = {"bad"};
  EXPECT_THROW(create_body(o), UsageError);
}

TEST(Args, ExecBody) {
  ExecOptions o;
  o.env = {"X=y"};
  o.cwd = "/tmp";
  o.user = "nobody";
  o.timeout_s = 2.5;
  json j = exec_body(o, {"sh", "-c", "exit 7"}, std::string("\0\xff", 2));
  EXPECT_EQ(j["argv"], json({"sh", "-c", "exit 7"}));
  EXPECT_EQ(j["env"]["X"], "y");
  EXPECT_EQ(j["cwd"], "/tmp");
  EXPECT_EQ(j["user"], "nobody");
  EXPECT_EQ(j["timeout"], 2.5);
  EXPECT_EQ(*daemon::base64_decode(j["stdin_b64"].get<std::string>()), std::string("\0\xff", 2));
  EXPECT_FALSE(exec_body({}, {"true"}, std::nullopt).contains("stdin_b64"));
  EXPECT_THROW(exec_body({}, {}, std::nullopt), UsageError);
  ExecOptions neg;
  neg.timeout_s = -1;
  EXPECT_THROW(exec_body(neg, {"true"}, std::nullopt), UsageError);
}

TEST(Args, ExitCodeMapping) {
  EXPECT_EQ(exit_code_of(json::parse(R"({"exit_code":0,"signal":null,"timed_out":false})")), 0);
  EXPECT_EQ(exit_code_of(json::parse(R"({"exit_code":7,"signal":null,"timed_out":false})")), 7);
  EXPECT_EQ(exit_code_of(json::parse(R"({"exit_code":null,"signal":9,"timed_out":false})")), 137);
  EXPECT_EQ(exit_code_of(json::parse(R"({"exit_code":null,"signal":15})")), 143);
  EXPECT_EQ(exit_code_of(json::parse(R"({"exit_code":null,"signal":9,"timed_out":true})")), 124);
  EXPECT_EQ(exit_code_of(json::parse(R"({"exit_code":null,"signal":null})")), 1);
}

TEST(Args, CpEndpoints) {
  auto r = parse_cp_endpoint("sb-1:/etc/hosts");
  EXPECT_TRUE(r.remote);
  EXPECT_EQ(r.id, "sb-1");
  EXPECT_EQ(r.path, "/etc/hosts");
  EXPECT_TRUE(parse_cp_endpoint("-").stdio);
  auto l = parse_cp_endpoint("./a:b");
  EXPECT_FALSE(l.remote);
  EXPECT_EQ(l.path, "./a:b");
  EXPECT_FALSE(parse_cp_endpoint("/abs/x:y").remote);
  EXPECT_FALSE(parse_cp_endpoint("plain.txt").remote);
  EXPECT_THROW(parse_cp_endpoint("sb-1:relative"), UsageError);
  EXPECT_THROW(parse_cp_endpoint("sb-1:"), UsageError);
  EXPECT_THROW(parse_cp_endpoint(""), UsageError);
}

TEST(Args, CpPlan) {
  EXPECT_TRUE(plan_cp("file", "sb-1:/x").upload());
  EXPECT_TRUE(plan_cp("-", "sb-1:/x").upload());
  EXPECT_FALSE(plan_cp("sb-1:/x", "-").upload());
  EXPECT_FALSE(plan_cp("sb-1:/x", "out").upload());
  EXPECT_THROW(plan_cp("a", "b"), UsageError);
  EXPECT_THROW(plan_cp("sb-1:/a", "sb-2:/b"), UsageError);
}

TEST(Args, UrlEncode) {
  EXPECT_EQ(url_encode("/tmp/a b&c=d%"), "/tmp/a%20b%26c%3Dd%25");
  EXPECT_EQ(url_encode("\xff"), "%FF");
}

TEST(Args, Formatting) {
  json list = json::parse(R"([{"id":"sb-1","image":"minimal","state":"running","cpus":1,
    "memory_mb":256,"created_at_ms":1000,"expires_at_ms":601000,"metadata":{"a":"b"}}])");
  std::string table = format_sandbox_table(list, 61000);
  EXPECT_NE(table.find("ID"), std::string::npos);
  EXPECT_NE(table.find("sb-1"), std::string::npos);
  EXPECT_NE(table.find("1m"), std::string::npos);     // age
  EXPECT_NE(table.find("in 9m"), std::string::npos);  // expires
  EXPECT_NE(table.find("a=b"), std::string::npos);
  std::string line = format_audit_line(json::parse(
      R"({"ts":"T","sandbox":"sb-1","event":"exec","argv":["sh","-c","x"],"cwd":"/a b"})"));
  EXPECT_EQ(line, R"(T exec argv=["sh","-c","x"] cwd="/a b")");
  EXPECT_EQ(human_bytes(512), "512 B");
  EXPECT_EQ(human_bytes(12897485), "12.3 MiB");
}

}  // namespace
}  // namespace airlock::cli

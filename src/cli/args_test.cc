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

TEST(Args, HotCommand) {
  using V = std::vector<std::string_view>;
  EXPECT_EQ(hot_command(V{"run", "--image", "debian"}), "run");
  EXPECT_EQ(hot_command(V{"--socket", "/s", "exec", "sb-1"}), "exec");
  EXPECT_EQ(hot_command(V{"--socket=/s", "--data-dir", "d", "--url=x", "ls"}), "ls");
  EXPECT_EQ(hot_command(V{"--image-dir", "i", "create"}), "create");
  EXPECT_EQ(hot_command(V{"rm", "sb-1", "sb-2"}), "rm");
  // A global option's value is skipped even if it names a command.
  EXPECT_EQ(hot_command(V{"--socket", "run", "ls"}), "ls");
  EXPECT_EQ(hot_command(V{"--socket", "run"}), "");
  // The whole tree: help, version, unknown options, other or no commands.
  EXPECT_EQ(hot_command(V{}), "");
  EXPECT_EQ(hot_command(V{"--help", "run"}), "");
  EXPECT_EQ(hot_command(V{"-h"}), "");
  EXPECT_EQ(hot_command(V{"--version"}), "");
  EXPECT_EQ(hot_command(V{"--bogus", "run"}), "");
  EXPECT_EQ(hot_command(V{"--socketx=1", "run"}), "");
  EXPECT_EQ(hot_command(V{"image", "ls"}), "");
  EXPECT_EQ(hot_command(V{"runx"}), "");
  EXPECT_EQ(hot_command(V{"-", "run"}), "");
}

TEST(Args, CreateBodyHasOnlyGivenOptions) {
  EXPECT_EQ(create_body({}), json::object());
  CreateOptions o;
  o.image = "debian";
  o.cpus = 2;
  o.memory_mb = 512;
  o.timeout_s = 60;
  o.idle_timeout_s = 30;
  o.env = {"A=1"};
  o.meta = {"team=x"};
  json j = create_body(o);
  EXPECT_EQ(j, json::parse(R"({"image":"debian","cpus":2,"memory_mb":512,"timeout":60,
                              "idle_timeout":30,"env":{"A":"1"},"metadata":{"team":"x"}})"));
  o.env = {"bad"};
  EXPECT_THROW(create_body(o), UsageError);
}

// Runs `fn`, expecting a UsageError whose message contains `fragment`.
template <class Fn>
void expect_usage(Fn fn, const std::string& fragment) {
  try {
    fn();
    ADD_FAILURE() << "no usage error; expected '" << fragment << "'";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(Args, NetworkFlagsMapping) {
  using V = std::vector<std::string>;
  EXPECT_FALSE(network_policy(std::nullopt, {}, {}));
  EXPECT_EQ(*network_policy("none", {}, {}), (json{{"mode", "none"}}));
  EXPECT_EQ(*network_policy("open", {}, V{"evil.com"}),
            (json{{"mode", "open"}, {"deny", {"evil.com"}}}));
  // --allow without --network implies allowlist.
  EXPECT_EQ(
      *network_policy(std::nullopt, V{"a.com", "203.0.113.0/24"}, V{"x.a.com"}),
      (json{{"mode", "allowlist"}, {"allow", {"a.com", "203.0.113.0/24"}}, {"deny", {"x.a.com"}}}));
  EXPECT_EQ(*network_policy("allowlist", {}, {}), (json{{"mode", "allowlist"}}));
  expect_usage([] { network_policy("none", V{"x"}, {}); }, "--network none takes no --allow");
  expect_usage([] { network_policy("none", {}, V{"x"}); }, "--network none takes no --deny");
  expect_usage([] { network_policy("open", V{"x"}, {}); }, "--network open takes no --allow");
  expect_usage([] { network_policy(std::nullopt, {}, V{"x"}); }, "--deny needs --network");
  expect_usage([] { network_policy("closed", {}, {}); }, "none, allowlist or open");

  CreateOptions o;
  o.allow = {"a.com"};
  EXPECT_EQ(create_body(o), (json{{"network", {{"mode", "allowlist"}, {"allow", {"a.com"}}}}}));
  o.network = "none";
  EXPECT_THROW(create_body(o), UsageError);
}

TEST(Args, NetworkChange) {
  EXPECT_EQ(format_network_change({{"policy", {{"mode", "open"}}}, {"flows_cut", 2}}),
            "policy: {\"mode\":\"open\"}\nflows cut: 2\n");
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

TEST(Args, Formatting) {
  json list = json::parse(R"([{"id":"sb-1","image":"minimal","state":"running","cpus":1,
    "memory_mb":256,"created_at_ms":1000,"expires_at_ms":601000,"metadata":{"a":"b"}}])");
  std::string table = format_sandbox_table(list, 61000);
  EXPECT_NE(table.find("ID"), std::string::npos);
  EXPECT_NE(table.find("sb-1"), std::string::npos);
  EXPECT_NE(table.find("1m"), std::string::npos);     // age
  EXPECT_NE(table.find("in 9m"), std::string::npos);  // expires
  EXPECT_NE(table.find("a=b"), std::string::npos);
  json failed = json::parse(R"([{"id":"sb-2","image":"minimal","state":"failed",
    "failure":"vmm_died","cpus":1,"memory_mb":256,"created_at_ms":1000}])");
  EXPECT_NE(format_sandbox_table(failed, 61000).find("failed/vmm_died"), std::string::npos);
}

TEST(Args, FormatPostureNamesWhatIsMissing) {
  json p = {{"isolation", "tcg"},
            {"note", "TCG: not a boundary"},
            {"jail", "userns"},
            {"missing", json::array({"uid", "cgroup_memory"})},
            {"process",
             {{"uid", {{"effective", 1000}}},
              {"capabilities", {{"effective", "0000000000000000"}}},
              {"seccomp", 2},
              {"no_new_privs", true},
              {"namespaces", {{"mnt", {{"own", true}}}, {"user", {{"own", false}}}}},
              {"root", {{"own", true}, {"entries", json::array({"dev", "usr"})}}},
              {"cgroup", {{"memory_max", nullptr}, {"pids_max", 64}, {"cpu_max", nullptr}}},
              {"rlimits", {{"core", {{"hard", 0}}}}}}}};
  std::string s = format_posture(p);
  EXPECT_NE(s.find("isolation: tcg (TCG: not a boundary)"), std::string::npos) << s;
  EXPECT_NE(s.find("uid: 1000    capabilities: none    seccomp: filter    no_new_privs: yes"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("own: mnt shared with the host: user"), std::string::npos) << s;
  EXPECT_NE(s.find("root: own (dev usr)"), std::string::npos) << s;
  EXPECT_NE(s.find("cgroup: memory unlimited, pids 64, cpu unlimited"), std::string::npos) << s;
  EXPECT_NE(s.find("rlimits: core 0"), std::string::npos) << s;
  EXPECT_NE(s.find("missing: uid, cgroup_memory"), std::string::npos) << s;
}

}  // namespace
}  // namespace airlock::cli

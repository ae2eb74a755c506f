#include "daemon/request.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace airlock::daemon {
namespace {

// Runs `fn`, expecting Error(invalid_argument) about `field` whose message
// contains `fragment`.
template <class Fn>
void expect_bad(Fn fn, const std::string& field, const std::string& fragment) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one about " << field;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument) << e.what();
    EXPECT_EQ(e.field(), field) << e.what();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
        << "message '" << e.what() << "' lacks '" << fragment << "'";
  }
}

TEST(ParseObject, MalformedJsonNamesPosition) {
  expect_bad([] { parse_object(R"({"cpus": 1,})"); }, "body", "malformed JSON at byte");
  expect_bad([] { parse_object("[1,2]"); }, "body", "must be a JSON object");
  expect_bad([] { parse_object("\"x\""); }, "body", "must be a JSON object");
  EXPECT_TRUE(parse_object("").empty());
  EXPECT_TRUE(parse_object("  \n").empty());
}

TEST(ParseCreate, DefaultsAndFullSpec) {
  auto d = parse_create("{}");
  EXPECT_EQ(d.image, "minimal");
  EXPECT_EQ(d.cpus, 1);
  auto s = parse_create(R"({"image":"debian","cpus":2,"memory_mb":512,"disk_mb":2048,
    "timeout":30,"env":{"A":"1"},"metadata":{"owner":"me"}})");
  EXPECT_EQ(s.image, "debian");
  EXPECT_EQ(s.cpus, 2);
  EXPECT_EQ(s.memory_mb, 512);
  EXPECT_EQ(s.disk_mb, 2048);
  EXPECT_EQ(s.timeout_s, 30);
  EXPECT_EQ(s.env.at("A"), "1");
  EXPECT_EQ(s.metadata.at("owner"), "me");
}

TEST(ParseCreate, UnknownFieldRejected) {
  EXPECT_EQ(parse_create("{}").idle_timeout_s, 0);
  EXPECT_EQ(parse_create(R"({"idle_timeout":90})").idle_timeout_s, 90);
  expect_bad([] { parse_create(R"({"idle_timeout":-1})"); }, "idle_timeout", "idle_timeout");
  expect_bad([] { parse_create(R"({"idle_timeout":604801})"); }, "idle_timeout", "idle_timeout");
  expect_bad([] { parse_create(R"({"cpu":2})"); }, "cpu", "unknown field 'cpu'");
  expect_bad([] { parse_create(R"({"networks":{}})"); }, "networks", "unknown field");
}

TEST(ParseCreate, TypeErrorsNameTheField) {
  expect_bad([] { parse_create(R"({"cpus":"2"})"); }, "cpus", "cpus must be an integer");
  expect_bad([] { parse_create(R"({"cpus":2.5})"); }, "cpus", "must be an integer");
  expect_bad([] { parse_create(R"({"cpus":true})"); }, "cpus", "must be an integer");
  expect_bad([] { parse_create(R"({"memory_mb":null})"); }, "memory_mb", "must be an integer");
  expect_bad([] { parse_create(R"({"disk_mb":[1]})"); }, "disk_mb", "must be an integer");
  expect_bad([] { parse_create(R"({"timeout":"1m"})"); }, "timeout", "must be an integer");
  expect_bad([] { parse_create(R"({"image":3})"); }, "image", "image must be a string");
  expect_bad([] { parse_create(R"({"env":["A=1"]})"); }, "env", "must be an object");
  expect_bad([] { parse_create(R"({"env":{"A":1}})"); }, "env.A", "env.A must be a string");
  expect_bad([] { parse_create(R"({"metadata":{"k":{}}})"); }, "metadata.k", "must be a string");
  // The E2B surface's reserved prefix (src/e2b) is refused, naming the key.
  expect_bad([] { parse_create(R"({"metadata":{"e2b.template":"x"}})"); }, "metadata.e2b.template",
             "reserved");
}

TEST(ParseCreate, Bounds) {
  expect_bad([] { parse_create(R"({"cpus":0})"); }, "cpus", "between 1 and 16, got");
  expect_bad([] { parse_create(R"({"cpus":-1})"); }, "cpus", "between 1 and 16, got");
  expect_bad([] { parse_create(R"({"cpus":17})"); }, "cpus", "between 1 and 16, got 17");
  expect_bad([] { parse_create(R"({"memory_mb":32})"); }, "memory_mb", "between 64 and 65536, got 32");
  expect_bad([] { parse_create(R"({"memory_mb":99999999999})"); }, "memory_mb", "between 64 and 65536");
  expect_bad([] { parse_create(R"({"memory_mb":18446744073709551615})"); }, "memory_mb", "between 64 and 65536");
  expect_bad([] { parse_create(R"({"disk_mb":-5})"); }, "disk_mb", "between 1 and 1048576, got -5");
  expect_bad([] { parse_create(R"({"timeout":0})"); }, "timeout", "between 1 and 604800, got 0");
  expect_bad([] { parse_create(R"({"timeout":604801})"); }, "timeout", "between 1 and 604800, got 604801");
  EXPECT_EQ(parse_create(R"({"cpus":16,"memory_mb":64,"timeout":604800})").cpus, 16);
}

TEST(ParseCreate, ImageAndEnvNames) {
  expect_bad([] { parse_create(R"({"image":"../etc"})"); }, "image", "may contain only");
  expect_bad([] { parse_create(R"({"image":""})"); }, "image", "1..64");
  expect_bad([] { parse_create(R"({"env":{"A=B":"1"}})"); }, "env", "must not contain '='");
  expect_bad([] { parse_create(R"({"env":{"":"1"}})"); }, "env", "must not be empty");
  expect_bad([] { parse_create(R"({"env":{"A":"x\u0000y"}})"); }, "env.A", "NUL");
}

TEST(ParseNetwork, DefaultAndAccepted) {
  EXPECT_EQ(parse_create("{}").network, (nlohmann::json{{"mode", "none"}}));
  auto s = parse_create(
      R"({"network":{"mode":"allowlist","allow":["203.0.113.0/24","*.example.com"],"deny":[]}})");
  EXPECT_EQ(s.network["mode"], "allowlist");
  EXPECT_EQ(s.network["allow"], (nlohmann::json{"203.0.113.0/24", "*.example.com"}));
  EXPECT_EQ(s.network["deny"], nlohmann::json::array());
  // Absent lists stay absent (the engine's normal form decides defaults).
  EXPECT_FALSE(parse_create(R"({"network":{"mode":"open"}})").network.contains("allow"));
  auto p = parse_network_patch(R"({"mode":"open","deny":["evil.com"]})");
  EXPECT_EQ(p, (nlohmann::json{{"mode", "open"}, {"deny", {"evil.com"}}}));
}

TEST(ParseNetwork, ErrorsNameTheEntry) {
  expect_bad([] { parse_create(R"({"network":"open"})"); }, "network", "must be an object");
  expect_bad([] { parse_create(R"({"network":{"mode":"open","bogus":1}})"); }, "network.bogus",
             "unknown field 'network.bogus'");
  expect_bad([] { parse_create(R"({"network":{"allow":["a.com"]}})"); }, "network.mode",
             "network.mode is required");
  expect_bad([] { parse_create(R"({"network":{"mode":"closed"}})"); }, "network.mode",
             "none, allowlist or open");
  expect_bad([] { parse_create(R"({"network":{"mode":1}})"); }, "network.mode",
             "network.mode must be a string");
  expect_bad([] { parse_create(R"({"network":{"mode":"allowlist","allow":"a.com"}})"); },
             "network.allow", "must be an array of strings");
  expect_bad(
      [] { parse_create(R"({"network":{"mode":"allowlist","allow":["a.com","b.com",3]}})"); },
      "network.allow[2]", "network.allow[2] must be a string");
  expect_bad([] { parse_create(R"({"network":{"mode":"open","deny":[""]}})"); }, "network.deny[0]",
             "must not be empty");
  expect_bad(
      [] {
        parse_create(R"({"network":{"mode":"open","deny":[")" + std::string(300, 'a') + R"("]}})");
      },
      "network.deny[0]", "longer than 255");
  nlohmann::json big = {{"mode", "allowlist"}, {"allow", nlohmann::json::array()}};
  for (int i = 0; i < 1025; ++i) big["allow"].push_back("a.com");
  expect_bad([&] { parse_network(big); }, "network.allow", "more than 1024");
  expect_bad([] { parse_network_patch(""); }, "body", "network policy");
  expect_bad([] { parse_network_patch(R"({"mode":"open","x":[]})"); }, "network.x",
             "unknown field");
}

TEST(ParseExec, ArgvOrCmd) {
  auto a = parse_exec(R"({"argv":["sh","-c","echo hi"]})");
  EXPECT_EQ(a.argv.size(), 3u);
  EXPECT_TRUE(a.cmd.empty());
  EXPECT_FALSE(a.stdin_data.has_value());
  auto c = parse_exec(R"({"cmd":"echo hi | wc -c"})");
  EXPECT_EQ(c.cmd, "echo hi | wc -c");
  EXPECT_TRUE(parse_exec("{}").argv.empty());  // the image's Entrypoint + Cmd
  expect_bad([] { parse_exec(R"({"argv":["a"],"cmd":"b"})"); }, "argv", "not both");
  expect_bad([] { parse_exec(R"({"argv":[]})"); }, "argv", "must not be empty");
  expect_bad([] { parse_exec(R"({"argv":"ls"})"); }, "argv", "array of strings");
  expect_bad([] { parse_exec(R"({"argv":["ls",1]})"); }, "argv", "array of strings");
  expect_bad([] { parse_exec(R"({"argv":[""]})"); }, "argv", "argv[0]");
  expect_bad([] { parse_exec(R"({"cmd":""})"); }, "cmd", "must not be empty");
  expect_bad([] { parse_exec(R"({"cmd":["ls"]})"); }, "cmd", "cmd must be a string");
}

TEST(ParseExec, OptionalFields) {
  auto r = parse_exec(
      R"({"argv":["id"],"env":{"X":"y"},"cwd":"/tmp","user":"nobody","stdin":"hi","timeout":1.5})");
  EXPECT_EQ(r.env.at("X"), "y");
  EXPECT_EQ(r.cwd, "/tmp");
  EXPECT_EQ(r.user, "nobody");
  EXPECT_EQ(r.stdin_data.value(), "hi");
  EXPECT_DOUBLE_EQ(r.timeout_s, 1.5);
  EXPECT_EQ(parse_exec(R"({"argv":["id"],"user":1000})").user, "1000");
  EXPECT_EQ(parse_exec(R"({"argv":["cat"],"stdin_b64":"AP8="})").stdin_data.value(),
            std::string("\0\xff", 2));
}

TEST(ParseExec, FieldErrors) {
  expect_bad([] { parse_exec(R"({"argv":["x"],"pty":true})"); }, "pty", "unknown field 'pty'");
  expect_bad([] { parse_exec(R"({"argv":["x"],"cwd":"tmp"})"); }, "cwd", "absolute path");
  expect_bad([] { parse_exec(R"({"argv":["x"],"cwd":5})"); }, "cwd", "must be a string");
  expect_bad([] { parse_exec(R"({"argv":["x"],"user":"a b"})"); }, "user", "user name");
  expect_bad([] { parse_exec(R"({"argv":["x"],"user":-1})"); }, "user", "at least 0");
  expect_bad([] { parse_exec(R"({"argv":["x"],"user":[]})"); }, "user", "string");
  expect_bad([] { parse_exec(R"({"argv":["x"],"stdin":"a","stdin_b64":"YQ=="})"); }, "stdin",
             "not both");
  expect_bad([] { parse_exec(R"({"argv":["x"],"stdin":5})"); }, "stdin", "must be a string");
  expect_bad([] { parse_exec(R"({"argv":["x"],"stdin_b64":"***"})"); }, "stdin_b64",
             "not valid base64");
  expect_bad([] { parse_exec(R"({"argv":["x"],"timeout":-1})"); }, "timeout", "at least 0");
  expect_bad([] { parse_exec(R"({"argv":["x"],"timeout":"5"})"); }, "timeout", "number");
  expect_bad([] { parse_exec(R"({"argv":["x"],"timeout":1e9})"); }, "timeout", "between 0 (none) and 604800");
  expect_bad([] { parse_exec(R"({"argv":["x"],"env":{"A=":"b"}})"); }, "env", "'='");
}

TEST(ParseMkdir, Fields) {
  auto m = parse_mkdir(R"({"path":"/a/b","parents":true})");
  EXPECT_EQ(m.path, "/a/b");
  EXPECT_TRUE(m.parents);
  EXPECT_FALSE(parse_mkdir(R"({"path":"/a"})").parents);
  expect_bad([] { parse_mkdir("{}"); }, "path", "path is required");
  expect_bad([] { parse_mkdir(R"({"path":"a"})"); }, "path", "absolute");
  expect_bad([] { parse_mkdir(R"({"path":"/a","parents":"yes"})"); }, "parents", "boolean");
  expect_bad([] { parse_mkdir(R"({"path":"/a","mode":1})"); }, "mode", "unknown field");
}

TEST(Query, DecodesAndValidates) {
  Query q = parse_query("path=%2Ftmp%2Fa+b&recursive=true&&metadata.owner=me&flag");
  EXPECT_EQ(q.at("path"), "/tmp/a b");
  EXPECT_EQ(q.at("flag"), "");
  EXPECT_TRUE(query_bool(q, "recursive", false));
  EXPECT_TRUE(query_bool(q, "flag", false));
  EXPECT_FALSE(query_bool(q, "absent", false));
  EXPECT_EQ(query_path(q), "/tmp/a b");
  EXPECT_EQ(metadata_filter(q), (std::map<std::string, std::string>{{"owner", "me"}}));
  expect_bad([] { parse_query("path=%zz"); }, "query", "%-escape");
  expect_bad([] { parse_query("path=%2"); }, "query", "%-escape");
  expect_bad([] { query_bool(parse_query("all=maybe"), "all", false); }, "all", "true or false");
  expect_bad([] { query_path(parse_query("")); }, "path", "required");
  expect_bad([] { query_path(parse_query("path=rel")); }, "path", "absolute");
  expect_bad([] { query_path(parse_query("path=/a%00b")); }, "path", "NUL");
}

TEST(Query, UnknownKeysRejected) {
  check_query_keys(parse_query("all=1&metadata.x=y"), {"all", "metadata."});
  expect_bad(
      [] {
        check_query_keys(parse_query("alll=1"), {"all", "metadata."});
      },
      "alll", "unknown query parameter 'alll'");
  expect_bad([] { check_query_keys(parse_query("metadata.=1"), {"metadata."}); }, "metadata.",
             "unknown query parameter");
}

TEST(Query, ModeAndSignal) {
  EXPECT_EQ(query_mode(parse_query("mode=0755"), 0644), 0755u);
  EXPECT_EQ(query_mode(parse_query("mode=600"), 0644), 0600u);
  EXPECT_EQ(query_mode(parse_query(""), 0644), 0644u);
  expect_bad([] { query_mode(parse_query("mode=0999"), 0); }, "mode", "octal");
  expect_bad([] { query_mode(parse_query("mode=-1"), 0); }, "mode", "octal");
  expect_bad([] { query_mode(parse_query("mode=17777"), 0); }, "mode", "at most 07777");
  EXPECT_EQ(query_signal(parse_query("signal=15"), 9), 15);
  EXPECT_EQ(query_signal(parse_query(""), 9), 9);
  expect_bad([] { query_signal(parse_query("signal=0"), 9); }, "signal", "1 to 64");
  expect_bad([] { query_signal(parse_query("signal=TERM"), 9); }, "signal", "1 to 64");
  expect_bad([] { query_signal(parse_query("signal=99999999999"), 9); }, "signal", "1 to 64");
}

TEST(CheckId, Format) {
  check_id("sb-0123abcd_X", "id");
  expect_bad([] { check_id("", "id"); }, "id", "1..64");
  expect_bad([] { check_id("a/b", "id"); }, "id", "letters");
  expect_bad([] { check_id("..", "id"); }, "id", "letters");
  expect_bad([] { check_id(std::string(65, 'a'), "exec_id"); }, "exec_id", "1..64");
}

}  // namespace
}  // namespace airlock::daemon

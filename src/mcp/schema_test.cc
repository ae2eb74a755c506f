#include "mcp/schema.h"

#include <gtest/gtest.h>

#include "mcp/tool_defs.h"

namespace airlock::mcp {
namespace {

using nlohmann::json;

const json& exec_schema() { return (*find_tool("sandbox_exec"))["inputSchema"]; }

TEST(Schema, AcceptsWhatTheToolDocuments) {
  EXPECT_FALSE(check_schema(
      exec_schema(),
      {{"sandbox_id", "sb-1"}, {"argv", {"ls", "-l"}}, {"env", {{"A", "b"}}}, {"timeout", 2.5}}));
  EXPECT_FALSE(check_schema(exec_schema(), {{"sandbox_id", "sb-1"}, {"command", "ls"}}));
}

TEST(Schema, NamesTheFieldThatIsWrong) {
  auto v = check_schema(exec_schema(), {{"command", "ls"}});
  ASSERT_TRUE(v);
  EXPECT_EQ(v->field, "sandbox_id");
  EXPECT_EQ(v->message, "sandbox_id is required");

  v = check_schema(exec_schema(), {{"sandbox_id", "sb-1"}, {"argv", {"ls", 3}}});
  ASSERT_TRUE(v);
  EXPECT_EQ(v->field, "argv[1]");
  EXPECT_EQ(v->message, "argv[1] must be a string");

  v = check_schema(exec_schema(), {{"sandbox_id", "sb-1"}, {"env", {{"X", 1}}}});
  ASSERT_TRUE(v);
  EXPECT_EQ(v->field, "env.X");

  v = check_schema(exec_schema(), {{"sandbox_id", "sb-1"}, {"argv", json::array()}});
  ASSERT_TRUE(v);
  EXPECT_EQ(v->message, "argv must not be empty");

  v = check_schema(exec_schema(), {{"sandbox_id", "sb-1"}, {"timeout", -1}});
  ASSERT_TRUE(v);
  EXPECT_EQ(v->message, "timeout must be at least 0");

  v = check_schema(exec_schema(), {{"sandbox_id", "../x"}});
  ASSERT_TRUE(v);
  EXPECT_EQ(v->field, "sandbox_id");
}

TEST(Schema, UnknownFieldsAreRefusedAndTheKnownOnesListed) {
  auto v = check_schema(exec_schema(), {{"sandbox_id", "sb-1"}, {"cmd", "ls"}});
  ASSERT_TRUE(v);
  EXPECT_EQ(v->field, "cmd");
  EXPECT_NE(v->message.find("unknown field cmd"), std::string::npos);
  EXPECT_NE(v->message.find("command"), std::string::npos);
}

TEST(Schema, EnumsNestedObjectsAndIntegers) {
  const json& create = (*find_tool("sandbox_create"))["inputSchema"];
  auto v = check_schema(create, {{"network", {{"mode", "sometimes"}}}});
  ASSERT_TRUE(v);
  EXPECT_EQ(v->field, "network.mode");
  EXPECT_NE(v->message.find("\"allowlist\""), std::string::npos);
  v = check_schema(create, {{"network", {{"mode", "allowlist"}, {"allow", {""}}}}});
  ASSERT_TRUE(v);
  EXPECT_EQ(v->field, "network.allow[0]");
  EXPECT_FALSE(check_schema(create, {{"cpus", 2.0}}));  // 2.0 is an integer in JSON Schema
  v = check_schema(create, {{"cpus", 1.5}});
  ASSERT_TRUE(v);
  EXPECT_EQ(v->message, "cpus must be an integer");
  v = check_schema(create, {{"keep", "yes"}});
  ASSERT_TRUE(v);
  EXPECT_EQ(v->message, "keep must be a boolean");
  EXPECT_TRUE(check_schema(create, json::array()));
}

TEST(Schema, EveryToolHasAnObjectInputSchemaAndOutputSchema) {
  ASSERT_EQ(tool_definitions().size(), 9u);
  for (const auto& t : tool_definitions()) {
    EXPECT_EQ(t["inputSchema"]["type"], "object") << t["name"];
    EXPECT_EQ(t["outputSchema"]["type"], "object") << t["name"];
    EXPECT_FALSE(t["description"].get<std::string>().empty());
  }
}

}  // namespace
}  // namespace airlock::mcp

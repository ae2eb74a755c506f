// Keeps api/openapi.yaml and the router in step: every (method, path) the
// router serves is documented, and the spec documents nothing it does not
// serve. The YAML is read as text by indentation (paths at 2 spaces,
// operations at 4), which is how the spec is written.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>

#include "daemon/router.h"

namespace airlock::daemon {
namespace {

std::set<std::string> spec_operations(std::string* text) {
  std::ifstream in(AIRLOCK_OPENAPI_YAML);
  EXPECT_TRUE(in) << "cannot open " << AIRLOCK_OPENAPI_YAML;
  std::stringstream ss;
  ss << in.rdbuf();
  *text = ss.str();
  std::set<std::string> ops;
  std::istringstream lines(*text);
  std::string line, section, path;
  while (std::getline(lines, line)) {
    if (!line.empty() && line[0] != ' ' && line[0] != '#') section = line;
    if (section != "paths:") continue;
    if (line.rfind("  /", 0) == 0 && line.back() == ':') {
      path = line.substr(2, line.size() - 3);
    } else if (line.size() > 5 && line.rfind("    ", 0) == 0 && line[4] != ' ' &&
               line.back() == ':') {
      std::string method = line.substr(4, line.size() - 5);
      if (method == "get" || method == "post" || method == "put" || method == "delete" ||
          method == "patch") {
        for (auto& c : method) c = static_cast<char>(std::toupper(c));
        ops.insert(method + " " + path);
      }
    }
  }
  return ops;
}

// Routes the spec may document ahead of the daemon (none now); one that is
// served fails the test, so the list cannot go stale.
const std::set<std::string> kPending = {};

TEST(OpenApi, SpecAndRouterAgree) {
  std::string text;
  auto ops = spec_operations(&text);
  ASSERT_NE(text.find("openapi: 3.0"), std::string::npos);
  std::set<std::string> served;
  for (const auto& r : routes()) served.insert(std::string(r.method) + " " + r.path);
  for (const auto& op : served) EXPECT_TRUE(ops.count(op)) << "not in openapi.yaml: " << op;
  for (const auto& op : ops)
    EXPECT_TRUE(served.count(op) || kPending.count(op)) << "not served by airlockd: " << op;
  for (const auto& op : kPending)
    EXPECT_FALSE(served.count(op)) << "served now: delete it from kPending: " << op;
}

TEST(OpenApi, ErrorSchemaAndStreamEventsDocumented) {
  std::string text;
  spec_operations(&text);
  for (const char* needle :
       {"Error:", "application/x-ndjson", "ExecEvent:", "SandboxSpec:", "NetworkPolicy:",
        "NetworkEvent:", "additionalProperties: false", "'413':", "MethodNotAllowed:", "default:"})
    EXPECT_NE(text.find(needle), std::string::npos) << needle;
}

}  // namespace
}  // namespace airlock::daemon

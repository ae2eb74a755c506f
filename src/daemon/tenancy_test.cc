// The tenant's views of host-wide answers (tenancy.h): nothing of the host
// or of other tenants survives them.
#include "daemon/tenancy.h"

#include <gtest/gtest.h>

namespace airlock::daemon {
namespace {

using nlohmann::json;

TEST(TenantPosture, DropsHostIdentifiersAndPaths) {
  json p = {{"id", "sb-1"},
            {"isolation", "tcg"},
            {"process",
             {{"pid", 4242},
              {"uid", {{"effective", 2100000001}}},
              {"namespaces", {{"mnt", {{"id", "mnt:[4026532]"}, {"own", true}}}}},
              {"root", {{"own", true}, {"entries", json::array({"dev", "run"})}}},
              {"cgroup", {{"path", "/sys/fs/cgroup/airlock/sb-1"}, {"memory_max", 1 << 30}}}}},
            {"missing", json::array()}};
  json t = tenant_posture(p);
  EXPECT_FALSE(t["process"].contains("pid"));
  EXPECT_FALSE(t["process"]["namespaces"]["mnt"].contains("id"));
  EXPECT_EQ(t["process"]["namespaces"]["mnt"]["own"], true);
  EXPECT_FALSE(t["process"]["cgroup"].contains("path"));
  EXPECT_EQ(t["process"]["cgroup"]["memory_max"], 1 << 30);
  EXPECT_EQ(t["process"]["root"]["entries"], json::array({"dev", "run"}));
  EXPECT_EQ(t["process"]["uid"]["effective"], 2100000001);
  EXPECT_EQ(t["id"], "sb-1");
  EXPECT_EQ(t.dump().find('/'), std::string::npos) << t.dump();
}

}  // namespace
}  // namespace airlock::daemon

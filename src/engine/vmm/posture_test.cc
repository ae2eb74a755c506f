#include "engine/vmm/posture.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "common/error.h"

namespace airlock::vmm {
namespace {

nlohmann::json jailed() {
  nlohmann::json p = {
      {"uid", {{"real", 200001}, {"effective", 200001}}},
      {"capabilities", {{"effective", "0000000000000000"}, {"bounding", "0000000000000000"}}},
      {"seccomp", 2},
      {"no_new_privs", true},
      {"root", {{"own", true}}},
      {"cgroup", {{"memory_max", 1 << 30}, {"pids_max", 1024}, {"cpu_max", "100000 100000"}}},
      {"rlimits",
       {{"core", {{"hard", 0}}}, {"nofile", {{"hard", 4096}}}, {"fsize", {{"hard", 1 << 30}}}}}};
  for (const char* ns : {"mnt", "pid", "ipc", "uts", "net"}) p["namespaces"][ns]["own"] = true;
  return p;
}

TEST(PostureMissing, AFullJailLacksNothing) { EXPECT_TRUE(posture_missing(jailed()).empty()); }

TEST(PostureMissing, EachGapIsNamed) {
  auto p = jailed();
  p["uid"]["effective"] = 0;
  p["capabilities"]["effective"] = "0000000000000400";
  p["seccomp"] = 0;
  p["no_new_privs"] = false;
  p["namespaces"]["net"]["own"] = false;
  p["namespaces"].erase("pid");
  p["root"]["own"] = false;
  p["cgroup"]["memory_max"] = nullptr;
  p["rlimits"]["core"]["hard"] = nullptr;
  std::vector<std::string> want = {"uid",          "capabilities",  "seccomp",
                                   "no_new_privs", "pid_namespace", "net_namespace",
                                   "root",         "cgroup_memory", "rlimit_core"};
  EXPECT_EQ(posture_missing(p), want);
}

TEST(ReadPosture, TheTestProcessItselfIsNotJailed) {
  auto p = read_posture(::getpid());
  EXPECT_EQ(p["pid"], ::getpid());
  EXPECT_EQ(p["uid"]["effective"], static_cast<long>(::geteuid()));
  for (const char* ns : {"mnt", "pid", "net"}) EXPECT_EQ(p["namespaces"][ns]["own"], false);
  EXPECT_EQ(p["root"]["own"], false);
  auto missing = p["missing"];
  EXPECT_NE(std::find(missing.begin(), missing.end(), "root"), missing.end());
  EXPECT_NE(std::find(missing.begin(), missing.end(), "mnt_namespace"), missing.end());
  EXPECT_TRUE(p["rlimits"].contains("nofile"));
}

TEST(ReadPosture, AGoneProcessIsNotFound) {
  try {
    read_posture(0x3ffffff0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::not_found);
  }
}

}  // namespace
}  // namespace airlock::vmm

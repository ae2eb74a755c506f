#include "guest/users.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

namespace airlock::guest {
namespace {

TEST(Users, LookupByNameUidAndGroups) {
  std::string dir = "/tmp/airlock-users-test-" + std::to_string(getpid());
  mkdir(dir.c_str(), 0755);
  std::ofstream(dir + "/passwd") << "root:x:0:0:root:/root:/bin/bash\n"
                                    "broken line\n"
                                    "alice:x:1000:1000::/home/alice:/bin/sh\n";
  std::ofstream(dir + "/group") << "root:x:0:\nalice:x:1000:\nwheel:x:10:bob,alice\n";
  auto a = lookup_user("alice", dir + "/passwd", dir + "/group");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->uid, 1000u);
  EXPECT_EQ(a->home, "/home/alice");
  EXPECT_EQ(a->groups, (std::vector<gid_t>{1000, 10}));
  auto r = lookup_user("0", dir + "/passwd", dir + "/group");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->name, "root");
  EXPECT_EQ(r->shell, "/bin/bash");
  auto n = lookup_user("4242", dir + "/passwd", dir + "/group");
  ASSERT_TRUE(n);
  EXPECT_EQ(n->uid, 4242u);
  EXPECT_EQ(n->home, "/");
  EXPECT_FALSE(lookup_user("mallory", dir + "/passwd", dir + "/group"));
  EXPECT_EQ(user_name(1000, dir + "/passwd"), "alice");
  EXPECT_EQ(user_name(4242, dir + "/passwd"), "4242");
  EXPECT_EQ(group_name(10, dir + "/group"), "wheel");
  EXPECT_EQ(group_name(77, dir + "/group"), "77");
  std::remove((dir + "/passwd").c_str());
  std::remove((dir + "/group").c_str());
  rmdir(dir.c_str());
}

}  // namespace
}  // namespace airlock::guest

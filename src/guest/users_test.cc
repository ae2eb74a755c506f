#include "guest/users.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

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

// Answers are remembered, but never past a change of either file: an edit
// in place (same inode) and a replacement by rename (useradd's way).
TEST(Users, AnEditOrReplacedFileIsReadAgain) {
  std::string dir = "/tmp/airlock-users-memo-" + std::to_string(getpid());
  mkdir(dir.c_str(), 0755);
  std::string pw = dir + "/passwd", gr = dir + "/group";
  std::ofstream(pw) << "bob:x:1001:1001::/home/bob:/bin/sh\n";
  std::ofstream(gr) << "bob:x:1001:\n";
  ASSERT_EQ(lookup_user("bob", pw, gr)->home, "/home/bob");
  ASSERT_EQ(lookup_user("bob", pw, gr)->home, "/home/bob");  // from the memo
  // In place, different size.
  std::ofstream(pw, std::ios::trunc) << "bob:x:1001:1001::/srv/bob:/bin/sh\n";
  EXPECT_EQ(lookup_user("bob", pw, gr)->home, "/srv/bob");
  // In place, same size: the timestamps tell (a tick apart: kernels without
  // multigrain timestamps stamp writes within one tick alike, users.h).
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::ofstream(pw, std::ios::trunc) << "bob:x:1001:1001::/srv/bib:/bin/sh\n";
  EXPECT_EQ(lookup_user("bob", pw, gr)->home, "/srv/bib");
  // The group file replaced by rename: bob joins wheel.
  std::ofstream(gr + ".new") << "bob:x:1001:\nwheel:x:10:bob\n";
  ASSERT_EQ(std::rename((gr + ".new").c_str(), gr.c_str()), 0);
  EXPECT_EQ(lookup_user("bob", pw, gr)->groups, (std::vector<gid_t>{1001, 10}));
  // A user removed is unknown at once; a missing file is never remembered.
  std::ofstream(pw, std::ios::trunc) << "root:x:0:0:root:/root:/bin/sh\n";
  EXPECT_FALSE(lookup_user("bob", pw, gr));
  std::remove(gr.c_str());
  EXPECT_EQ(lookup_user("root", pw, gr)->groups, (std::vector<gid_t>{0}));
  std::ofstream(gr) << "root:x:0:\nadm:x:4:root\n";
  EXPECT_EQ(lookup_user("root", pw, gr)->groups, (std::vector<gid_t>{0, 4}));
  std::remove(pw.c_str());
  std::remove(gr.c_str());
  rmdir(dir.c_str());
}

}  // namespace
}  // namespace airlock::guest

#include "engine/vmm/jail_ids.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "common/error.h"
#include "engine/vmm/vm.h"

namespace airlock::vmm {
namespace {

namespace fs = std::filesystem;

class JailIdsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/aljidsXXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    src_ = {dir_ / "subuid", dir_ / "subgid", dir_ / "passwd", dir_ / "group"};
    // What a host with three useradd'ed users looks like.
    write(src_.subuid, "alice:100000:65536\nbob:165536:65536\ncarol:231072:65536\n");
    write(src_.subgid, "alice:100000:65536\nbob:165536:65536\ncarol:231072:65536\n");
    write(src_.passwd, "root:x:0:0:root:/root:/bin/sh\nalice:x:1000:1000::/home/alice:/bin/sh\n");
    write(src_.group, "root:x:0:\nalice:x:1000:\n");
  }
  void TearDown() override { fs::remove_all(dir_); }
  static void write(const fs::path& p, const std::string& s) { std::ofstream(p) << s; }
  // The message of the Error check_jail_ids throws, "" if none.
  std::string refusal(JailIdRange r) {
    try {
      check_jail_ids(r, src_);
    } catch (const Error& e) {
      EXPECT_EQ(e.field(), "jail_ids");
      EXPECT_EQ(e.code(), Errc::invalid_argument);
      return e.what();
    }
    return "";
  }
  fs::path dir_;
  IdSources src_;
};

TEST_F(JailIdsTest, TheDefaultRangeAvoidsUseraddsSubordinateRanges) {
  EXPECT_EQ(refusal({}), "");
  // ... and the range the jail used before (200000+N), inside bob's and
  // carol's subordinate ids, is refused, naming the file, line and owner.
  std::string m = refusal({.base = 200000, .count = 65536});
  EXPECT_NE(m.find(src_.subuid.string() + " line 2"), std::string::npos) << m;
  EXPECT_NE(m.find("bob"), std::string::npos) << m;
}

TEST_F(JailIdsTest, SubgidPasswdAndGroupEntriesAreCheckedToo) {
  write(src_.subuid, "");
  std::string m = refusal({.base = 150000, .count = 10});
  EXPECT_NE(m.find(src_.subgid.string()), std::string::npos) << m;
  write(src_.subgid, "");
  write(src_.passwd, "svc:x:3000000:1:::/bin/false\n");
  m = refusal({.base = 2999990, .count = 100});
  EXPECT_NE(m.find(src_.passwd.string() + " line 1"), std::string::npos) << m;
  EXPECT_NE(m.find("3000000"), std::string::npos) << m;
  write(src_.group, "# comment\nsvcgrp:x:4000001:\n");
  m = refusal({.base = 4000000, .count = 2});
  EXPECT_NE(m.find(src_.group.string() + " line 2"), std::string::npos) << m;
}

TEST_F(JailIdsTest, TheTemplateRamGroupMustBeFreeAsWell) {
  write(src_.subgid, "dave:" + std::to_string(kTemplateRamGid - 10) + ":11\n");
  std::string m = refusal({});
  EXPECT_NE(m.find("template RAM group"), std::string::npos) << m;
  write(src_.subgid, "");
  m = refusal({.base = kTemplateRamGid, .count = 5});
  EXPECT_NE(m.find("template RAM group"), std::string::npos) << m;
}

TEST_F(JailIdsTest, MalformedRangesAreRefusedAndMissingFilesAreFine) {
  EXPECT_NE(refusal({.base = 2100000000, .count = 0}), "");
  EXPECT_NE(refusal({.base = 10, .count = 100}), "");            // system accounts
  EXPECT_NE(refusal({.base = 2147480000, .count = 65536}), "");  // past 2^31-1
  fs::remove_all(dir_);
  fs::create_directory(dir_);
  EXPECT_EQ(refusal({.base = 300000, .count = 100}), "");
}

TEST_F(JailIdsTest, SetMakesTheRangeTheOneInForceOnlyIfItPasses) {
  JailIdRange before = jail_ids();
  EXPECT_THROW(set_jail_ids({.base = 200000, .count = 65536}, src_), Error);
  EXPECT_EQ(jail_ids().base, before.base);
  set_jail_ids({.base = 2100000000, .count = 1000}, src_);
  EXPECT_EQ(jail_ids().count, 1000u);
  set_jail_ids(before, src_);
}

}  // namespace
}  // namespace airlock::vmm

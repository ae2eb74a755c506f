#include "e2b/access.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>

#include "common/error.h"

namespace airlock::e2b {
namespace {

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    char tmpl[] = "/tmp/airlock-e2b-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

TEST(AccessTokens, KeyIsMadeOnceOwnerOnlyAndTokensSurviveARestart) {
  TempDir d;
  auto file = d.path / "e2b-access.key";
  AccessTokens a(file);
  struct stat st {};
  ASSERT_EQ(::stat(file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(st.st_size, 32);
  std::string t = a.token_for("sb-1");
  EXPECT_EQ(t.size(), 64u);
  EXPECT_NE(t, a.token_for("sb-2"));  // one token per sandbox
  AccessTokens again(file);           // a daemon restart reads the same key
  EXPECT_EQ(again.token_for("sb-1"), t);
  EXPECT_TRUE(again.check("sb-1", t));
  EXPECT_FALSE(again.check("sb-2", t));
  EXPECT_FALSE(again.check("sb-1", t.substr(0, 63)));
  EXPECT_FALSE(again.check("sb-1", ""));
}

TEST(AccessTokens, ADifferentKeyGivesDifferentTokens) {
  EXPECT_NE(AccessTokens::from_key("k1").token_for("sb"),
            AccessTokens::from_key("k2").token_for("sb"));
}

TEST(AccessTokens, AKeyFileOthersCanReadOrOfTheWrongSizeIsRefused) {
  TempDir d;
  auto file = d.path / "k";
  { std::ofstream(file) << std::string(32, 'x'); }
  ::chmod(file.c_str(), 0644);
  try {
    AccessTokens t(file);
    FAIL() << "a world-readable key was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(file.string()), std::string::npos) << e.what();
  }
  ::chmod(file.c_str(), 0600);
  { std::ofstream(file) << "short"; }
  EXPECT_THROW(AccessTokens{file}, Error);
  // A symlink is not followed (O_NOFOLLOW).
  auto link = d.path / "link";
  std::filesystem::create_symlink(file, link);
  EXPECT_THROW(AccessTokens{link}, Error);
}

}  // namespace
}  // namespace airlock::e2b

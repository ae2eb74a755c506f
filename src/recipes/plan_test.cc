#include "recipes/plan.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "common/error.h"

namespace airlock::recipes {
namespace {
namespace fs = std::filesystem;

const char* kRecipe = R"(base = "debian"
workdir = "/app"
user = "user"
[env]
A = "1"
[apt]
packages = ["jq"]
[pip]
packages = ["x"]
[[copy]]
src = "app"
dest = "/app"
[[copy]]
src = "conf.ini"
dest = "/etc/"
[[run]]
cmd = "make"
[[run]]
cmd = "make install"
)";

Files sample_files() {
  return {{"app/main.py", 0644, "print(1)\n"},
          {"app/lib/util.py", 0755, "x = 1\n"},
          {"conf.ini", 0600, "[a]\n"},
          {"application.txt", 0644, "not under app/\n"}};
}

TEST(Plan, StepsInOrderWithGuestPaths) {
  Files files = sample_files();
  auto steps = plan_steps(parse_recipe(kRecipe, "r"), "base1", files);
  ASSERT_EQ(steps.size(), 7u);
  std::vector<std::string> kinds;
  for (const auto& s : steps) kinds.push_back(s.kind);
  EXPECT_EQ(kinds,
            (std::vector<std::string>{"apt", "pip", "copy", "copy", "run", "run", "config"}));
  ASSERT_EQ(steps[2].files.size(), 2u);
  EXPECT_EQ(steps[2].files[0].guest_path, "/app/main.py");
  EXPECT_EQ(steps[2].files[1].guest_path, "/app/lib/util.py");
  EXPECT_EQ(steps[2].files[1].mode, 0755u);
  ASSERT_EQ(steps[3].files.size(), 1u);
  EXPECT_EQ(steps[3].files[0].guest_path, "/etc/conf.ini");
  EXPECT_NE(steps[4].script.find("export A='1'"), std::string::npos) << steps[4].script;
  EXPECT_NE(steps[4].script.find("cd '/app'"), std::string::npos) << steps[4].script;
  EXPECT_NE(steps[6].script.find("id -u 'user'"), std::string::npos);
  std::set<std::string> keys;
  for (const auto& s : steps) keys.insert(s.key);
  EXPECT_EQ(keys.size(), steps.size());
}

TEST(Plan, KeysAreStableAndChainFromTheFirstChange) {
  Files files = sample_files();
  Recipe r = parse_recipe(kRecipe, "r");
  auto a = plan_steps(r, "base1", files);
  auto b = plan_steps(r, "base1", files);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].key, b[i].key);
  // A new base changes every key.
  auto c = plan_steps(r, "base2", files);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NE(a[i].key, c[i].key);
  // A changed run step: the steps before it keep their keys, it and later change.
  std::string text = kRecipe;
  text.replace(text.find("make install"), 12, "make install2");
  auto d = plan_steps(parse_recipe(text, "r"), "base1", files);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(a[i].key, d[i].key) << i;
  for (size_t i = 5; i < a.size(); ++i) EXPECT_NE(a[i].key, d[i].key) << i;
  // A copied file's content changes its copy step and all later ones.
  Files f2 = files;
  f2[2].data = "[b]\n";
  auto e = plan_steps(r, "base1", f2);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(a[i].key, e[i].key) << i;
  for (size_t i = 3; i < a.size(); ++i) EXPECT_NE(a[i].key, e[i].key) << i;
  // A file no copy selects changes nothing.
  Files f3 = files;
  f3[3].data = "other";
  auto g = plan_steps(r, "base1", f3);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].key, g[i].key);
}

TEST(Plan, ImageKeyCoversConfigButLayersDoNot) {
  Files files = sample_files();
  std::string text = kRecipe;
  Recipe r1 = parse_recipe(text, "r");
  text.replace(text.find("A = \"1\""), 7, "A = \"2\"");
  Recipe r2 = parse_recipe(text, "r");
  r2.env["A"] = "1";  // same run scripts...
  Recipe r3 = r1;
  r3.warmup = {"true"};  // ... only the warm-up differs
  auto s1 = plan_steps(r1, "b", files);
  auto s3 = plan_steps(r3, "b", files);
  EXPECT_EQ(s1.back().key, s3.back().key);
  EXPECT_NE(image_key(r1, "b", s1), image_key(r3, "b", s3));
  EXPECT_EQ(image_key(r1, "b", s1), image_key(r1, "b", plan_steps(r1, "b", files)));
}

TEST(Plan, CopyMatchingNothingIsAnError) {
  Recipe r = parse_recipe("base = \"d\"\n[[copy]]\nsrc = \"missing\"\ndest = \"/x\"\n", "r");
  try {
    plan_steps(r, "b", sample_files());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "copy[0].src");
  }
}

class CollectFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/airlock-recipe-test-XXXXXX";
    top = fs::path(::mkdtemp(tmpl));
    dir = top / "recipe";
    fs::create_directories(dir / "app" / "sub");
    write(dir / "app" / "a.txt", "A");
    write(dir / "app" / "sub" / "b.txt", "B");
    write(dir / "one.txt", "1");
    write(top / "secret.txt", "S");
  }
  void TearDown() override { fs::remove_all(top); }
  static void write(const fs::path& p, const std::string& s) { std::ofstream(p) << s; }
  Recipe recipe_copying(const std::string& src) {
    return parse_recipe("base = \"d\"\n[[copy]]\nsrc = \"" + src + "\"\ndest = \"/x\"\n", "r");
  }
  std::string error_field(const Recipe& r) {
    try {
      collect_files(dir, r);
    } catch (const Error& e) {
      return e.field() + ": " + e.what();
    }
    return "no error";
  }
  fs::path top, dir;
};

TEST_F(CollectFiles, ReadsDirectoriesAndFiles) {
  Files f = collect_files(dir, recipe_copying("app"));
  std::map<std::string, std::string> got;
  for (const auto& e : f) got[e.path] = e.data;
  EXPECT_EQ(got, (std::map<std::string, std::string>{{"app/a.txt", "A"}, {"app/sub/b.txt", "B"}}));
  f = collect_files(dir, recipe_copying("one.txt"));
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].path, "one.txt");
}

TEST_F(CollectFiles, SymlinkEscapesAreRefused) {
  fs::create_symlink(top / "secret.txt", dir / "link.txt");
  EXPECT_NE(error_field(recipe_copying("link.txt")).find("copy[0].src: "), std::string::npos);
  fs::create_symlink(top, dir / "app" / "up");
  std::string e = error_field(recipe_copying("app"));
  EXPECT_NE(e.find("copy[0].src"), std::string::npos) << e;
  EXPECT_NE(e.find("symlink out of"), std::string::npos) << e;
  fs::remove(dir / "app" / "up");
  // A symlinked directory that leads out.
  fs::create_symlink(top, dir / "outdir");
  e = error_field(recipe_copying("outdir/secret.txt"));
  EXPECT_NE(e.find("leaves the recipe's directory"), std::string::npos) << e;
  // A symlink inside the directory is fine.
  fs::create_symlink(dir / "one.txt", dir / "app" / "inner.txt");
  Files f = collect_files(dir, recipe_copying("app"));
  EXPECT_EQ(f.size(), 3u);
}

TEST_F(CollectFiles, MissingAndTooLarge) {
  EXPECT_NE(error_field(recipe_copying("nope")).find("does not exist"), std::string::npos);
  try {
    collect_files(dir, recipe_copying("app"), 1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "copy[0].src");
  }
}

TEST(ShQuote, Quotes) {
  EXPECT_EQ(sh_quote("a'b"), "'a'\\''b'");
  EXPECT_EQ(sh_quote(""), "''");
}

}  // namespace
}  // namespace airlock::recipes

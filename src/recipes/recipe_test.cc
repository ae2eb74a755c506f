#include "recipes/recipe.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace airlock::recipes {
namespace {

// The error a recipe raises: its field and message.
std::pair<std::string, std::string> error_of(const std::string& text,
                                             const std::map<std::string, std::string>& args = {}) {
  try {
    parse_recipe(text, "airlock.toml", args);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    return {e.field(), e.what()};
  }
  ADD_FAILURE() << "no error for:\n" << text;
  return {};
}

const char* kFull = R"(base = "debian"
workdir = "/home/user/app"
user = "user"
warmup = ["python3 -c 'import json'", "true"]

[args]
mirror = "http://pkgs.example.com:8080"

[env]
LANG = "C.UTF-8"
MIRROR = "${mirror}"

[apt]
sources = ["deb [trusted=yes] ${mirror}/apt ./"]
packages = ["airlock-hello", "jq=1.6-2"]

[pip]
index_url = "${mirror}/simple"
trusted_host = true
packages = ["airlock-wheel==1.0"]

[[copy]]
src = "app/"
dest = "/home/user/app"
owner = "user"
mode = "0755"

[[copy]]
src = "./data.csv"
dest = "/srv/"

[[run]]
cmd = "echo built > /etc/built"
timeout = 60

[[run]]
cmd = "echo $$HOME"

[build]
memory_mb = 512
)";

TEST(Recipe, EveryField) {
  Recipe r = parse_recipe(kFull, "airlock.toml");
  EXPECT_EQ(r.base, "debian");
  EXPECT_EQ(r.workdir, "/home/user/app");
  EXPECT_EQ(r.user, "user");
  EXPECT_EQ(r.warmup, (std::vector<std::string>{"python3 -c 'import json'", "true"}));
  EXPECT_EQ(r.args.at("mirror"), "http://pkgs.example.com:8080");
  EXPECT_EQ(r.env.at("LANG"), "C.UTF-8");
  EXPECT_EQ(r.env.at("MIRROR"), "http://pkgs.example.com:8080");
  EXPECT_EQ(r.apt_sources,
            std::vector<std::string>{"deb [trusted=yes] http://pkgs.example.com:8080/apt ./"});
  EXPECT_EQ(r.apt_packages, (std::vector<std::string>{"airlock-hello", "jq=1.6-2"}));
  EXPECT_EQ(r.pip_index_url, "http://pkgs.example.com:8080/simple");
  EXPECT_TRUE(r.pip_trusted_host);
  EXPECT_EQ(r.pip_packages, std::vector<std::string>{"airlock-wheel==1.0"});
  ASSERT_EQ(r.copies.size(), 2u);
  EXPECT_EQ(r.copies[0].src, "app");
  EXPECT_EQ(r.copies[0].dest, "/home/user/app");
  EXPECT_EQ(r.copies[0].owner, "user");
  EXPECT_EQ(r.copies[0].mode, 0755u);
  EXPECT_EQ(r.copies[1].src, "data.csv");
  EXPECT_EQ(r.copies[1].dest, "/srv/");
  EXPECT_FALSE(r.copies[1].mode);
  ASSERT_EQ(r.runs.size(), 2u);
  EXPECT_EQ(r.runs[0].cmd, "echo built > /etc/built");
  EXPECT_EQ(r.runs[0].timeout_s, 60);
  EXPECT_EQ(r.runs[0].line, 32);
  EXPECT_EQ(r.runs[1].cmd, "echo $HOME");  // $$ is a literal $
  EXPECT_EQ(r.runs[1].timeout_s, 1800);
  EXPECT_EQ(r.memory_mb, 512);
  // The network defaults to the hosts of the package sources the recipe names.
  EXPECT_EQ(r.network_mode, "allowlist");
  EXPECT_EQ(r.network_allow, std::vector<std::string>{"pkgs.example.com"});
}

TEST(Recipe, MinimalRecipeHasNoNetwork) {
  Recipe r = parse_recipe("base = \"minimal\"\n", "r.toml");
  EXPECT_EQ(r.base, "minimal");
  EXPECT_EQ(r.network_mode, "none");
  EXPECT_TRUE(r.network_allow.empty());
  EXPECT_TRUE(r.copies.empty());
  EXPECT_TRUE(r.runs.empty());
}

TEST(Recipe, ArgOverrides) {
  Recipe r = parse_recipe(kFull, "airlock.toml", {{"mirror", "http://m.test"}});
  EXPECT_EQ(r.pip_index_url, "http://m.test/simple");
  EXPECT_EQ(r.network_allow, std::vector<std::string>{"m.test"});
  auto [field, msg] = error_of(kFull, {{"nope", "x"}});
  EXPECT_EQ(field, "args.nope");
  EXPECT_NE(msg.find("declares no such arg"), std::string::npos) << msg;
}

TEST(Recipe, ExplicitNetwork) {
  Recipe r = parse_recipe(
      "base = \"debian\"\n[pip]\nindex_url = \"http://a.test/simple\"\npackages = [\"x\"]\n"
      "[network]\nallow = [\"b.test\", \"*.c.test\"]\n",
      "r.toml");
  EXPECT_EQ(r.network_allow, (std::vector<std::string>{"b.test", "*.c.test"}));
  r = parse_recipe("base = \"debian\"\n[network]\nmode = \"open\"\n", "r.toml");
  EXPECT_EQ(r.network_mode, "open");
  r = parse_recipe(
      "base = \"debian\"\n[pip]\nindex_url = \"http://a.test/\"\npackages = [\"x\"]\n"
      "[network]\nmode = \"none\"\n",
      "r.toml");
  EXPECT_EQ(r.network_mode, "none");
}

TEST(Recipe, UnknownKeysNameKeyAndLine) {
  auto [f1, m1] = error_of("base = \"debian\"\n\nbsae = 1\n");
  EXPECT_EQ(f1, "bsae");
  EXPECT_NE(m1.find("airlock.toml:3"), std::string::npos) << m1;
  EXPECT_NE(m1.find("unknown key 'bsae'"), std::string::npos) << m1;
  auto [f2, m2] = error_of("base = \"debian\"\n[apt]\npakages = [\"x\"]\n");
  EXPECT_EQ(f2, "apt.pakages");
  EXPECT_NE(m2.find("airlock.toml:3"), std::string::npos) << m2;
  EXPECT_NE(m2.find("in [apt]"), std::string::npos) << m2;
  auto [f3, m3] =
      error_of("base = \"debian\"\n[[copy]]\nsrc = \"a\"\ndest = \"/a\"\nown = \"x\"\n");
  EXPECT_EQ(f3, "copy[0].own");
  EXPECT_NE(m3.find(":5"), std::string::npos) << m3;
  auto [f4, m4] = error_of("base = \"debian\"\n[[run]]\ncmd = \"x\"\n[[run]]\ncommand = \"y\"\n");
  EXPECT_EQ(f4, "run[1].command");
  EXPECT_EQ(error_of("base = \"d\"\n[pip]\npackages = [\"x\"]\nindex = \"u\"\n").first,
            "pip.index");
  EXPECT_EQ(error_of("base = \"d\"\n[network]\ndeny = []\n").first, "network.deny");
  EXPECT_EQ(error_of("base = \"d\"\n[build]\ncpus = 2\n").first, "build.cpus");
}

TEST(Recipe, SyntaxErrorNamesLine) {
  auto [field, msg] = error_of("base = \"debian\"\nworkdir = \n");
  EXPECT_NE(msg.find("airlock.toml:2"), std::string::npos) << msg;
}

TEST(Recipe, BadTypes) {
  EXPECT_EQ(error_of("base = 3\n").first, "base");
  EXPECT_EQ(error_of("").first, "base");
  EXPECT_EQ(error_of("base = \"\"\n").first, "base");
  EXPECT_EQ(error_of("base = \"d\"\nworkdir = [\"/x\"]\n").first, "workdir");
  EXPECT_EQ(error_of("base = \"d\"\nuser = 1000\n").first, "user");
  EXPECT_EQ(error_of("base = \"d\"\nwarmup = \"true\"\n").first, "warmup");
  EXPECT_EQ(error_of("base = \"d\"\nwarmup = [1]\n").first, "warmup[0]");
  EXPECT_EQ(error_of("base = \"d\"\nwarmup = [\"\"]\n").first, "warmup[0]");
  EXPECT_EQ(error_of("base = \"d\"\nenv = \"x\"\n").first, "env");
  EXPECT_EQ(error_of("base = \"d\"\n[env]\nA = 1\n").first, "env.A");
  EXPECT_EQ(error_of("base = \"d\"\n[env]\n1A = \"x\"\n").first, "env.1A");
  EXPECT_EQ(error_of("base = \"d\"\napt = [\"x\"]\n").first, "apt");
  EXPECT_EQ(error_of("base = \"d\"\n[apt]\npackages = \"jq\"\n").first, "apt.packages");
  EXPECT_EQ(error_of("base = \"d\"\n[apt]\npackages = [\"-oFoo\"]\n").first, "apt.packages[0]");
  EXPECT_EQ(error_of("base = \"d\"\n[apt]\npackages = [\"a b\"]\n").first, "apt.packages[0]");
  EXPECT_EQ(error_of("base = \"d\"\n[apt]\nsources = [\"http://x\"]\npackages = [\"a\"]\n").first,
            "apt.sources[0]");
  EXPECT_EQ(error_of("base = \"d\"\n[apt]\nsources = [\"deb http://x ./\"]\n").first,
            "apt.packages");
  EXPECT_EQ(error_of("base = \"d\"\n[pip]\npackages = []\n").first, "pip.packages");
  EXPECT_EQ(error_of("base = \"d\"\n[pip]\nindex_url = \"ftp://x\"\npackages = [\"a\"]\n").first,
            "pip.index_url");
  EXPECT_EQ(error_of("base = \"d\"\n[pip]\ntrusted_host = \"yes\"\npackages = [\"a\"]\n").first,
            "pip.trusted_host");
  EXPECT_EQ(error_of("base = \"d\"\n[pip]\npackages = [\"a; rm -rf /\"]\n").first,
            "pip.packages[0]");
  EXPECT_EQ(error_of("base = \"d\"\n[copy]\nsrc = \"a\"\ndest = \"/a\"\n").first, "copy");
  EXPECT_EQ(error_of("base = \"d\"\n[[copy]]\ndest = \"/a\"\n").first, "copy[0].src");
  EXPECT_EQ(error_of("base = \"d\"\n[[copy]]\nsrc = \"a\"\n").first, "copy[0].dest");
  EXPECT_EQ(error_of("base = \"d\"\n[[copy]]\nsrc = \"a\"\ndest = \"rel\"\n").first,
            "copy[0].dest");
  EXPECT_EQ(error_of("base = \"d\"\n[[copy]]\nsrc = \"a\"\ndest = \"/a/../../etc\"\n").first,
            "copy[0].dest");
  EXPECT_EQ(error_of("base = \"d\"\n[[copy]]\nsrc = \"a\"\ndest = \"/a\"\nmode = 755\n").first,
            "copy[0].mode");
  EXPECT_EQ(error_of("base = \"d\"\n[[copy]]\nsrc = \"a\"\ndest = \"/a\"\nmode = \"0999\"\n").first,
            "copy[0].mode");
  EXPECT_EQ(error_of("base = \"d\"\n[[copy]]\nsrc = \"a\"\ndest = \"/a\"\nowner = \"a b\"\n").first,
            "copy[0].owner");
  EXPECT_EQ(error_of("base = \"d\"\nrun = \"make\"\n").first, "run");
  EXPECT_EQ(error_of("base = \"d\"\n[[run]]\ntimeout = 5\n").first, "run[0].cmd");
  EXPECT_EQ(error_of("base = \"d\"\n[[run]]\ncmd = \"\"\n").first, "run[0].cmd");
  EXPECT_EQ(error_of("base = \"d\"\n[[run]]\ncmd = \"x\"\ntimeout = 0\n").first, "run[0].timeout");
  EXPECT_EQ(error_of("base = \"d\"\n[[run]]\ncmd = \"x\"\ntimeout = \"5\"\n").first,
            "run[0].timeout");
  EXPECT_EQ(error_of("base = \"d\"\n[network]\nmode = \"wide\"\n").first, "network.mode");
  EXPECT_EQ(error_of("base = \"d\"\n[network]\nallow = \"a.test\"\n").first, "network.allow");
  EXPECT_EQ(error_of("base = \"d\"\n[build]\nmemory_mb = 10\n").first, "build.memory_mb");
  EXPECT_EQ(error_of("base = \"d\"\n[args]\nx = 1\n").first, "args.x");
  EXPECT_EQ(error_of("base = \"d\"\n[args]\n\"a b\" = \"1\"\n").first, "args.a b");
}

TEST(Recipe, UndefinedArg) {
  auto [field, msg] = error_of("base = \"d\"\nworkdir = \"/${nope}\"\n");
  EXPECT_EQ(field, "workdir");
  EXPECT_NE(msg.find("${nope}"), std::string::npos) << msg;
  EXPECT_EQ(error_of("base = \"d\"\nworkdir = \"/${x\"\n").first, "workdir");
}

TEST(Recipe, CopyPathEscapesAreRefused) {
  for (const char* src : {"../x", "a/../../x", "/etc/passwd", "", "./../x"}) {
    auto [field, msg] =
        error_of(std::string("base = \"d\"\n[[copy]]\nsrc = \"") + src + "\"\ndest = \"/x\"\n");
    EXPECT_EQ(field, "copy[0].src") << src;
    EXPECT_NE(msg.find("airlock.toml:3"), std::string::npos) << msg;
  }
  // Inside is fine, normalised.
  Recipe r = parse_recipe("base = \"d\"\n[[copy]]\nsrc = \"a/../b/./c/\"\ndest = \"/x\"\n", "r");
  EXPECT_EQ(r.copies[0].src, "b/c");
  r = parse_recipe("base = \"d\"\n[[copy]]\nsrc = \".\"\ndest = \"/x\"\n", "r");
  EXPECT_EQ(r.copies[0].src, ".");
}

TEST(Recipe, NormalizeAndUrlHost) {
  EXPECT_EQ(normalize_relative("a//b/", "f"), "a/b");
  EXPECT_THROW(normalize_relative("..", "f"), Error);
  EXPECT_EQ(url_host("http://h.test:8080/x"), "h.test");
  EXPECT_EQ(url_host("https://u:p@h.test/x"), "h.test");
  EXPECT_EQ(url_host("http://[2001:db8::1]:80/"), "2001:db8::1");
  EXPECT_EQ(url_host("ftp://h.test/"), "");
  EXPECT_EQ(url_host("./"), "");
}

}  // namespace
}  // namespace airlock::recipes

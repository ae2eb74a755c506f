// The file operations E2B's filesystem service needs (list with depth, move,
// owner, stat's owner/group/symlink target), called in-process: the framing
// around them is covered by agent_test.cc.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "guest/ops.h"
#include "guest/users.h"

namespace airlock::guest {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct TempDir {
  fs::path dir = fs::temp_directory_path() / ("airlock-files-test-" + std::to_string(getpid()));
  TempDir() {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~TempDir() { fs::remove_all(dir); }
  std::string operator/(const std::string& p) const { return (dir / p).string(); }
};

// The guest error code a call throws ("" if none).
template <class F>
std::string code_of(F f) {
  try {
    f();
  } catch (const GuestError& e) {
    return e.code();
  } catch (const Error& e) {
    return e.code() == Errc::invalid_argument ? "invalid_argument" : "other";
  }
  return "";
}

TEST(Files, ListWithDepthGivesPathsDepthFirst) {
  TempDir t;
  fs::create_directories(t / "a/b/c");
  std::ofstream(t / "a/f.txt") << "hello";
  std::ofstream(t / "z.txt") << "z";
  json one = op_list({{"path", t.dir.string()}});
  ASSERT_EQ(one["entries"].size(), 2u);
  EXPECT_EQ(one["entries"][0]["path"], t / "a");
  EXPECT_EQ(one["entries"][1]["name"], "z.txt");
  json two = op_list({{"path", t.dir.string()}, {"depth", 2}});
  std::vector<std::string> paths;
  for (auto& e : two["entries"]) paths.push_back(e["path"]);
  EXPECT_EQ(paths, (std::vector<std::string>{t / "a", t / "a/b", t / "a/f.txt", t / "z.txt"}));
  EXPECT_EQ(op_list({{"path", t.dir.string()}, {"depth", 9}})["entries"].size(), 5u);
  EXPECT_EQ(code_of([&] {
              op_list({{"path", t.dir.string()}, {"depth", 0}});
            }),
            "invalid_argument");
  EXPECT_EQ(code_of([&] { op_list({{"path", t / "z.txt"}}); }), "not_a_directory");
  EXPECT_EQ(code_of([&] { op_list({{"path", t / "nope"}}); }), "not_found");
}

TEST(Files, ListIsBoundedToOneFrame) {
  TempDir t;
  for (int i = 0; i < 800; ++i) std::ofstream(t / ("file-with-a-long-name-" + std::to_string(i)));
  json r = op_list({{"path", t.dir.string()}, {"depth", 3}});
  EXPECT_TRUE(r.value("truncated", false));
  EXPECT_LT(r.dump().size(), 65536u);
  EXPECT_GT(r["entries"].size(), 10u);
  // The next page starts where this one stopped; together they are all.
  size_t first = r["entries"].size();
  json next = op_list({{"path", t.dir.string()}, {"depth", 3}, {"offset", first}});
  EXPECT_NE(next["entries"][0]["name"], r["entries"][first - 1]["name"]);
  json all = r["entries"];
  while (true) {
    for (auto& e : next["entries"]) all.push_back(e);
    if (!next.value("truncated", false)) break;
    next = op_list({{"path", t.dir.string()}, {"offset", all.size()}});
  }
  EXPECT_EQ(all.size(), 800u);
}

TEST(Files, StatHasOwnerGroupAndSymlinkTarget) {
  TempDir t;
  std::ofstream(t / "f") << "abc";
  fs::create_symlink(t / "f", t / "link");
  fs::create_symlink(t / "missing", t / "dangling");
  json f = op_stat({{"path", t / "f"}});
  EXPECT_EQ(f["path"], t / "f");
  EXPECT_EQ(f["owner"], user_name(getuid()));
  EXPECT_EQ(f["group"], group_name(getgid()));
  EXPECT_FALSE(f.contains("target"));
  json l = op_stat({{"path", t / "link"}});
  EXPECT_EQ(l["type"], "symlink");
  EXPECT_EQ(l["target"], fs::canonical(t / "f").string());
  EXPECT_EQ(l["target_type"], "file");
  json d = op_stat({{"path", t / "dangling"}});
  EXPECT_EQ(d["target"], t / "dangling");
  EXPECT_FALSE(d.contains("target_type"));
}

TEST(Files, MoveRenamesMakesParentsAndAnswersTheNewEntry) {
  TempDir t;
  std::ofstream(t / "a") << "data";
  json e = op_move({{"path", t / "a"}, {"dest", t / "x/y/b"}, {"parents", true}});
  EXPECT_EQ(e["path"], t / "x/y/b");
  EXPECT_EQ(e["name"], "b");
  EXPECT_EQ(e["size"], 4);
  EXPECT_FALSE(fs::exists(t / "a"));
  EXPECT_EQ(code_of([&] { op_move({{"path", t / "a"}, {"dest", t / "c"}}); }), "not_found");
  EXPECT_EQ(code_of([&] { op_move({{"path", t / "x/y/b"}, {"dest", t / "q/b"}}); }), "not_found");
  EXPECT_EQ(code_of([&] {
              op_move({{"path", t / "x/y/b"}, {"dest", "rel"}});
            }),
            "invalid_argument");
  EXPECT_EQ(code_of([&] { op_move({{"path", t / "x/y/b"}}); }), "invalid_argument");
  EXPECT_EQ(code_of([&] { op_move({{"path", "/"}, {"dest", t / "r"}}); }), "invalid_argument");
  // A directory onto a non-empty directory: the kernel's answer.
  fs::create_directories(t / "full/x");
  EXPECT_EQ(code_of([&] { op_move({{"path", t / "x"}, {"dest", t / "full"}}); }), "not_empty");
}

TEST(Files, OwnerChownsWhatIsCreated) {
  if (getuid() != 0) GTEST_SKIP() << "chown needs root";
  auto nobody = lookup_user("nobody");
  if (!nobody) GTEST_SKIP() << "no user nobody here";
  TempDir t;
  op_mkdir({{"path", t / "p/q"}, {"parents", true}, {"owner", "nobody"}});
  struct stat st {};
  ASSERT_EQ(stat((t / "p/q").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, nobody->uid);
  ASSERT_EQ(stat((t / "p").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, nobody->uid);
  ASSERT_EQ(stat(t.dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 0u);  // existing directories are left alone
  std::ofstream(t / "f") << "x";
  op_move({{"path", t / "f"}, {"dest", t / "n/f"}, {"parents", true}, {"owner", "nobody"}});
  ASSERT_EQ(stat((t / "n").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, nobody->uid);
  EXPECT_EQ(code_of([&] {
              op_mkdir({{"path", t / "u"}, {"owner", "no-such-user-x"}});
            }),
            "not_found");
  EXPECT_FALSE(fs::exists(t / "u"));
  EXPECT_EQ(code_of([&] { op_mkdir({{"path", t / "u"}, {"owner", 5}}); }), "invalid_argument");
}

}  // namespace
}  // namespace airlock::guest

// The inotify logic of the guest's watch (watch.h) on a temporary directory
// of the host: event kinds, rename pairing, recursion into new directories,
// the bounded queue and the caps.
#include "guest/watch.h"

#include <gtest/gtest.h>
#include <poll.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>

#include "guest/ops.h"

namespace airlock::guest {
namespace {

namespace fs = std::filesystem;

class WatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/airlock-watch-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  static void write(const std::string& path, const std::string& text) {
    std::ofstream(path, std::ios::app) << text;
  }

  // Reads events until `done` says so or 5 s pass; returns all of them.
  static std::vector<WatchEvent> collect(Watcher& w,
                                         const std::function<bool(const WatchEvent&)>& done) {
    std::vector<WatchEvent> out;
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < until) {
      pollfd p{w.fd(), POLLIN, 0};
      poll(&p, 1, 50);
      w.read_events();
      bool hit = false;
      while (const WatchEvent* e = w.front()) {
        out.push_back(*e);
        w.pop();
        if (done(out.back())) hit = true;
      }
      if (hit || !w.ended().empty()) return out;
    }
    return out;
  }
  static std::vector<WatchEvent> until_path(Watcher& w, const std::string& type,
                                            const std::string& path) {
    return collect(w, [&](const WatchEvent& e) { return e.type == type && e.path == path; });
  }
  static bool has(const std::vector<WatchEvent>& evs, const std::string& type,
                  const std::string& path) {
    for (const auto& e : evs)
      if (e.type == type && e.path == path) return true;
    return false;
  }

  std::string dir_;
  WatchBudget budget_;
};

TEST_F(WatchTest, CreateModifyDeleteRename) {
  Watcher w(dir_, false, budget_);
  EXPECT_EQ(w.dirs(), 1u);
  write(dir_ + "/a", "x");
  auto evs = until_path(w, "modified", dir_ + "/a");
  ASSERT_TRUE(has(evs, "created", dir_ + "/a"));
  EXPECT_FALSE(evs.front().is_dir);

  fs::rename(dir_ + "/a", dir_ + "/b");
  evs = until_path(w, "renamed", dir_ + "/b");
  ASSERT_FALSE(evs.empty());
  EXPECT_EQ(evs.back().old_path, dir_ + "/a");
  EXPECT_FALSE(has(evs, "deleted", dir_ + "/a"));  // paired, not deleted + created

  fs::remove(dir_ + "/b");
  evs = until_path(w, "deleted", dir_ + "/b");
  ASSERT_TRUE(has(evs, "deleted", dir_ + "/b"));

  fs::create_directory(dir_ + "/d");
  evs = until_path(w, "created", dir_ + "/d");
  ASSERT_FALSE(evs.empty());
  EXPECT_TRUE(evs.back().is_dir);
  EXPECT_EQ(evs.back().to_json().dump(),
            nlohmann::json({{"type", "created"}, {"path", dir_ + "/d"}, {"is_dir", true}}).dump());
}

TEST_F(WatchTest, RepeatedWritesAreOneModified) {
  write(dir_ + "/f", "");
  Watcher w(dir_, false, budget_);
  for (int i = 0; i < 100; ++i) write(dir_ + "/f", "more");
  write(dir_ + "/g", "");
  auto evs = until_path(w, "created", dir_ + "/g");
  int modified = 0;
  for (const auto& e : evs) modified += e.type == "modified" && e.path == dir_ + "/f";
  EXPECT_GE(modified, 1);
  EXPECT_LT(modified, 100);
}

TEST_F(WatchTest, NonRecursiveIgnoresSubdirectories) {
  fs::create_directory(dir_ + "/sub");
  Watcher w(dir_, false, budget_);
  write(dir_ + "/sub/inner", "x");
  write(dir_ + "/top", "x");
  auto evs = until_path(w, "created", dir_ + "/top");
  ASSERT_TRUE(has(evs, "created", dir_ + "/top"));
  EXPECT_FALSE(has(evs, "created", dir_ + "/sub/inner"));
}

TEST_F(WatchTest, RecursiveFollowsNewDirectoriesAndReportsTheirContents) {
  fs::create_directories(dir_ + "/old/deep");
  Watcher w(dir_, true, budget_);
  EXPECT_EQ(w.dirs(), 3u);
  write(dir_ + "/old/deep/f", "x");
  auto evs = until_path(w, "created", dir_ + "/old/deep/f");
  ASSERT_TRUE(has(evs, "created", dir_ + "/old/deep/f"));

  // Made in one go before the watcher reads anything: the inner levels exist
  // before their watches do, so they are found by scanning.
  fs::create_directories(dir_ + "/new/a/b");
  write(dir_ + "/new/a/b/file", "x");
  evs = until_path(w, "created", dir_ + "/new/a/b/file");
  ASSERT_TRUE(has(evs, "created", dir_ + "/new"));
  ASSERT_TRUE(has(evs, "created", dir_ + "/new/a"));
  ASSERT_TRUE(has(evs, "created", dir_ + "/new/a/b"));
  EXPECT_EQ(w.dirs(), 6u);
  // And the new directories are watched from now on.
  write(dir_ + "/new/a/b/later", "x");
  evs = until_path(w, "created", dir_ + "/new/a/b/later");
  ASSERT_TRUE(has(evs, "created", dir_ + "/new/a/b/later"));
  EXPECT_EQ(budget_.dirs, 6u);
}

TEST_F(WatchTest, RenamedDirectoryKeepsCorrectPaths) {
  fs::create_directories(dir_ + "/x");
  Watcher w(dir_, true, budget_);
  fs::rename(dir_ + "/x", dir_ + "/y");
  auto evs = until_path(w, "renamed", dir_ + "/y");
  ASSERT_FALSE(evs.empty());
  EXPECT_TRUE(evs.back().is_dir);
  write(dir_ + "/y/f", "x");
  evs = until_path(w, "created", dir_ + "/y/f");
  ASSERT_TRUE(has(evs, "created", dir_ + "/y/f"));
}

TEST_F(WatchTest, MovesAcrossTheBoundaryAreDeletedAndCreated) {
  fs::create_directories(dir_ + "/in");
  fs::create_directories(dir_ + "/out");
  write(dir_ + "/in/f", "x");
  Watcher w(dir_ + "/in", true, budget_);
  fs::rename(dir_ + "/in/f", dir_ + "/out/f");
  auto evs = until_path(w, "deleted", dir_ + "/in/f");
  ASSERT_TRUE(has(evs, "deleted", dir_ + "/in/f"));
  fs::rename(dir_ + "/out/f", dir_ + "/in/g");
  evs = until_path(w, "created", dir_ + "/in/g");
  ASSERT_TRUE(has(evs, "created", dir_ + "/in/g"));
  // A directory moved out stops being watched.
  fs::create_directories(dir_ + "/in/sub");
  until_path(w, "created", dir_ + "/in/sub");
  EXPECT_EQ(w.dirs(), 2u);
  fs::rename(dir_ + "/in/sub", dir_ + "/out/sub");
  until_path(w, "deleted", dir_ + "/in/sub");
  EXPECT_EQ(w.dirs(), 1u);
  EXPECT_EQ(budget_.dirs, 1u);
}

TEST_F(WatchTest, QueueIsBoundedAndOverflowCountsTheDropped) {
  Watcher w(dir_, false, budget_, /*max_queue=*/10);
  for (int i = 0; i < 50; ++i) write(dir_ + "/f" + std::to_string(i), "");
  // Nothing consumed while the kernel queue is read: the queue never grows
  // past its bound plus the one overflow entry.
  for (int i = 0; i < 20; ++i) {
    pollfd p{w.fd(), POLLIN, 0};
    poll(&p, 1, 20);
    w.read_events();
    ASSERT_LE(w.queued(), 11u);
  }
  std::vector<WatchEvent> evs;
  while (const WatchEvent* e = w.front()) {
    evs.push_back(*e);
    w.pop();
  }
  ASSERT_EQ(evs.size(), 11u);
  EXPECT_EQ(evs.back().type, "overflow");
  EXPECT_GT(evs.back().dropped, 0u);
  EXPECT_EQ(evs.back().dropped, w.dropped_total());
  // 50 files, one `created` each at least (their empty write adds nothing).
  EXPECT_GE(10 + evs.back().dropped, 50u);
  EXPECT_EQ(evs.back().to_json()["dropped"], evs.back().dropped);
  // After the gap, events flow again.
  write(dir_ + "/after", "");
  auto more = until_path(w, "created", dir_ + "/after");
  ASSERT_TRUE(has(more, "created", dir_ + "/after"));
}

TEST_F(WatchTest, ErrorsAreClear) {
  try {
    Watcher w(dir_ + "/missing", false, budget_);
    FAIL() << "watched a missing directory";
  } catch (const GuestError& e) {
    EXPECT_STREQ(e.code(), "not_found");
    EXPECT_NE(std::string(e.what()).find(dir_ + "/missing"), std::string::npos) << e.what();
  }
  write(dir_ + "/file", "x");
  try {
    Watcher w(dir_ + "/file", false, budget_);
    FAIL() << "watched a file";
  } catch (const GuestError& e) {
    EXPECT_STREQ(e.code(), "not_a_directory");
  }
  EXPECT_EQ(budget_.watches, 0u);
  EXPECT_EQ(budget_.dirs, 0u);
}

TEST_F(WatchTest, CapsOnWatchesAndDirectoriesAndRelease) {
  budget_.max_watches = 2;
  budget_.max_dirs = 3;
  fs::create_directories(dir_ + "/a/b/c");
  try {
    Watcher w(dir_, true, budget_);  // 4 directories
    FAIL() << "the directory cap did not hold";
  } catch (const GuestError& e) {
    EXPECT_STREQ(e.code(), "no_space");
    EXPECT_NE(std::string(e.what()).find("limit"), std::string::npos) << e.what();
  }
  EXPECT_EQ(budget_.dirs, 0u);  // nothing held after the failure
  EXPECT_EQ(budget_.watches, 0u);
  try {
    Watcher one(dir_ + "/a", true, budget_);  // a, b, c
    EXPECT_EQ(budget_.dirs, 3u);
    Watcher two(dir_, false, budget_);  // over the directory cap
    FAIL() << "a fourth directory was watched";
  } catch (const GuestError& e) {
    EXPECT_STREQ(e.code(), "no_space");
  }
  EXPECT_EQ(budget_.dirs, 0u);
  {
    Watcher one(dir_ + "/a/b/c", false, budget_);
    Watcher two(dir_ + "/a/b", false, budget_);
    EXPECT_EQ(budget_.watches, 2u);
    EXPECT_THROW(Watcher(dir_, false, budget_), GuestError);
  }
  EXPECT_EQ(budget_.watches, 0u);
  // A new subdirectory past the cap ends the watch with watch_limit.
  budget_.max_dirs = 1;
  Watcher w(dir_ + "/a/b/c", true, budget_);
  fs::create_directory(dir_ + "/a/b/c/new");
  auto evs = until_path(w, "created", dir_ + "/a/b/c/new");
  ASSERT_TRUE(has(evs, "created", dir_ + "/a/b/c/new"));
  EXPECT_EQ(w.ended(), "watch_limit");
  EXPECT_NE(w.ended_message().find("limit"), std::string::npos);
}

TEST_F(WatchTest, RootRemovedEndsTheWatch) {
  fs::create_directories(dir_ + "/r");
  Watcher w(dir_ + "/r", false, budget_);
  fs::remove(dir_ + "/r");
  collect(w, [](const WatchEvent&) { return false; });
  EXPECT_EQ(w.ended(), "path_deleted");
}

}  // namespace
}  // namespace airlock::guest

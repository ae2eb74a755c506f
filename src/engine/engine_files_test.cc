// The E2B-oriented file operations (engine_files.cc) through the real engine
// and the real airlock-guest on the fake launcher (the guest's files are
// the host's: a temp dir stands in for the sandbox's disk).
#include <gtest/gtest.h>
#include <unistd.h>

#include "engine/engine_fake_test_support.h"

namespace airlock::engine {
namespace {

namespace fs = std::filesystem;

class EngineFiles : public testing::FakeVmTest {};

Errc code_of(const std::function<void()>& f, std::string* field = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (field) *field = e.field();
    return e.code();
  }
  return Errc::internal;  // no error: never what a test expects here
}

TEST_F(EngineFiles, ListDepthMoveMkdirAndEntriesAsTheHostRebuiltThem) {
  Engine engine(cfg_);
  SandboxInfo sb = engine.create({.image = "minimal"});
  const std::string root = (data_ / "guest-files").string();
  engine.make_dir_as(sb.id, root + "/a/b", "");
  uint64_t n = engine.write_file_as(
      sb.id, root + "/a/f.txt", 0640,
      [sent = false]() mutable -> std::optional<std::string> {
        if (sent) return std::nullopt;
        sent = true;
        return std::string("hello");
      },
      "");
  EXPECT_EQ(n, 5u);
  auto ls = engine.list_files(sb.id, root, 2);
  ASSERT_EQ(ls["entries"].size(), 3u);
  EXPECT_EQ(ls["entries"][0]["path"], root + "/a");
  EXPECT_EQ(ls["entries"][1]["path"], root + "/a/b");
  EXPECT_EQ(ls["entries"][2]["path"], root + "/a/f.txt");
  EXPECT_EQ(ls["entries"][2]["mode"], 0640);
  EXPECT_TRUE(ls["entries"][2]["owner"].is_string());
  EXPECT_EQ(engine.list_files(sb.id, root, 1)["entries"].size(), 1u);
  std::string field;
  EXPECT_EQ(code_of([&] { engine.list_files(sb.id, root, 0); }, &field), Errc::invalid_argument);
  EXPECT_EQ(field, "depth");

  auto moved = engine.move_file(sb.id, root + "/a/f.txt", root + "/c/d/g.txt");
  EXPECT_EQ(moved["path"], root + "/c/d/g.txt");
  EXPECT_EQ(moved["size"], 5);
  EXPECT_FALSE(fs::exists(root + "/a/f.txt"));
  EXPECT_EQ(code_of([&] { engine.move_file(sb.id, root + "/a/f.txt", root + "/x"); }),
            Errc::not_found);
  EXPECT_EQ(code_of([&] { engine.move_file(sb.id, root + "/c", "relative"); }, &field),
            Errc::invalid_argument);
  EXPECT_EQ(field, "destination");
  EXPECT_EQ(code_of([&] { engine.make_dir_as(sb.id, root + "/u", "no-such-user-x"); }, &field),
            Errc::not_found);
  EXPECT_EQ(field, "user");
  EXPECT_FALSE(fs::exists(root + "/u"));
  auto st = engine.stat_file(sb.id, root + "/c/d/g.txt");
  EXPECT_EQ(st["name"], "g.txt");
  // Moves are journaled like the other file changes.
  bool journaled = false;
  for (auto& r : engine.audit(sb.id))
    if (r.value("event", "") == "file" && r.value("op", "") == "move") journaled = true;
  EXPECT_TRUE(journaled);
  testing::destroy_wait(engine, sb.id);
}

}  // namespace
}  // namespace airlock::engine

#include "engine/audit/journal.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include "common/error.h"

namespace airlock::engine {
namespace {

namespace fs = std::filesystem;

class JournalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "airlock-audit-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(JournalTest, AppendsRecordsWithCommonFields) {
  AuditJournal j(dir_ / "audit");
  j.append("sb-1", "created", {{"image", "minimal"}, {"boot_ms", 3400}}, Durability::sync);
  j.append("sb-1", "exec", {{"argv", {"sh", "-c", "exit 7"}}, {"exit_code", 7}});
  auto recs = j.read("sb-1");
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[0]["event"], "created");
  EXPECT_EQ(recs[0]["sandbox"], "sb-1");
  EXPECT_EQ(recs[0]["image"], "minimal");
  EXPECT_EQ(recs[1]["exit_code"], 7);
  EXPECT_EQ(recs[1]["argv"][2], "exit 7");
  std::regex ts(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)");
  EXPECT_TRUE(std::regex_match(recs[0]["ts"].get<std::string>(), ts)) << recs[0]["ts"];
}

TEST_F(JournalTest, FieldsCannotForgeCommonKeys) {
  AuditJournal j(dir_);
  j.append("sb-1", "exec", {{"event", "deleted"}, {"sandbox", "sb-2"}});
  auto recs = j.read("sb-1");
  EXPECT_EQ(recs[0]["event"], "exec");
  EXPECT_EQ(recs[0]["sandbox"], "sb-1");
}

TEST_F(JournalTest, KeyOrderPutsCommonFieldsFirst) {
  AuditJournal j(dir_);
  j.append("sb-1", "deleted", {{"a", 1}});
  std::ifstream in(j.path_of("sb-1"));
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line.rfind("{\"ts\":", 0), 0u) << line;
  EXPECT_NE(line.find("\"sandbox\":\"sb-1\",\"event\":\"deleted\""), std::string::npos) << line;
}

TEST_F(JournalTest, RejectsPathLikeIds) {
  AuditJournal j(dir_);
  for (const std::string& bad :
       std::vector<std::string>{"", "../etc", "a/b", "sb 1", std::string(65, 'a')}) {
    try {
      j.append(bad, "created");
      FAIL() << "accepted id " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_argument);
      EXPECT_EQ(e.field(), "id");
    }
  }
}

TEST_F(JournalTest, MissingJournalIsNotFound) {
  AuditJournal j(dir_);
  try {
    j.read("sb-none");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::not_found);
  }
}

TEST_F(JournalTest, TornLastLineIsSkipped) {
  AuditJournal j(dir_);
  j.append("sb-1", "created");
  {
    std::ofstream out(j.path_of("sb-1"), std::ios::app);
    out << "{\"ts\":\"2024-";  // crash mid-write
  }
  auto recs = j.read("sb-1");
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0]["event"], "created");
}

TEST_F(JournalTest, InvalidUtf8IsReplacedNotFatal) {
  AuditJournal j(dir_);
  j.append("sb-1", "exec", {{"argv", {std::string("\xff\xfe")}}});
  EXPECT_EQ(j.read("sb-1").size(), 1u);
}

TEST_F(JournalTest, ConcurrentAppendersNeverInterleaveLines) {
  AuditJournal j(dir_);
  std::string big(3000, 'x');
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 100; ++i) j.append("sb-1", "exec", {{"t", t}, {"i", i}, {"pad", big}});
    });
  }
  for (auto& th : threads) th.join();
  auto recs = j.read("sb-1");
  EXPECT_EQ(recs.size(), 400u);
}

TEST_F(JournalTest, FileIsAppendOnlyAcrossInstances) {
  { AuditJournal(dir_).append("sb-1", "created"); }
  { AuditJournal(dir_).append("sb-1", "deleted", {}, Durability::sync); }
  auto recs = AuditJournal(dir_).read("sb-1");
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[1]["event"], "deleted");
}

TEST(Rfc3339, FormatsKnownInstants) {
  EXPECT_EQ(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
  EXPECT_EQ(rfc3339_ms(1714564800123), "2024-05-01T12:00:00.123Z");
}

}  // namespace
}  // namespace airlock::engine

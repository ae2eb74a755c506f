#include "engine/audit/journal.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
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

// --- size cap ---------------------------------------------------------------

// Records of `events` in `recs`.
size_t count_of(const std::vector<nlohmann::json>& recs, const std::string& event) {
  size_t n = 0;
  for (const auto& r : recs) n += r.value("event", "") == event ? 1 : 0;
  return n;
}

TEST_F(JournalTest, CapDropsOrdinaryRecordsCountsThemAndKeepsLifecycle) {
  JournalLimits lim{.max_bytes = 16 * 1024, .lifecycle_reserve_bytes = 4 * 1024};
  AuditJournal j(dir_, lim);
  j.append("sb-1", "created", {{"image", "minimal"}}, Durability::sync);
  std::string pad(200, 'd');
  size_t written = 0, dropped = 0;
  uint64_t dropped_bytes_min = 0;
  for (int i = 0; i < 500; ++i) {
    if (j.append("sb-1", "net_dns", {{"name", pad}, {"i", i}}))
      ++written;
    else
      ++dropped, dropped_bytes_min += pad.size();
  }
  EXPECT_GT(written, 25u);  // ~380 bytes each with the chain's seq and prev
  EXPECT_GT(dropped, 400u);
  auto size_at_cap = fs::file_size(j.path_of("sb-1"));
  EXPECT_LE(size_at_cap, lim.max_bytes - lim.lifecycle_reserve_bytes + 512);  // + the notice

  // Lifecycle records still land, in the reserve, up to the hard cap.
  EXPECT_TRUE(j.append("sb-1", "exec", {{"argv", {"true"}}, {"exit_code", 0}}));
  EXPECT_TRUE(j.append("sb-1", "network_changed", {{"flows_cut", 0}}, Durability::sync));
  EXPECT_TRUE(j.append("sb-1", "file", {{"op", "write"}, {"path", "/tmp/x"}}));
  // More flood after that: still dropped.
  EXPECT_FALSE(j.append("sb-1", "net_flow", {{"pad", pad}}));
  ++dropped;

  JournalStats st = j.stats("sb-1");
  EXPECT_TRUE(st.truncated);
  EXPECT_EQ(st.dropped_records, dropped);
  EXPECT_GT(st.dropped_bytes, dropped_bytes_min);

  // The end of the sandbox is always written, with the final count.
  EXPECT_TRUE(j.append("sb-1", "deleted", {{"reason", "by request"}}, Durability::sync));
  auto recs = j.read("sb-1");
  EXPECT_EQ(count_of(recs, "journal_truncated"), 1u);
  EXPECT_EQ(count_of(recs, "net_dns"), written);
  EXPECT_EQ(count_of(recs, "exec"), 1u);
  EXPECT_EQ(count_of(recs, "network_changed"), 1u);
  EXPECT_EQ(count_of(recs, "file"), 1u);
  const auto& note = recs[1 + written];
  EXPECT_EQ(note["event"], "journal_truncated") << note;
  EXPECT_EQ(note["dropped_records"], 1);
  EXPECT_EQ(note["max_bytes"], lim.max_bytes);
  EXPECT_EQ(note["first_dropped"], "net_dns");
  const auto& end = recs.back();
  EXPECT_EQ(end["event"], "deleted");
  EXPECT_EQ(end["journal_dropped"]["records"], dropped);
  EXPECT_EQ(end["journal_dropped"]["bytes"], st.dropped_bytes);
  EXPECT_LE(fs::file_size(j.path_of("sb-1")), lim.max_bytes + 1024);
}

TEST_F(JournalTest, TerminalRecordsAreWrittenPastTheHardCap) {
  AuditJournal j(dir_, {.max_bytes = 4096, .lifecycle_reserve_bytes = 1024});
  std::string pad(300, 'e');
  // exec records fill the reserve too, then are dropped.
  int execs = 0;
  while (j.append("sb-1", "exec", {{"argv", {pad}}})) ++execs;
  EXPECT_GT(execs, 5);
  EXPECT_GE(fs::file_size(j.path_of("sb-1")) + 400, 4096u);
  EXPECT_TRUE(j.append("sb-1", "failed", {{"reason", "oom"}}, Durability::sync));
  EXPECT_TRUE(j.append("sb-1", "deleted", {}, Durability::sync));
  auto recs = j.read("sb-1");
  EXPECT_EQ(recs.back()["event"], "deleted");
  EXPECT_EQ(recs[recs.size() - 2]["event"], "failed");
  EXPECT_EQ(recs[recs.size() - 2]["journal_dropped"]["records"], 1);
  EXPECT_EQ(count_of(recs, "journal_truncated"), 1u);
}

TEST_F(JournalTest, TruncationIsNotedOnceAcrossRestarts) {
  JournalLimits lim{.max_bytes = 8192, .lifecycle_reserve_bytes = 2048};
  std::string pad(500, 'r');
  {
    AuditJournal j(dir_, lim);
    while (j.append("sb-1", "net_dns", {{"pad", pad}})) {
    }
    j.append("sb-1", "net_dns", {{"pad", pad}});
  }
  AuditJournal again(dir_, lim);  // a restarted daemon
  EXPECT_FALSE(again.append("sb-1", "net_flow", {{"pad", pad}}));
  EXPECT_EQ(again.stats("sb-1").dropped_records, 1u);
  EXPECT_EQ(count_of(again.read("sb-1"), "journal_truncated"), 1u);
}

TEST_F(JournalTest, TruncationIsNotedOnceWhenAnotherWriterGrewTheFileFirst) {
  // Today the network helper appends its own records: the file can be far
  // past the cap before the daemon drops anything, and the notice lands at
  // its end.
  JournalLimits lim{.max_bytes = 64 * 1024, .lifecycle_reserve_bytes = 16 * 1024};
  {
    AuditJournal j(dir_, lim);
    j.append("sb-1", "created");
    std::ofstream out(j.path_of("sb-1"), std::ios::app | std::ios::binary);
    std::string line = R"({"ts":"t","sandbox":"sb-1","event":"net_dns","pad":")" +
                       std::string(1000, 'h') + "\"}\n";
    for (int i = 0; i < 8000; ++i) out << line;  // ~8 MB, far past the cap
    out.close();
    EXPECT_FALSE(j.append("sb-1", "net_flow"));
  }
  AuditJournal again(dir_, lim);
  EXPECT_FALSE(again.append("sb-1", "net_flow"));
  EXPECT_EQ(count_of(again.read("sb-1"), "journal_truncated"), 1u);
}

TEST_F(JournalTest, ForgedTruncationNoticeInAFieldDoesNotCount) {
  JournalLimits lim{.max_bytes = 8192, .lifecycle_reserve_bytes = 2048};
  std::string pad(500, 'r');
  {
    AuditJournal j(dir_, lim);
    // A nested value that looks like the notice (guest-chosen content).
    j.append("sb-1", "net_dns", {{"answer", {{"event", "journal_truncated"}}}});
    while (j.append("sb-1", "net_dns", {{"pad", pad}})) {
    }
  }
  auto recs = AuditJournal(dir_, lim).read("sb-1");
  EXPECT_EQ(count_of(recs, "journal_truncated"), 1u);
}

TEST_F(JournalTest, CapIsPerSandboxAndZeroMeansNone) {
  AuditJournal j(dir_, {.max_bytes = 4096, .lifecycle_reserve_bytes = 1024});
  std::string pad(500, 'p');
  while (j.append("sb-1", "net_dns", {{"pad", pad}})) {
  }
  EXPECT_TRUE(j.append("sb-2", "net_dns", {{"pad", pad}}));
  EXPECT_FALSE(j.stats("sb-2").truncated);

  AuditJournal unlimited(dir_ / "u", {.max_bytes = 0, .lifecycle_reserve_bytes = 0});
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(unlimited.append("sb-1", "net_dns", {{"pad", pad}}));
  EXPECT_EQ(unlimited.read("sb-1").size(), 100u);
}

TEST_F(JournalTest, RejectsAReserveThatDoesNotFit) {
  try {
    AuditJournal j(dir_, {.max_bytes = 1024, .lifecycle_reserve_bytes = 1024});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_EQ(e.field(), "journal_max_bytes");
  }
}

// --- reader and follower ----------------------------------------------------

TEST_F(JournalTest, ReaderReadsEachByteOnceOverManyAppends) {
  AuditJournal j(dir_);
  j.append("sb-1", "created");
  JournalReader r = j.reader("sb-1");
  std::vector<int> seen;
  for (int i = 0; i < 2000; ++i) {
    j.append("sb-1", "net_dns", {{"i", i}});
    for (auto& rec : r.next()) {
      if (rec["event"] == "net_dns") seen.push_back(rec["i"].get<int>());
    }
  }
  ASSERT_EQ(seen.size(), 2000u);
  for (int i = 0; i < 2000; ++i) ASSERT_EQ(seen[i], i);
  // The whole file once: a follower that re-read it per poll would read
  // ~2000/2 times as much (what Engine::network_events did).
  auto size = fs::file_size(j.path_of("sb-1"));
  EXPECT_EQ(r.bytes_read(), size);
  EXPECT_EQ(r.offset(), size);
  EXPECT_TRUE(r.next().empty());
  EXPECT_EQ(r.bytes_read(), size);
}

TEST_F(JournalTest, ReaderHoldsATornLineUntilItsNewline) {
  AuditJournal j(dir_);
  j.append("sb-1", "net_dns", {{"i", 0}});
  JournalReader r = j.reader("sb-1", "net_");
  ASSERT_EQ(r.next().size(), 1u);
  std::ofstream out(j.path_of("sb-1"), std::ios::app | std::ios::binary);
  out << R"({"ts":"x","sandbox":"sb-1","event":"net_)" << std::flush;
  EXPECT_TRUE(r.next().empty());  // half a line: kept for later
  out << R"(flow","i":1})" << std::flush;
  EXPECT_TRUE(r.next().empty());
  out << "\n" << std::flush;
  auto recs = r.next();
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0]["event"], "net_flow");
  EXPECT_EQ(recs[0]["i"], 1);
  // Garbage lines (a crash's torn line before a later record) are skipped.
  out << "{\"ts\":\"20\n" << std::flush;
  j.append("sb-1", "net_dns", {{"i", 2}});
  recs = r.next();
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0]["i"], 2);
}

TEST_F(JournalTest, ReaderFiltersByEventPrefix) {
  AuditJournal j(dir_);
  j.append("sb-1", "created");
  j.append("sb-1", "net_dns");
  j.append("sb-1", "exec");
  j.append("sb-1", "net_flow");
  auto recs = j.reader("sb-1", "net_").next();
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[0]["event"], "net_dns");
  EXPECT_EQ(recs[1]["event"], "net_flow");
}

TEST_F(JournalTest, ReaderOfAJournalNotYetWritten) {
  AuditJournal j(dir_);
  JournalReader r = j.reader("sb-1");
  EXPECT_FALSE(r.exists());
  EXPECT_TRUE(r.next().empty());
  // Bounded poll while there is no file to watch.
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(r.wait(std::chrono::seconds(5)), RecordFollower::Wake::timeout);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  j.append("sb-1", "created");
  EXPECT_EQ(r.wait(std::chrono::seconds(5)), RecordFollower::Wake::grew);
  EXPECT_EQ(r.next().size(), 1u);
}

TEST_F(JournalTest, FollowerSeesLaterAppendsInOrderOnceAcrossTornWrites) {
  AuditJournal j(dir_);
  j.append("sb-1", "created");
  JournalReader r = j.reader("sb-1", "net_");
  constexpr int kRecords = 300;
  std::thread writer([&] {
    auto path = j.path_of("sb-1");
    for (int i = 0; i < kRecords; ++i) {
      if (i % 10 == 5) {
        // A record written in two halves with a pause between: the follower
        // may wake in the middle and must neither lose nor repeat it.
        std::ofstream out(path, std::ios::app | std::ios::binary);
        std::string line =
            R"({"ts":"t","sandbox":"sb-1","event":"net_flow","i":)" + std::to_string(i) + "}\n";
        out << line.substr(0, 20) << std::flush;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        out << line.substr(20) << std::flush;
      } else {
        j.append("sb-1", i % 2 ? "net_dns" : "exec", {{"i", i}});
      }
      if (i % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    j.append("sb-1", "net_end");
  });
  std::vector<int> seen;
  bool done = false;
  int wakes = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!done && std::chrono::steady_clock::now() < deadline) {
    for (auto& rec : r.next()) {
      if (rec["event"] == "net_end")
        done = true;
      else
        seen.push_back(rec["i"].get<int>());
    }
    if (!done) r.wait(std::chrono::seconds(10)), ++wakes;
  }
  writer.join();
  ASSERT_TRUE(done);
  std::vector<int> expect;
  for (int i = 0; i < kRecords; ++i)
    if (i % 2 || i % 10 == 5) expect.push_back(i);
  EXPECT_EQ(seen, expect);
  EXPECT_EQ(r.bytes_read(), fs::file_size(j.path_of("sb-1")));
  EXPECT_GT(wakes, 0);
}

TEST_F(JournalTest, WaitWakesOnAnAppendWithoutWaitingOutTheTimeout) {
  AuditJournal j(dir_);
  j.append("sb-1", "created");
  JournalReader r = j.reader("sb-1");
  r.next();
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    j.append("sb-1", "exec");
  });
  auto t0 = std::chrono::steady_clock::now();
  auto w = r.wait(std::chrono::seconds(20));
  auto took = std::chrono::steady_clock::now() - t0;
  writer.join();
  EXPECT_EQ(w, RecordFollower::Wake::grew);
  EXPECT_LT(took, std::chrono::seconds(5));
  EXPECT_EQ(r.next().size(), 1u);
}

TEST_F(JournalTest, WaitReportsAHangupOfTheWatchedSocket) {
  AuditJournal j(dir_);
  j.append("sb-1", "created");
  JournalReader r = j.reader("sb-1");
  r.next();
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  EXPECT_EQ(r.wait(std::chrono::milliseconds(50), sv[0]), RecordFollower::Wake::timeout);
  ::close(sv[1]);
  EXPECT_EQ(r.wait(std::chrono::seconds(20), sv[0]), RecordFollower::Wake::hangup);
  ::close(sv[0]);
}

TEST(Rfc3339, FormatsKnownInstants) {
  EXPECT_EQ(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
  EXPECT_EQ(rfc3339_ms(1714564800123), "2024-05-01T12:00:00.123Z");
}

}  // namespace
}  // namespace airlock::engine

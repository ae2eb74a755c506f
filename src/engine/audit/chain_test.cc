// The journal's hash chain: each kind of break named by verify, the anchor
// and its signature, and what a crash leaves (a torn line, a head written
// but not anchored).
#include "engine/audit/chain.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <mutex>
#include <thread>

#include "common/error.h"
#include "engine/audit/journal.h"

namespace airlock::engine {
namespace {
namespace fs = std::filesystem;

// Locked: a journal with an anchor lag stores heads from its own thread.
class MemAnchor : public JournalAnchor {
 public:
  std::optional<JournalHead> load_head(const std::string& sb) override {
    std::lock_guard lock(mu);
    auto it = heads.find(sb);
    if (it == heads.end()) return std::nullopt;
    return it->second;
  }
  void store_head(const std::string& sb, const JournalHead& h) override {
    std::lock_guard lock(mu);
    if (fail) throw Error(Errc::internal, "registry down");
    heads[sb] = h;
  }
  // The anchored seq of `sb`, 0 if none.
  uint64_t seq(const std::string& sb) {
    auto h = load_head(sb);
    return h ? h->seq : 0;
  }
  std::mutex mu;
  std::map<std::string, JournalHead> heads;
  bool fail = false;
};

class ChainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "chain-test-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    key_ = HostKey::load_or_create(dir_ / "key.pem");
  }
  void TearDown() override { fs::remove_all(dir_); }
  AuditJournal journal() { return AuditJournal(dir_ / "audit", {}, &anchor_, key_); }
  std::vector<std::string> lines() {
    std::ifstream in(dir_ / "audit" / "sb-1.jsonl");
    std::vector<std::string> out;
    for (std::string l; std::getline(in, l);) out.push_back(l);
    return out;
  }
  void rewrite(const std::vector<std::string>& ls) {
    std::ofstream out(dir_ / "audit" / "sb-1.jsonl", std::ios::trunc);
    for (const auto& l : ls) out << l << "\n";
  }
  // Ten records, then `tamper` on the lines; the first break.
  nlohmann::json tampered(const std::function<void(std::vector<std::string>&)>& tamper) {
    fs::remove(dir_ / "audit" / "sb-1.jsonl");
    anchor_.heads.clear();
    auto j = journal();
    for (int i = 0; i < 10; ++i) j.append("sb-1", "exec", {{"n", i}});
    EXPECT_TRUE(j.verify("sb-1").ok);
    auto ls = lines();
    tamper(ls);
    rewrite(ls);
    auto r = j.verify("sb-1").to_json();
    EXPECT_FALSE(r["ok"].get<bool>()) << r.dump(2);
    return r["first_break"];
  }
  fs::path dir_;
  MemAnchor anchor_;
  std::shared_ptr<HostKey> key_;
};

TEST_F(ChainTest, RecordsLinkAndTheHeadIsAnchoredAndSigned) {
  auto j = journal();
  j.append("sb-1", "created", {{"image", "minimal"}});
  j.append("sb-1", "exec", {{"argv", {"true"}}});
  auto ls = lines();
  ASSERT_EQ(ls.size(), 2u);
  auto r0 = nlohmann::json::parse(ls[0]);
  auto r1 = nlohmann::json::parse(ls[1]);
  EXPECT_EQ(r0["seq"], 1);
  EXPECT_EQ(r0["prev"], genesis_hash("sb-1"));
  EXPECT_EQ(r1["seq"], 2);
  EXPECT_EQ(r1["prev"], sha256_hex(ls[0]));
  auto head = anchor_.heads.at("sb-1");
  EXPECT_EQ(head.seq, 2u);
  EXPECT_EQ(head.hash, sha256_hex(ls[1]));
  EXPECT_EQ(head.bytes, fs::file_size(dir_ / "audit" / "sb-1.jsonl"));
  EXPECT_TRUE(key_->verify_hex(head_message("sb-1", 2, head.hash), head.signature));
  auto v = j.verify("sb-1");
  EXPECT_TRUE(v.ok);
  EXPECT_TRUE(v.signature_ok);
  EXPECT_EQ(v.head.seq, 2u);
  EXPECT_EQ(v.unanchored, 0u);
}

TEST_F(ChainTest, Edited) {
  auto b = tampered([](auto& ls) {
    auto r = nlohmann::json::parse(ls[3]);
    r["n"] = 99;
    ls[3] = r.dump();
  });
  EXPECT_EQ(b["kind"], "edited");
  EXPECT_EQ(b["line"], 4);
  EXPECT_EQ(b["seq"], 4);
}

TEST_F(ChainTest, EditedLastLineIsCaughtByTheAnchor) {
  auto b = tampered([](auto& ls) { ls[9].replace(ls[9].find("\"n\":9"), 5, "\"n\":8"); });
  EXPECT_EQ(b["kind"], "edited");
  EXPECT_EQ(b["line"], 10);
}

TEST_F(ChainTest, Deleted) {
  auto b = tampered([](auto& ls) { ls.erase(ls.begin() + 4); });
  EXPECT_EQ(b["kind"], "deleted");
  EXPECT_EQ(b["line"], 5);  // seq 6 now at line 5
  EXPECT_NE(b["message"].get<std::string>().find("seq 5 is missing"), std::string::npos);
}

TEST_F(ChainTest, Inserted) {
  auto b = tampered([](auto& ls) { ls.insert(ls.begin() + 6, ls[2]); });
  EXPECT_EQ(b["kind"], "inserted");
  EXPECT_EQ(b["line"], 7);
  auto c = tampered(
      [](auto& ls) { ls.insert(ls.begin() + 2, R"({"ts":"x","sandbox":"sb-1","event":"exec"})"); });
  EXPECT_EQ(c["kind"], "inserted");
  EXPECT_EQ(c["line"], 3);
}

TEST_F(ChainTest, Reordered) {
  auto b = tampered([](auto& ls) { std::swap(ls[5], ls[6]); });
  EXPECT_EQ(b["kind"], "reordered");
  EXPECT_EQ(b["line"], 6);
}

TEST_F(ChainTest, TruncatedTailAgainstTheAnchor) {
  auto b = tampered([](auto& ls) { ls.resize(7); });
  EXPECT_EQ(b["kind"], "truncated");
  EXPECT_NE(b["message"].get<std::string>().find("last 3 record(s)"), std::string::npos);
}

TEST_F(ChainTest, NotJsonLine) {
  auto b = tampered([](auto& ls) { ls[2] = "garbage"; });
  EXPECT_EQ(b["kind"], "not_a_record");
  EXPECT_EQ(b["line"], 3);
}

TEST_F(ChainTest, ForgedAnchorSignature) {
  auto j = journal();
  j.append("sb-1", "created");
  anchor_.heads["sb-1"].signature = std::string(128, '0');
  auto r = j.verify("sb-1");
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.breaks.at(0).kind, "bad_signature");
}

TEST_F(ChainTest, ChainContinuesAfterARestart) {
  {
    auto j = journal();
    j.append("sb-1", "created");
    j.append("sb-1", "exec");
  }
  auto j2 = journal();  // a new daemon: learns the end from the file
  j2.append("sb-1", "adopted");
  EXPECT_EQ(nlohmann::json::parse(lines().back())["seq"], 3);
  EXPECT_TRUE(j2.verify("sb-1").ok);
}

// A daemon that died between writing a record and anchoring it: verify says
// how many records are unanchored (not a break); the next daemon's first
// append notes it (journal_reanchored) and anchors again.
TEST_F(ChainTest, CrashBetweenAppendAndAnchor) {
  {
    auto j = journal();
    j.append("sb-1", "created");
    anchor_.fail = true;  // the registry write never happens
    j.append("sb-1", "exec");
    auto r = j.verify("sb-1");
    EXPECT_TRUE(r.ok);
    EXPECT_EQ(r.unanchored, 1u);
  }
  anchor_.fail = false;
  auto j2 = journal();
  j2.append("sb-1", "adopted");
  auto ls = lines();
  ASSERT_EQ(ls.size(), 4u);
  auto note = nlohmann::json::parse(ls[2]);
  EXPECT_EQ(note["event"], "journal_reanchored");
  EXPECT_EQ(note["anchored_seq"], 1);
  EXPECT_EQ(note["head_seq"], 2);
  auto r = j2.verify("sb-1");
  EXPECT_TRUE(r.ok);
  EXPECT_EQ(r.unanchored, 0u);
}

// A crash in the middle of a write leaves a partial last line: verify does
// not call it tampering, and the next append cuts it off and says so.
TEST_F(ChainTest, TornTailIsRepairedOnRecord) {
  {
    auto j = journal();
    j.append("sb-1", "created");
  }
  { std::ofstream(dir_ / "audit" / "sb-1.jsonl", std::ios::app) << R"({"ts":"2024-)"; }
  auto j2 = journal();
  EXPECT_TRUE(j2.verify("sb-1").ok);
  j2.append("sb-1", "adopted");
  auto ls = lines();
  ASSERT_EQ(ls.size(), 3u);
  auto note = nlohmann::json::parse(ls[1]);
  EXPECT_EQ(note["event"], "journal_torn_tail");
  EXPECT_EQ(note["bytes"], 12);
  EXPECT_TRUE(j2.verify("sb-1").ok);
}

TEST_F(ChainTest, AnchorMismatchIsNotedBeforeAppending) {
  {
    auto j = journal();
    j.append("sb-1", "created");
    j.append("sb-1", "exec");
  }
  auto ls = lines();
  ls.pop_back();  // the tail cut while no daemon ran
  rewrite(ls);
  auto j2 = journal();
  EXPECT_EQ(j2.verify("sb-1").breaks.at(0).kind, "truncated");
  j2.append("sb-1", "adopted");
  EXPECT_EQ(nlohmann::json::parse(lines()[1])["event"], "journal_anchor_mismatch");
}

TEST_F(ChainTest, LegacyJournalStartsAChainAfterIt) {
  fs::create_directories(dir_ / "audit");
  {
    std::ofstream(dir_ / "audit" / "sb-1.jsonl")
        << R"({"ts":"t","sandbox":"sb-1","event":"created"})"
           "\n";
  }
  auto j = journal();
  j.append("sb-1", "exec");
  auto r = j.verify("sb-1");
  EXPECT_TRUE(r.ok) << r.to_json().dump(2);
  EXPECT_EQ(r.legacy_records, 1u);
}

TEST_F(ChainTest, SizeCapStillDropsAndNotesOnTheChain) {
  AuditJournal j(dir_ / "audit", {8192, 4096}, &anchor_, key_);
  int written = 0;
  for (int i = 0; i < 100; ++i) written += j.append("sb-1", "net_dns", {{"i", i}}) ? 1 : 0;
  EXPECT_LT(written, 100);
  j.append("sb-1", "deleted");
  auto recs = j.read("sb-1");
  bool noted = false;
  for (auto& r : recs) noted |= r["event"] == "journal_truncated";
  EXPECT_TRUE(noted);
  EXPECT_EQ(recs.back()["event"], "deleted");
  EXPECT_TRUE(recs.back().contains("journal_dropped"));
  EXPECT_TRUE(j.verify("sb-1").ok);
}

TEST_F(ChainTest, HostKeyIsPrivateAndReloads) {
  struct stat st {};
  ASSERT_EQ(::stat((dir_ / "key.pem").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto again = HostKey::load_or_create(dir_ / "key.pem");
  EXPECT_EQ(again->public_key_hex(), key_->public_key_hex());
  EXPECT_TRUE(again->verify_hex("m", key_->sign_hex("m")));
  EXPECT_FALSE(again->verify_hex("m2", key_->sign_hex("m")));
}

TEST_F(ChainTest, TenThousandRecordsVerifyTiming) {
  auto j = journal();
  for (int i = 0; i < 10000; ++i)
    j.append("sb-1", "exec",
             {{"argv", {"sh", "-c", "echo " + std::to_string(i)}}, {"exit_code", 0}});
  auto t0 = std::chrono::steady_clock::now();
  auto r = j.verify("sb-1");
  auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  EXPECT_TRUE(r.ok);
  EXPECT_EQ(r.head.seq, 10000u);
  std::cout << "verify of 10000 records: " << ms << " ms\n";
}

// With an anchor lag, a sync record's head is anchored before append()
// returns and a buffered one's waits (one anchor for the window); verify()
// anchors what is pending first, so it never reports the lag as unanchored.
TEST_F(ChainTest, BufferedHeadsWaitForTheLagSyncOnesAndVerifyDoNot) {
  using namespace std::chrono_literals;
  AuditJournal j(dir_ / "audit", {}, &anchor_, key_, 10s);  // the thread never gets there
  j.append("sb-1", "created", nullptr, Durability::sync);
  EXPECT_EQ(anchor_.seq("sb-1"), 1u);
  j.append("sb-1", "exec_start");
  j.append("sb-1", "exec");
  EXPECT_EQ(anchor_.seq("sb-1"), 1u);
  auto r = j.verify("sb-1");
  EXPECT_TRUE(r.ok);
  EXPECT_EQ(r.unanchored, 0u);
  EXPECT_EQ(anchor_.seq("sb-1"), 3u);
  ASSERT_TRUE(r.anchor);
  EXPECT_TRUE(r.signature_ok);
}

// The lag hides no tampering: a file cut short while its head waits fails
// verify (the anchor names the head this process wrote, not the file's).
TEST_F(ChainTest, AFileCutShortWhileItsHeadWaitsFailsVerify) {
  using namespace std::chrono_literals;
  AuditJournal j(dir_ / "audit", {}, &anchor_, key_, 10s);
  j.append("sb-1", "created", nullptr, Durability::sync);
  for (int i = 0; i < 3; ++i) j.append("sb-1", "exec", {{"n", i}});
  auto ls = lines();
  ls.pop_back();
  rewrite(ls);
  auto r = j.verify("sb-1").to_json();
  EXPECT_FALSE(r["ok"].get<bool>()) << r.dump(2);
  EXPECT_EQ(r["first_break"]["kind"], "truncated") << r.dump(2);
}

// The thread anchors within the lag, every sandbox of the window; what is
// still pending when the journal goes (a daemon stopping) is anchored then.
TEST_F(ChainTest, PendingHeadsAreAnchoredByTheThreadAndAtTheEnd) {
  using namespace std::chrono_literals;
  {
    AuditJournal j(dir_ / "audit", {}, &anchor_, key_, 20ms);
    j.append("sb-1", "exec");
    j.append("sb-2", "exec");
    j.append("sb-2", "exec");
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while ((anchor_.seq("sb-1") != 1 || anchor_.seq("sb-2") != 2) &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(5ms);
    EXPECT_EQ(anchor_.seq("sb-1"), 1u);
    EXPECT_EQ(anchor_.seq("sb-2"), 2u);
  }
  {
    AuditJournal j(dir_ / "audit", {}, &anchor_, key_, 10s);
    j.append("sb-1", "exec");
    EXPECT_EQ(anchor_.seq("sb-1"), 1u);
  }
  EXPECT_EQ(anchor_.seq("sb-1"), 2u);
  auto r = journal().verify("sb-1");
  EXPECT_TRUE(r.ok);
  EXPECT_EQ(r.unanchored, 0u);
}

// A second process appended after our pending head: its append anchored its
// newer head, which ours must not replace.
TEST_F(ChainTest, APendingHeadNeverReplacesANewerOne) {
  using namespace std::chrono_literals;
  AuditJournal ours(dir_ / "audit", {}, &anchor_, key_, 10s);
  ours.append("sb-1", "created", nullptr, Durability::sync);
  ours.append("sb-1", "exec");  // seq 2, pending
  {
    auto other = journal();  // anchors at once; notes our unanchored seq 2 first
    other.append("sb-1", "exec");
  }
  EXPECT_EQ(nlohmann::json::parse(lines()[2])["event"], "journal_reanchored");
  EXPECT_EQ(anchor_.seq("sb-1"), 4u);
  auto r = ours.verify("sb-1");  // anchors ours only if still the newest
  EXPECT_TRUE(r.ok);
  EXPECT_EQ(anchor_.seq("sb-1"), 4u);
  EXPECT_EQ(r.unanchored, 0u);
}

}  // namespace
}  // namespace airlock::engine

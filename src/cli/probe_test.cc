// `airlock probe`'s report (table, JSON, exit code) and bookkeeping.
#include "cli/probe.h"

#include <gtest/gtest.h>

#include <thread>

namespace airlock::cli {
namespace {

using nlohmann::json;

ProbeReport sample() {
  ProbeReport r;
  r.expect("1 task", "write a file", "works", true, "117 bytes", 42);
  r.add({"1 task", "install a package", "", "no package manager in image", ProbeStatus::skip});
  r.expect("2 reach", "TCP to metadata", "all refused", false, "CONNECTED: 169.254.169.254:80");
  return r;
}

TEST(ProbeReport, AFailMakesTheExitCodeOne) {
  ProbeReport r = sample();
  EXPECT_FALSE(r.passed());
  EXPECT_EQ(r.exit_code(), 1);
  EXPECT_EQ(r.count(ProbeStatus::pass), 1u);
  EXPECT_EQ(r.count(ProbeStatus::skip), 1u);
  EXPECT_EQ(r.count(ProbeStatus::fail), 1u);
}

TEST(ProbeReport, PassAndExplainedSkipsExitZero) {
  ProbeReport r;
  r.expect("1 task", "write", "works", true, "ok");
  r.add({"1 task", "install", "", "no package manager in image", ProbeStatus::skip});
  EXPECT_TRUE(r.passed());
  EXPECT_EQ(r.exit_code(), 0);
}

TEST(ProbeReport, EmptyReportDoesNotPass) {
  ProbeReport r;
  EXPECT_FALSE(r.passed());
  EXPECT_EQ(r.exit_code(), 1);
}

TEST(ProbeReport, SkipWithoutReasonIsAFail) {
  ProbeReport r;
  r.add({"1 task", "install", "", "", ProbeStatus::skip});
  ASSERT_EQ(r.checks().size(), 1u);
  EXPECT_EQ(r.checks()[0].status, ProbeStatus::fail);
  EXPECT_EQ(r.checks()[0].observed, "skipped without a reason");
  EXPECT_FALSE(r.passed());
}

TEST(ProbeReport, JsonCarriesEveryCheckAndTheContext) {
  json j = sample().to_json({{"image", "minimal"}, {"network", "none"}});
  EXPECT_EQ(j["image"], "minimal");
  EXPECT_EQ(j["passed"], false);
  EXPECT_EQ(j["counts"], (json{{"pass", 1}, {"fail", 1}, {"skip", 1}}));
  ASSERT_EQ(j["checks"].size(), 3u);
  EXPECT_EQ(j["checks"][0], (json{{"section", "1 task"},
                                  {"check", "write a file"},
                                  {"expectation", "works"},
                                  {"observed", "117 bytes"},
                                  {"status", "PASS"},
                                  {"ms", 42}}));
  EXPECT_EQ(j["checks"][1]["status"], "SKIP");
  EXPECT_EQ(j["checks"][1]["observed"], "no package manager in image");
  EXPECT_EQ(j["checks"][2]["status"], "FAIL");
}

TEST(ProbeReport, TableHasAHeaderOneAlignedRowPerCheckAndASummary) {
  std::string t = sample().format_table();
  std::vector<std::string> lines;
  for (size_t p = 0, q; (q = t.find('\n', p)) != std::string::npos; p = q + 1)
    lines.push_back(t.substr(p, q - p));
  ASSERT_EQ(lines.size(), 5u) << t;
  EXPECT_EQ(lines[0].rfind("CHECK", 0), 0u);
  EXPECT_NE(lines[0].find("EXPECTATION"), std::string::npos);
  EXPECT_NE(lines[1].find("1 task · write a file"), std::string::npos);
  EXPECT_EQ(lines[1].substr(lines[1].size() - 4), "PASS");
  EXPECT_EQ(lines[2].substr(lines[2].size() - 4), "SKIP");
  EXPECT_EQ(lines[3].substr(lines[3].size() - 4), "FAIL");
  EXPECT_NE(lines[3].find("CONNECTED: 169.254.169.254:80"), std::string::npos);
  // Columns line up on screen (code points, not bytes: "·" is two bytes).
  auto screen_col = [](const std::string& line, const std::string& word) {
    std::string before = line.substr(0, line.find(word));
    return std::count_if(before.begin(), before.end(), [](char ch) { return (ch & 0xC0) != 0x80; });
  };
  EXPECT_EQ(screen_col(lines[1], "works"), screen_col(lines[0], "EXPECTATION"));
  EXPECT_EQ(screen_col(lines[3], "all refused"), screen_col(lines[0], "EXPECTATION"));
  EXPECT_EQ(lines[4], "1 passed, 1 failed, 1 skipped: FAIL");
}

TEST(ProbeReport, LongObservationsAreCutInTheTableButWholeInJson) {
  ProbeReport r;
  std::string longtext(300, 'x');
  r.expect("2 reach", "ls /dev", "reported", true, longtext + "\nsecond line");
  std::string t = r.format_table(40);
  EXPECT_NE(t.find(std::string(39, 'x') + "…"), std::string::npos) << t;
  EXPECT_EQ(t.find(std::string(41, 'x')), std::string::npos);
  EXPECT_EQ(r.to_json()["checks"][0]["observed"], longtext + "\nsecond line");
}

TEST(SandboxTracker, TracksUntilForgottenAndAcrossThreads) {
  SandboxTracker t;
  t.add("sb-1");
  t.add("sb-2");
  t.add("sb-1");
  EXPECT_EQ(t.ids(), (std::vector<std::string>{"sb-1", "sb-2"}));
  t.forget("sb-1");
  t.forget("sb-nosuch");
  EXPECT_EQ(t.ids(), (std::vector<std::string>{"sb-2"}));
  EXPECT_FALSE(t.interrupted());
  std::thread([&] { t.interrupt(); }).join();
  EXPECT_TRUE(t.interrupted());
  EXPECT_EQ(t.ids().size(), 1u);  // an interrupt does not drop what must be destroyed
}

TEST(Median, OddEvenAndEmpty) {
  EXPECT_EQ(median_ms({}), 0);
  EXPECT_EQ(median_ms({5}), 5);
  EXPECT_EQ(median_ms({9, 1, 5}), 5);
  EXPECT_EQ(median_ms({4, 1, 3, 2}), 2.5);
}

TEST(ReachLines, ParsesTargetAndCodeIgnoringNoise) {
  auto r = parse_reach_lines(
      "127.0.0.1:22 1\nnc: bad address\n10.0.2.2:4000 0\n\n169.254.169.254:80 99\nx 1 2\n");
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].target, "127.0.0.1:22");
  EXPECT_EQ(r[0].rc, 1);
  EXPECT_EQ(r[1].rc, 0);
  EXPECT_EQ(r[2].rc, 99);
}

TEST(HostAddresses, NoLoopbackNoDuplicates) {
  auto a = host_addresses();
  for (const auto& x : a) {
    EXPECT_NE(x, "127.0.0.1");
    EXPECT_NE(x, "::1");
    EXPECT_EQ(std::count(a.begin(), a.end(), x), 1);
  }
}

TEST(OutsideNetwork, ParsesKnownLinesIgnoringNoise) {
  auto r = parse_outside_lines(
      "apt deb.example.org ok\nwarning: something\npip idx.example.org unresolved\n"
      "apt x ok extra\nnpm y ok\napt z maybe\n");
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].what, "apt");
  EXPECT_EQ(r[0].host, "deb.example.org");
  EXPECT_EQ(r[0].status, "ok");
  EXPECT_EQ(r[1].status, "unresolved");
}

TEST(OutsideNetwork, ReachableSourceMeansNoSkip) {
  auto r = parse_outside_lines("apt deb.example.org ok\npip idx.example.org ok\n");
  EXPECT_EQ(outside_missing(r, "apt"), "");
  EXPECT_EQ(outside_missing(r, "pip"), "");
}

TEST(OutsideNetwork, EveryFailureIsASkipReasonNamingTheSource) {
  auto r = parse_outside_lines("apt deb.example.org unresolved\npip idx.example.org unreachable\n");
  EXPECT_EQ(outside_missing(r, "apt"),
            "no outside network: the image's apt source deb.example.org does not resolve (5 s)");
  EXPECT_EQ(outside_missing(r, "pip"),
            "no outside network: pip's configured index idx.example.org does not accept a "
            "connection (5 s)");
  r = parse_outside_lines("apt - no-source\npip - no-source\n");
  EXPECT_EQ(outside_missing(r, "apt"), "the image has no apt source");
  EXPECT_EQ(outside_missing(r, "pip"), "pip has no configured index");
  // The check's output lost (exec failed): still a reason, never a silent pass.
  EXPECT_EQ(outside_missing({}, "pip"), "the outside-network check for pip did not report");
}

TEST(OutsideNetwork, NoOutsideNetworkOnlyWhenATriedSourceFailedAndNoneAnswered) {
  EXPECT_EQ(no_outside_network(parse_outside_lines("apt a.example.org unreachable\n"
                                                   "pip b.example.org unresolved\n")),
            "no outside network: the image's apt source a.example.org does not accept a "
            "connection (5 s)");
  // One source answers: the host has outside network.
  EXPECT_EQ(no_outside_network(parse_outside_lines("apt a.example.org unresolved\n"
                                                   "pip b.example.org ok\n")),
            "");
  // Nothing configured (e.g. busybox image) says nothing about the network.
  EXPECT_EQ(no_outside_network(parse_outside_lines("apt - no-source\npip - no-source\n")), "");
  EXPECT_EQ(no_outside_network({}), "");
}

TEST(OutsideNetwork, ASkipWithTheReasonKeepsTheReportPassing) {
  ProbeReport rep;
  rep.expect("1 task", "write", "works", true, "ok");
  rep.add({"1 task", "install a package (apt-get)", "works",
           outside_missing(parse_outside_lines("apt deb.example.org unresolved\n"), "apt"),
           ProbeStatus::skip});
  EXPECT_TRUE(rep.passed());
  EXPECT_EQ(rep.checks()[1].status, ProbeStatus::skip);
}

}  // namespace
}  // namespace airlock::cli

#include "auth/auth.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "auth/files.h"
#include "common/error.h"

namespace airlock::auth {
namespace {

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    char tmpl[] = "/tmp/auth_test.XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(Tokens, CreateVerifyRemoveAndNeverStoreTheSecret) {
  TempDir d;
  TokenStore store(d.path / "tokens.json");
  auto made = store.create("acme", 0, TokenFormat::airlock);
  EXPECT_EQ(made.secret.rfind("airlock_", 0), 0u);
  EXPECT_EQ(made.secret.size(), 8u + 40u);
  auto tok = store.verify(made.secret);
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->tenant, "acme");
  EXPECT_EQ(tok->id, made.token.id);
  EXPECT_FALSE(store.verify(made.secret + "x"));
  EXPECT_FALSE(store.verify(""));
  std::string file = slurp(d.path / "tokens.json");
  EXPECT_EQ(file.find(made.secret), std::string::npos);
  EXPECT_NE(file.find(sha256_hex(made.secret)), std::string::npos);
  struct stat st {};
  ASSERT_EQ(::stat((d.path / "tokens.json").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // Persisted: a new store (a daemon restart) knows it.
  TokenStore again(d.path / "tokens.json");
  EXPECT_TRUE(again.verify(made.secret));
  EXPECT_TRUE(store.remove(made.token.id));
  EXPECT_FALSE(store.verify(made.secret));
  EXPECT_FALSE(store.remove(made.token.id));
}

TEST(Tokens, E2bFormatAndExpiry) {
  TempDir d;
  int64_t now = 1000;
  TokenStore store(d.path / "tokens.json", [&] { return now; });
  auto made = store.create("t1", 60, TokenFormat::e2b);
  ASSERT_EQ(made.secret.rfind("e2b_", 0), 0u);
  EXPECT_EQ(made.secret.size(), 44u);
  EXPECT_EQ(made.secret.find_first_not_of("0123456789abcdef", 4), std::string::npos);
  EXPECT_TRUE(store.verify(made.secret));
  now = 1059;
  EXPECT_TRUE(store.verify(made.secret));
  now = 1060;
  EXPECT_FALSE(store.verify(made.secret));
  EXPECT_THROW(store.create("Bad Name", 0, TokenFormat::airlock), Error);
  EXPECT_THROW(store.create("ok", -1, TokenFormat::airlock), Error);
}

TEST(Quotas, ReserveCountsPendingAndReleases) {
  TempDir d;
  Quotas q(d.path / "tenants.json");
  Quota lim;
  lim.max_sandboxes = 2;
  lim.max_memory_mb = 1000;
  q.set("acme", lim);
  Usage used;  // what the engine would report
  auto usage = [&] { return used; };
  auto a = q.reserve("acme", 400, 10, usage);
  auto b = q.reserve("acme", 400, 10, usage);
  try {
    q.reserve("acme", 1, 1, usage);
    FAIL() << "a third reservation passed";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::quota_exceeded);
    EXPECT_EQ(e.field(), "max_sandboxes");
    EXPECT_NE(std::string(e.what()).find("max_sandboxes 2"), std::string::npos);
  }
  b.reset();
  try {
    q.reserve("acme", 700, 1, usage);
    FAIL() << "memory over the limit passed";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "max_memory_mb");
  }
  auto c = q.reserve("acme", 600, 1, usage);
  // Another tenant is not limited by acme's quota.
  auto other = q.reserve("other", 100000, 1, usage);
  Quotas again(d.path / "tenants.json");
  EXPECT_EQ(again.get("acme").max_sandboxes, 2);
  EXPECT_EQ(again.get("nobody").max_sandboxes, -1);
}

TEST(Quotas, CreatesPerMinute) {
  TempDir d;
  auto t = Quotas::Clock::time_point{};
  Quotas q(d.path / "tenants.json", [&] { return t; });
  Quota lim;
  lim.creates_per_minute = 2;
  q.set("acme", lim);
  auto usage = [] { return Usage{}; };
  q.reserve("acme", 1, 1, usage);
  q.reserve("acme", 1, 1, usage);
  try {
    q.reserve("acme", 1, 1, usage);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::rate_limited);
    EXPECT_EQ(e.field(), "creates_per_minute");
  }
  t += std::chrono::seconds(61);
  EXPECT_NO_THROW(q.reserve("acme", 1, 1, usage));
}

// A resume reserves like a create (its size must fit) but is not one: the
// create rate neither refuses nor counts it.
TEST(Quotas, AResumeIsNotACreate) {
  TempDir d;
  auto t = Quotas::Clock::time_point{};
  Quotas q(d.path / "tenants.json", [&] { return t; });
  Quota lim;
  lim.creates_per_minute = 1;
  lim.max_memory_mb = 512;
  q.set("acme", lim);
  auto usage = [] { return Usage{1, 256, 1024}; };
  q.reserve("acme", 1, 1, usage);
  EXPECT_NO_THROW(q.reserve("acme", 256, 1, usage, /*counts_as_create=*/false));
  try {
    q.reserve("acme", 257, 1, usage, false);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::quota_exceeded);
    EXPECT_EQ(e.field(), "max_memory_mb");
  }
}

TEST(Quotas, ParseRefusesUnknownAndNegative) {
  EXPECT_THROW(parse_quota({{"max_cpus", 1}}), Error);
  EXPECT_THROW(parse_quota({{"max_sandboxes", -1}}), Error);
  EXPECT_THROW(parse_quota({{"max_sandboxes", "2"}}), Error);
  EXPECT_EQ(parse_quota({{"max_sandboxes", nullptr}}).max_sandboxes, -1);
}

TEST(Auth, FailuresAreLimitedPerSourceButAValidTokenIsAlwaysServed) {
  TempDir d;
  Auth auth(d.path, {.failure_burst = 3, .failure_per_second = 0.001});
  auto made = auth.tokens().create("acme", 0, TokenFormat::airlock);
  EXPECT_EQ(auth.authenticate(made.secret, "10.0.0.1").outcome, Verdict::ok);
  EXPECT_EQ(auth.authenticate("", "10.0.0.1").outcome, Verdict::missing);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(auth.authenticate("wrong", "10.0.0.1").outcome, Verdict::invalid);
  EXPECT_EQ(auth.authenticate("wrong", "10.0.0.1").outcome, Verdict::limited);
  EXPECT_TRUE(auth.limited("10.0.0.1"));
  // Another client behind the same address (a proxy) with a valid token.
  EXPECT_EQ(auth.authenticate(made.secret, "10.0.0.1").outcome, Verdict::ok);
  EXPECT_EQ(auth.authenticate("wrong", "10.0.0.1").outcome, Verdict::limited);
  // Another source is not affected.
  EXPECT_FALSE(auth.limited("10.0.0.2"));
  EXPECT_EQ(auth.authenticate("wrong", "10.0.0.2").outcome, Verdict::invalid);
}

TEST(Auth, NotedFailuresCountLikeWrongTokens) {
  TempDir d;
  Auth auth(d.path, {.failure_burst = 2, .failure_per_second = 0.001});
  EXPECT_FALSE(auth.note_auth_failure("10.0.0.1"));
  EXPECT_FALSE(auth.note_auth_failure("10.0.0.1"));
  EXPECT_TRUE(auth.note_auth_failure("10.0.0.1"));
  EXPECT_TRUE(auth.limited("10.0.0.1"));
  EXPECT_EQ(auth.authenticate("wrong", "10.0.0.1").outcome, Verdict::limited);
}

TEST(Auth, SourcesAreKeyedByIpv6Slash64) {
  EXPECT_EQ(source_key("203.0.113.7"), "203.0.113.7");
  EXPECT_EQ(source_key("::ffff:203.0.113.7"), "203.0.113.7");
  EXPECT_EQ(source_key("2001:db8:1:2:aaaa:bbbb:cccc:dddd"), "2001:db8:1:2::/64");
  EXPECT_EQ(source_key("2001:db8:1:2::1"), "2001:db8:1:2::/64");
  EXPECT_EQ(source_key("::1"), "::/64");
  EXPECT_EQ(source_key("unix"), "unix");
  TempDir d;
  Auth auth(d.path, {.failure_burst = 2, .failure_per_second = 0.001});
  // One host walking through the addresses of its /64 is one source.
  EXPECT_EQ(auth.authenticate("wrong", "2001:db8:1:2::1").outcome, Verdict::invalid);
  EXPECT_EQ(auth.authenticate("wrong", "2001:db8:1:2::2").outcome, Verdict::invalid);
  EXPECT_EQ(auth.authenticate("wrong", "2001:db8:1:2:ffff::3").outcome, Verdict::limited);
  EXPECT_TRUE(auth.limited("2001:db8:1:2::99"));
  EXPECT_FALSE(auth.limited("2001:db8:1:3::1"));
}

TEST(AuditLog, AppendsJsonLinesPrivately) {
  TempDir d;
  AuditLog log(d.path / "audit.jsonl");
  log.append({{"outcome", "a"}});
  log.append({{"outcome", "b"}});
  auto t = log.tail(1);
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0]["outcome"], "b");
  EXPECT_TRUE(t[0].contains("time"));
  struct stat st {};
  ASSERT_EQ(::stat((d.path / "audit.jsonl").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST(AuditLog, LongFieldsAreCutAndMarked) {
  TempDir d;
  AuditLog log(d.path / "audit.jsonl");
  log.append({{"route", "/e2b/api/" + std::string(60000, 'a')}, {"status", 401}});
  log.append({{"route", std::string("/bad/\xff\xfe")}});  // not UTF-8: replaced, not thrown
  auto t = log.tail(2);
  ASSERT_EQ(t.size(), 2u);
  std::string route = t[0]["route"];
  EXPECT_LT(route.size(), 300u);
  EXPECT_NE(route.find("...[truncated, 60009 bytes]"), std::string::npos);
  EXPECT_EQ(t[0]["status"], 401);
  EXPECT_EQ(t[1]["route"].get<std::string>().rfind("/bad/", 0), 0u);
}

TEST(AuditLog, RotatesBySizeKeepingTwoGenerations) {
  TempDir d;
  auto file = d.path / "audit.jsonl";
  AuditLog log(file, {.max_bytes = 1000, .generations = 2});
  for (int i = 0; i < 100; ++i) log.append({{"outcome", "o" + std::to_string(i)}});
  uint64_t total = 0;
  for (const auto& e : std::filesystem::directory_iterator(d.path)) {
    EXPECT_LE(e.file_size(), 1000u) << e.path();
    total += e.file_size();
  }
  EXPECT_LE(total, 3000u);
  EXPECT_TRUE(std::filesystem::exists(d.path / "audit.jsonl.1"));
  EXPECT_TRUE(std::filesystem::exists(d.path / "audit.jsonl.2"));
  EXPECT_FALSE(std::filesystem::exists(d.path / "audit.jsonl.3"));
  // The newest records are in the current file, tail reaching into .1.
  auto t = log.tail(20);
  ASSERT_EQ(t.size(), 20u);
  EXPECT_EQ(t.back()["outcome"], "o99");
  EXPECT_EQ(t.front()["outcome"], "o80");
  struct stat st {};
  ASSERT_EQ(::stat(file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // A daemon restarted on a nearly full file rotates at the same bound.
  AuditLog again(file, {.max_bytes = 1000, .generations = 2});
  for (int i = 0; i < 30; ++i) again.append({{"outcome", "p"}});
  EXPECT_LE(std::filesystem::file_size(file), 1000u);
}

}  // namespace
}  // namespace airlock::auth

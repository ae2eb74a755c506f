#include "cli/token_cmd.h"

#include <gtest/gtest.h>

#include "cli/client.h"
#include "common/error.h"

namespace airlock::cli {

TEST(ParseDuration, Units) {
  EXPECT_EQ(parse_duration("90"), 90);
  EXPECT_EQ(parse_duration("90s"), 90);
  EXPECT_EQ(parse_duration("15m"), 900);
  EXPECT_EQ(parse_duration("12h"), 43200);
  EXPECT_EQ(parse_duration("30d"), 30 * 86400);
}

TEST(ParseDuration, RefusesNonsenseNamingTheFlag) {
  for (const char* bad : {"", "0", "-5m", "soon", "5w", "1.5h", "m", "4000d"}) {
    try {
      parse_duration(bad);
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.field(), "expires") << bad;
    }
  }
}

TEST(ParseRemote, Forms) {
  EXPECT_FALSE(parse_remote("/var/lib/airlock/airlockd.sock"));
  auto r = parse_remote("http://127.0.0.1:8080");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->host, "127.0.0.1");
  EXPECT_EQ(r->port, "8080");
  EXPECT_FALSE(r->tls);
  r = parse_remote("https://airlock.internal/");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->host, "airlock.internal");
  EXPECT_EQ(r->port, "443");
  EXPECT_TRUE(r->tls);
  r = parse_remote("https://[::1]:8443");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->host, "::1");
  EXPECT_EQ(r->port, "8443");
  EXPECT_THROW(parse_remote("http://:80"), Error);
  EXPECT_THROW(parse_remote("http://host:port"), Error);
}

}  // namespace airlock::cli

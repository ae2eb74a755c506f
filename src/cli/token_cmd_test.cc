#include "cli/token_cmd.h"

#include <gtest/gtest.h>

#include "client/client.h"
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
  EXPECT_FALSE(client::parse_remote("/var/lib/airlock/airlockd.sock"));
  auto r = client::parse_remote("http://127.0.0.1:8080");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->host, "127.0.0.1");
  EXPECT_EQ(r->port, "8080");
  EXPECT_FALSE(r->tls);
  r = client::parse_remote("https://airlock.internal/");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->host, "airlock.internal");
  EXPECT_EQ(r->port, "443");
  EXPECT_TRUE(r->tls);
  r = client::parse_remote("https://[::1]:8443");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->host, "::1");
  EXPECT_EQ(r->port, "8443");
  EXPECT_THROW(client::parse_remote("http://:80"), Error);
  EXPECT_THROW(client::parse_remote("http://host:port"), Error);
}

TEST(TokenTransport, NoTokenOverPlainHttpBeyondLoopback) {
  auto refused = [](const std::string& url, const std::string& token) {
    try {
      client::check_token_transport(*client::parse_remote(url), token, url);
      return false;
    } catch (const Error& e) {
      EXPECT_EQ(e.field(), "AIRLOCK_URL");
      EXPECT_NE(std::string(e.what()).find(url), std::string::npos) << e.what();
      return true;
    }
  };
  for (const char* url :
       {"http://airlock.internal:8080", "http://10.0.0.5:8080", "http://[fe80::1]:80",
        "http://localhost.example.com:80", "http://127.0.0.1.example.com:80"})
    EXPECT_TRUE(refused(url, "airlock_secret")) << url;
  for (const char* url :
       {"http://127.0.0.1:8080", "http://127.8.9.10:1", "http://[::1]:8080", "http://localhost:80",
        "http://api.localhost:80", "https://airlock.internal:8443"})
    EXPECT_FALSE(refused(url, "airlock_secret")) << url;
  // Without a token nothing secret travels.
  EXPECT_FALSE(refused("http://airlock.internal:8080", ""));
}

}  // namespace airlock::cli

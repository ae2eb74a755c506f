// The text the CLI and the MCP server print of airlockd's answers.
#include "client/text.h"

#include <gtest/gtest.h>

namespace airlock::client {
namespace {

using nlohmann::json;

TEST(Text, NetEventLines) {
  json flow = {{"ts", "2026-12-02T11:00:00.000Z"},
               {"event", "net_flow"},
               {"proto", "tcp"},
               {"dst", "203.0.113.7"},
               {"port", 443},
               {"name", "api.example.com"},
               {"rule", "allow *.example.com (pinned)"},
               {"allowed", true}};
  EXPECT_EQ(format_net_event(flow),
            "2026-12-02T11:00:00.000Z tcp 203.0.113.7:443 api.example.com "
            "allow *.example.com (pinned) allowed");
  json end = flow;
  end["event"] = "net_flow_end";
  end["bytes_out"] = 2048;
  end["bytes_in"] = 10;
  end["duration_ms"] = 120;
  end["reason"] = "fin";
  EXPECT_EQ(format_net_event(end),
            "2026-12-02T11:00:00.000Z tcp 203.0.113.7:443 api.example.com "
            "allow *.example.com (pinned) allowed closed fin out=2.0 KiB in=10 B 120ms");
  json v6 = {{"ts", "t"},
             {"event", "net_flow"},
             {"proto", "udp"},
             {"dst", "::1"},
             {"port", 53},
             {"name", ""},
             {"rule", "always-deny ::1/128"},
             {"allowed", false}};
  EXPECT_EQ(format_net_event(v6), "t udp [::1]:53 - always-deny ::1/128 denied");
  json dns = {{"ts", "t"},           {"event", "net_dns"},      {"name", "x.evil.com"},
              {"qtype", "A"},        {"allowed", false},        {"rule", "default deny"},
              {"rcode", "NXDOMAIN"}, {"answers", json::array()}};
  EXPECT_EQ(format_net_event(dns), "t dns x.evil.com A default deny denied rcode=NXDOMAIN");
  dns["answers"] = {"203.0.113.1", "203.0.113.2"};
  EXPECT_NE(format_net_event(dns).find("answers=203.0.113.1,203.0.113.2"), std::string::npos);
  EXPECT_EQ(format_net_event({{"ts", "t"}, {"event", "net_suppressed"}, {"count", 7}}),
            "t suppressed 7 events (rate limit)");
  EXPECT_EQ(
      format_net_event({{"ts", "t"}, {"event", "net_policy"}, {"policy", {{"mode", "open"}}}}),
      "t policy {\"mode\":\"open\"}");
}

TEST(Text, UrlEncode) {
  EXPECT_EQ(url_encode("/tmp/a b&c=d%"), "/tmp/a%20b%26c%3Dd%25");
  EXPECT_EQ(url_encode("\xff"), "%FF");
}

TEST(Text, AuditLinesAndSizes) {
  std::string line = format_audit_line(json::parse(
      R"({"ts":"T","sandbox":"sb-1","event":"exec","argv":["sh","-c","x"],"cwd":"/a b"})"));
  EXPECT_EQ(line, R"(T exec argv=["sh","-c","x"] cwd="/a b")");
  EXPECT_EQ(human_bytes(512), "512 B");
  EXPECT_EQ(human_bytes(12897485), "12.3 MiB");
}

}  // namespace
}  // namespace airlock::client

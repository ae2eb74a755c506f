// The 2026-07-28 request envelope and result shape, on their own (the
// dispatch against a daemon is in server_test.cc).
#include "mcp/modern.h"

#include <gtest/gtest.h>

#include "mcp/protocol.h"

namespace airlock::mcp {
namespace {

using nlohmann::json;

json envelope(json version, json caps = json::object()) {
  json meta = {{kMetaProtocolVersion, std::move(version)}};
  if (!caps.is_null()) meta[kMetaClientCapabilities] = std::move(caps);
  return {{"_meta", meta}};
}

// The failure check_envelope throws, or nullopt when it accepts.
std::optional<RpcFailure> rejection(const json& params) {
  try {
    check_envelope(params);
  } catch (const RpcFailure& f) {
    return f;
  }
  return std::nullopt;
}

TEST(Modern, OnlyARevisionInMetaMakesARequestStateless) {
  EXPECT_FALSE(requested_modern_version(json::object()));
  EXPECT_FALSE(requested_modern_version(json::array()));
  EXPECT_FALSE(requested_modern_version({{"_meta", {{"progressToken", 1}}}}));
  EXPECT_FALSE(requested_modern_version({{"_meta", "2026-07-28"}}));
  EXPECT_EQ(*requested_modern_version(envelope("2026-07-28")), "2026-07-28");
  EXPECT_EQ(*requested_modern_version(envelope(7)), 7);
}

TEST(Modern, TheSupportedRevisionWithCapabilitiesIsAccepted) {
  EXPECT_EQ(check_envelope(envelope("2026-07-28")), "2026-07-28");
  json with_info = envelope("2026-07-28");
  with_info["_meta"][kMetaClientInfo] = {{"name", "c"}, {"version", "1"}};
  EXPECT_FALSE(rejection(with_info));
}

TEST(Modern, AnUnsupportedRevisionListsWhatIsSupported) {
  for (json v : {json("2099-01-01"), json("2025-11-25"), json(""), json(20260728)}) {
    auto f = rejection(envelope(v));
    ASSERT_TRUE(f) << v;
    EXPECT_EQ(f->code, kUnsupportedProtocolVersion);
    EXPECT_EQ(f->data["requested"], v);
    EXPECT_EQ(f->data["supported"], json({"2026-07-28", "2025-11-25", "2025-06-18", "2025-03-26"}));
    EXPECT_NE(f->message.find("initialize"), std::string::npos) << f->message;
  }
}

TEST(Modern, MissingOrBadCapabilitiesOrClientInfoAreInvalidParams) {
  auto no_caps = rejection(envelope("2026-07-28", nullptr));
  ASSERT_TRUE(no_caps);
  EXPECT_EQ(no_caps->code, kInvalidParams);
  EXPECT_NE(no_caps->message.find(kMetaClientCapabilities), std::string::npos);
  EXPECT_EQ(rejection(envelope("2026-07-28", "all"))->code, kInvalidParams);
  json bad_info = envelope("2026-07-28");
  bad_info["_meta"][kMetaClientInfo] = {{"version", "1"}};
  auto f = rejection(bad_info);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->code, kInvalidParams);
  EXPECT_NE(f->message.find(kMetaClientInfo), std::string::npos);
}

TEST(Modern, ResultsCarryResultTypeAndServerInfo) {
  json r = stamp_result({{"tools", json::array()}, {"_meta", {{"other", 1}}}});
  EXPECT_EQ(r["resultType"], "complete");
  EXPECT_EQ(r["_meta"][kMetaServerInfo]["name"], "airlock");
  EXPECT_EQ(r["_meta"]["other"], 1);
  json d = discover_result("hello");
  EXPECT_EQ(d["supportedVersions"], json({"2026-07-28"}));
  EXPECT_TRUE(d["capabilities"].contains("tools"));
  EXPECT_EQ(d["instructions"], "hello");
  EXPECT_EQ(d["ttlMs"], 0);
  EXPECT_EQ(d["cacheScope"], "private");
}

}  // namespace
}  // namespace airlock::mcp

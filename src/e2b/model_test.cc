#include "e2b/model.h"

#include <gtest/gtest.h>

#include "common/error.h"
#include "engine/api/limits.h"

namespace airlock::e2b {
namespace {

using nlohmann::json;

std::string field_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument) << e.what();
    return e.field();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(E2bModel, CreateMapsTemplateTimeoutEnvMetadataAndSecure) {
  auto r = parse_create(R"({"templateID":"base","timeout":30,"envVars":{"A":"1"},
                            "metadata":{"run":"7"},"secure":true,"autoPause":false})",
                        false);
  EXPECT_EQ(r.spec.image, "debian");
  EXPECT_EQ(r.spec.timeout_s, 30);
  EXPECT_EQ(r.spec.env.at("A"), "1");
  EXPECT_EQ(r.spec.metadata.at("run"), "7");
  EXPECT_EQ(r.spec.metadata.at(kMetaTemplate), "base");
  EXPECT_EQ(r.spec.metadata.at(kMetaSecure), "true");
  EXPECT_TRUE(r.secure);
  EXPECT_EQ(r.spec.network["mode"], "open");  // E2B: internet on by default

  auto d = parse_create(R"({"templateID":"minimal","unknownField":1})", false);
  EXPECT_EQ(d.spec.image, "minimal");
  EXPECT_EQ(d.spec.timeout_s, kDefaultTimeoutS);
  // Secure by default on the v1 route too.
  EXPECT_TRUE(d.secure);
  EXPECT_EQ(d.spec.metadata.at(kMetaSecure), "true");
  // The v2 route secures every sandbox, whatever the body says.
  EXPECT_TRUE(parse_create(R"({"templateID":"base","secure":false})", true).secure);
  EXPECT_TRUE(parse_create(R"({"templateID":"base","secure":false})", true, true).secure);
}

TEST(E2bModel, InsecureSandboxesOnlyWhereTheOperatorAllowsThem) {
  // secure: false on v1 without --e2b-allow-insecure: refused, naming it.
  EXPECT_EQ(field_of([] { parse_create(R"({"templateID":"base","secure":false})", false); }),
            "secure");
  EXPECT_EQ(field_of([] { parse_create(R"({"templateID":"base","secure":"no"})", false); }),
            "secure");
  auto r = parse_create(R"({"templateID":"base","secure":false})", false, true);
  EXPECT_FALSE(r.secure);
  EXPECT_FALSE(r.spec.metadata.count(kMetaSecure));
  EXPECT_TRUE(parse_create(R"({"templateID":"base","secure":true})", false, true).secure);
  EXPECT_TRUE(parse_create(R"({"templateID":"base"})", false, true).secure);
}

TEST(E2bModel, BoundsAreTheApisLimitsTable) {
  namespace L = engine::limits;
  auto body = [](int64_t t) {
    return R"({"templateID":"base","timeout":)" + std::to_string(t) + "}";
  };
  EXPECT_EQ(parse_create(body(L::kTimeoutS.max), true).spec.timeout_s, L::kTimeoutS.max);
  EXPECT_EQ(parse_create(body(L::kTimeoutS.min), true).spec.timeout_s, L::kTimeoutS.min);
  EXPECT_EQ(field_of([&] { parse_create(body(L::kTimeoutS.max + 1), true); }), "timeout");
  EXPECT_EQ(parse_timeout(body(L::kTimeoutS.max), false), L::kTimeoutS.max);
  EXPECT_EQ(field_of([&] { parse_timeout(body(L::kTimeoutS.max + 1), false); }), "timeout");
  // Maps: the native API's entry count and value sizes, not looser ones.
  std::string many = R"({"templateID":"b","envVars":{)";
  for (size_t i = 0; i <= L::kMaxMapEntries; ++i)
    many += (i ? "," : "") + ("\"K" + std::to_string(i) + "\":\"v\"");
  many += "}}";
  EXPECT_EQ(field_of([&] { parse_create(many, true); }), "envVars");
  std::string big = R"({"templateID":"b","metadata":{"k":")" +
                    std::string(L::kMaxMetadataValueBytes + 1, 'x') + R"("}})";
  EXPECT_EQ(field_of([&] { parse_create(big, true); }), "metadata.k");
}

TEST(E2bModel, CreateRefusesWhatItCannotHonourNamingTheField) {
  EXPECT_EQ(field_of([] { parse_create(R"({})", true); }), "templateID");
  EXPECT_EQ(field_of([] { parse_create(R"({"templateID":"base","timeout":0})", true); }),
            "timeout");
  EXPECT_EQ(field_of([] { parse_create(R"({"templateID":"base","timeout":"9"})", true); }),
            "timeout");
  EXPECT_EQ(field_of([] { parse_create(R"({"templateID":"base","autoPause":true})", true); }),
            "autoPause");
  EXPECT_EQ(field_of([] { parse_create(R"({"templateID":"b","volumeMounts":[{}]})", true); }),
            "volumeMounts");
  EXPECT_EQ(
      field_of([] { parse_create(R"({"templateID":"b","metadata":{"e2b.template":"x"}})", true); }),
      "metadata.e2b.template");
  EXPECT_EQ(field_of([] { parse_create(R"({"templateID":"b","envVars":{"A":1}})", true); }),
            "envVars.A");
  EXPECT_EQ(field_of([] { parse_create(R"({"templateID":"b","envVars":{"A=B":"1"}})", true); }),
            "envVars");
  EXPECT_EQ(field_of([] { parse_create(R"({"templateID":"b","network":{"rules":{}}})", true); }),
            "network.rules");
  EXPECT_EQ(field_of([] { parse_create("[1]", true); }), "body");
}

TEST(E2bModel, EgressFollowsE2bsRulesInAirlocksModes) {
  EXPECT_EQ(egress_policy(json::parse(R"({"allow_internet_access":false})")),
            json::parse(R"({"mode":"none"})"));
  // Deny everything but the allowed: an allowlist.
  json p = egress_policy(json::parse(
      R"({"network":{"allowOut":["203.0.113.7","*.example.com"],"denyOut":["0.0.0.0/0"]}})"));
  EXPECT_EQ(p["mode"], "allowlist");
  EXPECT_EQ(p["allow"], json::parse(R"(["203.0.113.7","*.example.com"])"));
  EXPECT_FALSE(p.contains("deny"));
  p = egress_policy(
      json::parse(R"({"allow_internet_access":false,"network":{"allowOut":["203.0.113.7"]}})"));
  EXPECT_EQ(p["mode"], "allowlist");
  // Open minus denyOut; an entry in both is allowed (E2B: allowOut wins).
  p = egress_policy(json::parse(
      R"({"network":{"allowOut":["198.51.100.1"],"denyOut":["198.51.100.0/24","198.51.100.1"]}})"));
  EXPECT_EQ(p["mode"], "open");
  EXPECT_EQ(p["deny"], json::parse(R"(["198.51.100.0/24"])"));
  // A bad entry is refused with airlock's reason.
  EXPECT_EQ(
      field_of([] { egress_policy(json::parse(R"({"network":{"denyOut":["not an ip!"]}})")); }),
      "network");
  EXPECT_EQ(field_of([] { egress_policy(json::parse(R"({"allow_internet_access":"yes"})")); }),
            "allow_internet_access");
}

TEST(E2bModel, ResponsesHideTheE2bKeysAndSpeakE2bsFieldNames) {
  engine::SandboxInfo info;
  info.id = "sb-1";
  info.spec.image = "debian";
  info.spec.cpus = 2;
  info.spec.memory_mb = 512;
  info.spec.metadata = {{"run", "7"}, {kMetaTemplate, "base"}, {kMetaSecure, "true"}};
  info.spec.network = {{"mode", "allowlist"}, {"allow", {"203.0.113.7"}}};
  info.state = engine::State::running;
  info.created_at_ms = 1764770400123;  // 2025-12-03T14:00:00.123Z
  info.expires_at_ms = 1764770415123;
  json l = listed_json(info);
  EXPECT_EQ(l["sandboxID"], "sb-1");
  EXPECT_EQ(l["templateID"], "base");
  EXPECT_EQ(l["metadata"], json::parse(R"({"run":"7"})"));
  EXPECT_EQ(l["state"], "running");
  EXPECT_EQ(l["cpuCount"], 2);
  EXPECT_EQ(l["memoryMB"], 512);
  EXPECT_EQ(l["startedAt"], "2025-12-03T14:00:00.123Z");
  EXPECT_EQ(l["endAt"], "2025-12-03T14:00:15.123Z");
  json d = detail_json(info);
  EXPECT_EQ(d["allowInternetAccess"], false);
  EXPECT_EQ(d["network"]["allowOut"], json::parse(R"(["203.0.113.7"])"));
  json s = sandbox_json(info, "tok");
  EXPECT_EQ(s["envdAccessToken"], "tok");
  EXPECT_FALSE(sandbox_json(info, "").contains("envdAccessToken"));
  EXPECT_EQ(error_json(404, "gone"), json::parse(R"({"code":404,"message":"gone"})"));
  // A natively created sandbox's template is its image.
  info.spec.metadata.clear();
  EXPECT_EQ(listed_json(info)["templateID"], "debian");
}

TEST(E2bModel, TimeoutAndMetadataQuery) {
  EXPECT_EQ(parse_timeout(R"({"timeout":60})", false), 60);
  EXPECT_EQ(parse_timeout("", true), std::nullopt);
  EXPECT_EQ(parse_timeout("{}", true), std::nullopt);
  EXPECT_EQ(field_of([] { parse_timeout("{}", false); }), "timeout");
  EXPECT_EQ(field_of([] { parse_timeout(R"({"timeout":604801})", false); }), "timeout");
  // What the SDK sends for {run: "7", "a b": "c&d"} once the parameter
  // itself is decoded: each part encoded, then URLSearchParams-encoded.
  auto m = parse_metadata_query("run=7&a%2520b=c%2526d");
  EXPECT_EQ(m.size(), 2u);
  EXPECT_EQ(m.at("run"), "7");
  EXPECT_EQ(m.at("a b"), "c&d");
}

}  // namespace
}  // namespace airlock::e2b

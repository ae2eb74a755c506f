#include "guest/net.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <stdexcept>

namespace airlock::guest {
namespace {

std::string ip(in_addr a) {
  char b[INET_ADDRSTRLEN];
  return inet_ntop(AF_INET, &a, b, sizeof b);
}

TEST(GuestNetwork, ParsesTheHostsHello) {
  auto n = parse_guest_network(
      {{"address", "10.0.2.15/24"}, {"gateway", "10.0.2.2"}, {"dns", "10.0.2.3"}});
  EXPECT_EQ(ip(n.address), "10.0.2.15");
  EXPECT_EQ(n.prefix, 24);
  EXPECT_EQ(ip(n.gateway), "10.0.2.2");
  EXPECT_EQ(ip(n.dns), "10.0.2.3");
}

TEST(GuestNetwork, RejectsBadValuesNamingTheField) {
  auto msg = [](const nlohmann::json& j) {
    try {
      parse_guest_network(j);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  nlohmann::json good{{"address", "10.0.2.15/24"}, {"gateway", "10.0.2.2"}, {"dns", "10.0.2.3"}};
  auto with = [&](const char* k, nlohmann::json v) {
    auto j = good;
    j[k] = v;
    return j;
  };
  EXPECT_NE(msg(with("address", "10.0.2.15")).find("network.address"), std::string::npos);
  EXPECT_NE(msg(with("address", "10.0.2.15/33")).find("prefix"), std::string::npos);
  EXPECT_NE(msg(with("address", "10.0.2/24")).find("network.address"), std::string::npos);
  EXPECT_NE(msg(with("address", "0x0a.0.2.15/24")).find("network.address"), std::string::npos);
  EXPECT_NE(msg(with("gateway", "10.0.3.2")).find("subnet"), std::string::npos);
  EXPECT_NE(msg(with("dns", 5)).find("network.dns"), std::string::npos);
  EXPECT_NE(msg(nlohmann::json::array()).find("object"), std::string::npos);
  EXPECT_EQ(msg(good), "accepted");
}

TEST(GuestNetwork, ParsesIpv6AndMac) {
  nlohmann::json j{{"address", "10.0.2.15/24"}, {"gateway", "10.0.2.2"},
                   {"dns", "10.0.2.3"},         {"address6", "fec0::15/64"},
                   {"gateway6", "fec0::2"},     {"mac", "52:54:00:ab:CD:0f"}};
  auto n = parse_guest_network(j);
  ASSERT_TRUE(n.address6);
  char b[INET6_ADDRSTRLEN];
  EXPECT_STREQ(inet_ntop(AF_INET6, &*n.address6, b, sizeof b), "fec0::15");
  EXPECT_EQ(n.prefix6, 64);
  EXPECT_STREQ(inet_ntop(AF_INET6, &n.gateway6, b, sizeof b), "fec0::2");
  ASSERT_TRUE(n.mac);
  EXPECT_EQ(*n.mac, (std::array<uint8_t, 6>{0x52, 0x54, 0x00, 0xab, 0xcd, 0x0f}));
  auto bad = [&](const char* k, nlohmann::json v) {
    auto x = j;
    x[k] = v;
    try {
      parse_guest_network(x);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(bad("address6", "fec0::15").find("network.address6"), std::string::npos);
  EXPECT_NE(bad("address6", "10.0.2.15/64").find("network.address6"), std::string::npos);
  EXPECT_NE(bad("address6", "fec0::15/129").find("network.address6"), std::string::npos);
  EXPECT_NE(bad("gateway6", "fec1::2").find("subnet"), std::string::npos);
  EXPECT_NE(bad("mac", "53:54:00:ab:cd:0f").find("network.mac"), std::string::npos);  // multicast
  EXPECT_NE(bad("mac", "52:54:00:ab:cd").find("network.mac"), std::string::npos);
  EXPECT_NE(bad("mac", "52-54-00-ab-cd-0f").find("network.mac"), std::string::npos);
  auto v4only = parse_guest_network(
      {{"address", "10.0.2.15/24"}, {"gateway", "10.0.2.2"}, {"dns", "10.0.2.3"}});
  EXPECT_FALSE(v4only.address6);
  EXPECT_FALSE(v4only.mac);
}

TEST(GuestNetwork, ConfigureReportsAMissingInterface) {
  GuestNetwork n;
  EXPECT_EQ(configure_network("", n, "/nonexistent/resolv.conf"), "no network interface");
}

}  // namespace
}  // namespace airlock::guest

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

TEST(GuestNetwork, ConfigureReportsAMissingInterface) {
  GuestNetwork n;
  EXPECT_EQ(configure_network("", n, "/nonexistent/resolv.conf"), "no network interface");
}

}  // namespace
}  // namespace airlock::guest

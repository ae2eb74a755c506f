#include "daemon/base64.h"

#include <gtest/gtest.h>

namespace airlock::daemon {
namespace {

TEST(Base64, Rfc4648Vectors) {
  EXPECT_EQ(base64_encode(""), "");
  EXPECT_EQ(base64_encode("f"), "Zg==");
  EXPECT_EQ(base64_encode("fo"), "Zm8=");
  EXPECT_EQ(base64_encode("foo"), "Zm9v");
  EXPECT_EQ(base64_encode("foobar"), "Zm9vYmFy");
  EXPECT_EQ(base64_decode("Zm9vYg==").value(), "foob");
  EXPECT_EQ(base64_decode("").value(), "");
}

TEST(Base64, RoundTripsEveryByteValue) {
  std::string all;
  for (int i = 0; i < 256; ++i) all += static_cast<char>(i);
  for (size_t n = 0; n <= all.size(); n += 37) {
    std::string part = all.substr(0, n);
    EXPECT_EQ(base64_decode(base64_encode(part)).value(), part);
  }
}

TEST(Base64, RejectsMalformed) {
  EXPECT_FALSE(base64_decode("Zm9"));       // length not a multiple of 4
  EXPECT_FALSE(base64_decode("Zm9v!A=="));  // bad character
  EXPECT_FALSE(base64_decode("Z=9v"));      // padding in the middle
  EXPECT_FALSE(base64_decode("Zg==Zm9v"));  // data after padding
  EXPECT_FALSE(base64_decode("Zm9v\n"));
}

}  // namespace
}  // namespace airlock::daemon

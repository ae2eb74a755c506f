#include "engine/storage/image_name.h"

#include <gtest/gtest.h>

#include <string>

#include "common/error.h"

namespace airlock::storage {
namespace {

TEST(ImageName, AcceptsTheStoresNames) {
  for (const std::string& n : {std::string("minimal"), std::string("debian"),
                               std::string("py-3_12"), std::string("0day"), std::string(64, 'a')})
    EXPECT_TRUE(is_image_name(n)) << n;
}

TEST(ImageName, RefusesWhatTheStoreCouldNeverHold) {
  // "Foo.x" used to pass the spec's check and then never be found.
  for (const char* n :
       {"", "Foo.x", "foo.x", "Foo", ".hidden", "-x", "_x", "a/b", "..", "a b", "caf\xc3\xa9"})
    EXPECT_FALSE(is_image_name(n)) << n;
  EXPECT_FALSE(is_image_name(std::string(65, 'a')));
  EXPECT_FALSE(is_image_name(std::string_view("a\0b", 3)));
}

TEST(ImageName, TheErrorNamesTheFieldAndTheRule) {
  try {
    check_image_name("Foo.x", "image");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_EQ(e.field(), "image");
    EXPECT_NE(std::string(e.what()).find("'Foo.x'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("a-z 0-9 _ -"), std::string::npos) << e.what();
  }
}

TEST(ImageName, ALongNameIsShownOnlyInPart) {
  try {
    check_image_name(std::string(10000, 'X'), "name");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_LT(std::string(e.what()).size(), 300u);
    EXPECT_EQ(e.field(), "name");
  }
}

}  // namespace
}  // namespace airlock::storage

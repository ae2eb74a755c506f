#include "engine/channel/file_entry.h"

#include <gtest/gtest.h>

#include "common/error.h"
#include "engine/channel/guest_client.h"

namespace airlock::channel {
namespace {

using nlohmann::json;

json good() {
  return {{"name", "a"},         {"path", "/x/a"},   {"type", "symlink"}, {"size", 3},
          {"mode", 0777},        {"mtime", 1.5},     {"uid", 1000},       {"gid", 1000},
          {"owner", "user"},     {"group", "user"},  {"target", "/x/b"},  {"target_type", "file"},
          {"target_mode", 0644}, {"evil", "dropped"}};
}

TEST(FileEntry, KnownFieldsAreKeptUnknownOnesDropped) {
  json e = file_entry_from_guest(good());
  EXPECT_EQ(e["path"], "/x/a");
  EXPECT_EQ(e["owner"], "user");
  EXPECT_EQ(e["target_type"], "file");
  EXPECT_FALSE(e.contains("evil"));
}

TEST(FileEntry, HostileFieldsAreGuestErrorsNamingTheField) {
  auto fails_on = [](const char* field, json value) {
    json e = good();
    e[field] = value;
    try {
      file_entry_from_guest(e);
    } catch (const GuestReplyError& err) {
      return err.code() == Errc::guest_error &&
             std::string(err.what()).find(field) != std::string::npos;
    }
    return false;
  };
  EXPECT_TRUE(fails_on("path", "relative"));
  EXPECT_TRUE(fails_on("path", std::string(5000, 'a')));
  EXPECT_TRUE(fails_on("type", "fifo"));
  EXPECT_TRUE(fails_on("mode", 010000));
  EXPECT_TRUE(fails_on("size", -1));
  EXPECT_TRUE(fails_on("uid", "0"));
  EXPECT_TRUE(fails_on("target", "../etc"));
  EXPECT_TRUE(fails_on("name", std::string("a\0b", 3)));
  EXPECT_TRUE(fails_on("mtime", "yesterday"));
  EXPECT_THROW(file_entry_from_guest(json::array()), GuestReplyError);
  json missing = good();
  missing.erase("size");
  EXPECT_THROW(file_entry_from_guest(missing), GuestReplyError);
}

}  // namespace
}  // namespace airlock::channel

#include "protocol/messages.h"

#include <gtest/gtest.h>

#include <cerrno>

namespace airlock::protocol {
namespace {

using nlohmann::json;

TEST(Messages, JsonFrameRoundTrip) {
  Frame f = json_frame(Type::request, 5, {{"op", "stat"}, {"path", "/etc"}});
  EXPECT_EQ(f.stream, 5u);
  json j = parse_json(f);
  EXPECT_EQ(j["op"], "stat");
  EXPECT_EQ(require_string(j, "path"), "/etc");
}

TEST(Messages, JsonFrameReplacesInvalidUtf8) {
  Frame f = json_frame(Type::response, 1, {{"name", std::string("a\xff")}});
  EXPECT_NO_THROW(parse_json(f));
}

TEST(Messages, JsonFrameTooLarge) {
  EXPECT_THROW(json_frame(Type::response, 1, {{"x", std::string(kMaxPayload, 'a')}}), Error);
}

TEST(Messages, ParseJsonRejectsNonObjects) {
  for (const char* p : {"", "{", "[1,2]", "42", "\"s\"", "nul"}) {
    Frame f;
    f.type = Type::request;
    f.payload = p;
    try {
      parse_json(f);
      FAIL() << p;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::protocol_error);
    }
  }
}

// {"a":[{"a":[... depth levels, closed.
std::string nested(int depth) {
  std::string open, close;
  for (int i = 0; i < depth; ++i) {
    open += i % 2 ? "[" : "{\"a\":";
    close.insert(0, i % 2 ? "]" : "}");
  }
  return open + "1" + close;
}

TEST(Messages, ParseJsonBoundsNesting) {
  Frame f;
  f.type = Type::response;
  f.stream = 3;
  f.payload = nested(kMaxJsonDepth);
  EXPECT_NO_THROW(parse_json(f));
  // One level more, the deepest a frame can hold ([[[...]]] fills 64 KiB),
  // and brackets that never close (the parser alone would build them all).
  std::string deepest = "{\"a\":" + std::string(kMaxPayload / 2 - 4, '[') +
                        std::string(kMaxPayload / 2 - 4, ']') + "}";
  for (const std::string& p : {nested(kMaxJsonDepth + 1), deepest, std::string(kMaxPayload, '[')}) {
    f.payload = p;
    try {
      parse_json(f);
      FAIL() << p.substr(0, 40);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::protocol_error);
      EXPECT_NE(std::string(e.what()).find("nests deeper than 32 levels"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("stream 3"), std::string::npos) << e.what();
    }
  }
  // Brackets inside strings (escaped quotes too) are not nesting.
  f.payload = "{\"s\":\"" + std::string(1000, '[') + "\\\"" + std::string(1000, '{') + "\"}";
  EXPECT_EQ(parse_json(f)["s"].get<std::string>().size(), 2001u);
  EXPECT_FALSE(json_too_deep("[[[\"]]]]]]]\"]]]", 3));
  EXPECT_TRUE(json_too_deep("[[[[]]]]", 3));
  // Over kMaxPayload (a frame not from the decoder): refused before parsing.
  f.payload = "{\"x\":\"" + std::string(kMaxPayload, 'a') + "\"}";
  EXPECT_THROW(parse_json(f), Error);
}

TEST(Messages, FieldAccessors) {
  json j = {{"s", "x"}, {"b", true}, {"i", 7}, {"f", 2.0}, {"g", 2.5}, {"n", nullptr}};
  EXPECT_EQ(optional_string(j, "s"), "x");
  EXPECT_EQ(optional_string(j, "missing"), std::nullopt);
  EXPECT_EQ(optional_string(j, "n"), std::nullopt);
  EXPECT_TRUE(optional_bool(j, "b", false));
  EXPECT_TRUE(optional_bool(j, "missing", true));
  EXPECT_EQ(optional_int(j, "i", 0), 7);
  EXPECT_EQ(optional_int(j, "f", 0), 2);
  EXPECT_EQ(optional_int(j, "missing", -3), -3);
  try {
    optional_int(j, "g", 0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_EQ(e.field(), "g");
  }
  try {
    optional_int(j, "i", 0, 0, 5);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "i");
  }
  try {
    require_string(j, "b");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "b");
    EXPECT_NE(std::string(e.what()).find("must be a string"), std::string::npos);
  }
  try {
    require_string(j, "missing");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing is required"), std::string::npos);
  }
  EXPECT_THROW(optional_bool(j, "s", false), Error);
}

TEST(Messages, Errors) {
  json e = error_json(code::not_found, "stat /x: No such file");
  EXPECT_TRUE(is_error(e));
  EXPECT_FALSE(is_error(json::object()));
  try {
    throw_if_error(e);
    FAIL();
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), Errc::not_found);
    EXPECT_EQ(std::string(err.what()), "guest: stat /x: No such file");
  }
  EXPECT_NO_THROW(throw_if_error(json{{"size", 1}}));
  EXPECT_EQ(errc_from_guest_code("exists"), Errc::conflict);
  EXPECT_EQ(errc_from_guest_code("something_new"), Errc::guest_error);
  EXPECT_STREQ(code_for_errno(ENOENT), "not_found");
  EXPECT_STREQ(code_for_errno(ENOSPC), "no_space");
  EXPECT_STREQ(code_for_errno(EIO), "io_error");
}

TEST(Messages, Hex) {
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  EXPECT_EQ(from_hex(to_hex(all)), all);
  EXPECT_EQ(to_hex("\x01\xab"), "01ab");
  EXPECT_EQ(from_hex("01AB"), "\x01\xab");
  EXPECT_THROW(from_hex("abc"), Error);
  EXPECT_THROW(from_hex("zz"), Error);
}

}  // namespace
}  // namespace airlock::protocol

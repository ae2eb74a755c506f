#include "e2b/connect.h"

#include <gtest/gtest.h>

namespace airlock::e2b::connect {
namespace {

using nlohmann::json;

Code code_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const RpcError& e) {
    return e.code();
  }
  ADD_FAILURE() << "no RpcError";
  return Code::unknown;
}

TEST(Connect, EnvelopeIsFlagThenBigEndianLength) {
  std::string e = envelope(0x02, std::string(258, 'x'));
  ASSERT_EQ(e.size(), 263u);
  EXPECT_EQ(e[0], 0x02);
  EXPECT_EQ(e.substr(1, 4), std::string("\0\0\x01\x02", 4));
  EXPECT_EQ(message_envelope(json{{"a", 1}}), std::string("\0\0\0\0\x07{\"a\":1}", 12));
}

TEST(Connect, EndOfStreamCarriesTheErrorOrNothing) {
  std::string ok = end_stream_envelope(nullptr);
  EXPECT_EQ(ok, std::string("\x02\0\0\0\x02{}", 7));
  RpcError err(Code::not_found, "process with pid 7 not found");
  std::string bad = end_stream_envelope(&err);
  EXPECT_EQ(static_cast<uint8_t>(bad[0]), kFlagEndStream);
  json j = json::parse(bad.substr(5));
  EXPECT_EQ(j["error"]["code"], "not_found");
  EXPECT_EQ(j["error"]["message"], "process with pid 7 not found");
}

TEST(Connect, ParsesOneStreamRequest) {
  json j = parse_stream_request(envelope(0, R"({"process":{"cmd":"ls"}})"));
  EXPECT_EQ(j["process"]["cmd"], "ls");
}

TEST(Connect, MalformedEnvelopesAreInvalidArgument) {
  EXPECT_EQ(code_of([] { parse_stream_request(""); }), Code::invalid_argument);
  EXPECT_EQ(code_of([] { parse_stream_request(std::string("\0\0\0", 3)); }),
            Code::invalid_argument);
  // Announces 10 bytes, carries 2.
  EXPECT_EQ(code_of([] { parse_stream_request(std::string("\0\0\0\0\x0a{}", 7)); }),
            Code::invalid_argument);
  // Two messages on a server-streaming call.
  EXPECT_EQ(code_of([] { parse_stream_request(envelope(0, "{}") + envelope(0, "{}")); }),
            Code::invalid_argument);
  // Compressed without an agreed encoding, end-of-stream flag from a client.
  EXPECT_EQ(code_of([] { parse_stream_request(envelope(kFlagCompressed, "{}")); }),
            Code::invalid_argument);
  EXPECT_EQ(code_of([] { parse_stream_request(envelope(kFlagEndStream, "{}")); }),
            Code::invalid_argument);
  // Not JSON, not an object.
  EXPECT_EQ(code_of([] { parse_stream_request(envelope(0, "{nope")); }), Code::invalid_argument);
  EXPECT_EQ(code_of([] { parse_stream_request(envelope(0, "[1]")); }), Code::invalid_argument);
}

TEST(Connect, OversizedMessagesAreRefusedByTheirHeader) {
  // The header alone decides: 5 MiB announced, nothing else sent.
  std::string head = envelope(0, "").substr(0, 1) + std::string("\0\x50\0\0", 4);
  EXPECT_EQ(code_of([&] { parse_stream_request(head); }), Code::resource_exhausted);
  EXPECT_EQ(code_of([] { parse_stream_request(envelope(0, std::string(100, ' ') + "{}"), 64); }),
            Code::resource_exhausted);
  EXPECT_NO_THROW(parse_stream_request(envelope(0, std::string(62, ' ') + "{}"), 64));
}

TEST(Connect, UnaryBodies) {
  EXPECT_EQ(parse_unary_request(""), json::object());
  EXPECT_EQ(parse_unary_request(R"({"x":1})")["x"], 1);
  EXPECT_EQ(code_of([] { parse_unary_request("null"); }), Code::invalid_argument);
  EXPECT_EQ(code_of([] { parse_unary_request("{"); }), Code::invalid_argument);
}

TEST(Connect, HttpStatusOfCodesFollowsTheSpecification) {
  EXPECT_EQ(http_status(Code::not_found), 404);
  EXPECT_EQ(http_status(Code::invalid_argument), 400);
  EXPECT_EQ(http_status(Code::unauthenticated), 401);
  EXPECT_EQ(http_status(Code::resource_exhausted), 429);
  EXPECT_EQ(http_status(Code::deadline_exceeded), 504);
  EXPECT_EQ(http_status(Code::unavailable), 503);
  EXPECT_EQ(http_status(Code::unimplemented), 501);
  EXPECT_EQ(http_status(Code::failed_precondition), 400);
  EXPECT_EQ(code_name(Code::failed_precondition), "failed_precondition");
  EXPECT_EQ(error_json(RpcError(Code::canceled, "m")),
            (json{{"code", "canceled"}, {"message", "m"}}));
}

TEST(Connect, AirlockErrorsMapToConnectCodes) {
  EXPECT_EQ(from_error(Error(Errc::not_found, "x")).code(), Code::not_found);
  EXPECT_EQ(from_error(Error(Errc::conflict, "x")).code(), Code::failed_precondition);
  EXPECT_EQ(from_error(Error(Errc::timeout, "x")).code(), Code::deadline_exceeded);
  EXPECT_EQ(from_error(Error(Errc::invalid_argument, "x")).code(), Code::invalid_argument);
  EXPECT_EQ(from_error(Error(Errc::quota_exceeded, "x")).code(), Code::resource_exhausted);
}

TEST(Connect, ProtobufJsonFields) {
  EXPECT_EQ(decode_bytes("aGk=", "stdin"), "hi");
  EXPECT_EQ(decode_bytes("aGk", "stdin"), "hi");     // padding optional
  EXPECT_EQ(decode_bytes("-_8=", "x"), "\xfb\xff");  // URL-safe alphabet
  EXPECT_EQ(code_of([] { decode_bytes("!!", "x"); }), Code::invalid_argument);
  EXPECT_EQ(code_of([] { decode_bytes(5, "x"); }), Code::invalid_argument);
  EXPECT_EQ(encode_bytes("hi"), "aGk=");
  EXPECT_EQ(get_uint32(json{{"pid", 7}}, "pid"), 7u);
  EXPECT_EQ(get_uint32(json{{"pid", "7"}}, "pid"), 7u);
  EXPECT_EQ(get_uint32(json::object(), "pid", 3), 3u);
  EXPECT_EQ(code_of([] { get_uint32(json{{"pid", -1}}, "pid"); }), Code::invalid_argument);
  EXPECT_EQ(code_of([] {
              get_uint32(json{{"pid", "99999999999"}}, "pid");
            }),
            Code::invalid_argument);
}

}  // namespace
}  // namespace airlock::e2b::connect

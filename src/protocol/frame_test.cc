#include "protocol/frame.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "common/error.h"

namespace airlock::protocol {
namespace {

Frame make(Type t, uint8_t ch, uint32_t stream, std::string payload) {
  Frame f;
  f.type = t;
  f.channel = ch;
  f.stream = stream;
  f.payload = std::move(payload);
  return f;
}

bool same(const Frame& a, const Frame& b) {
  return a.type == b.type && a.channel == b.channel && a.stream == b.stream &&
         a.payload == b.payload;
}

std::string all_bytes() {
  std::string s;
  for (int i = 0; i < 256; ++i) s.push_back(static_cast<char>(i));
  return s;
}

std::vector<Frame> sample_frames() {
  return {make(Type::hello, 0, 0, R"({"version":1})"),
          make(Type::request, 0, 1, R"({"op":"ping"})"),
          make(Type::data, 1, 0xfffffffe, all_bytes()),
          make(Type::eof, 2, 7, ""),
          make_credit(3, 1, 123456),
          make(Type::data, 0, 9, std::string(kMaxPayload, 'x'))};
}

// Expects `f` to throw Error with code protocol_error.
template <typename F>
void expect_protocol_error(F f) {
  try {
    f();
    FAIL() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::protocol_error) << e.what();
  }
}

TEST(Frame, HeaderLayoutIsLittleEndian) {
  std::string b = encode(make(Type::data, 2, 0x01020304, "ab"));
  ASSERT_EQ(b.size(), kHeaderSize + 2);
  EXPECT_EQ(b.substr(0, 4), std::string("\x02\x00\x00\x00", 4));
  EXPECT_EQ(b[4], 4);  // data
  EXPECT_EQ(b[5], 2);  // channel
  EXPECT_EQ(b.substr(6, 2), std::string("\x00\x00", 2));
  EXPECT_EQ(b.substr(8, 4), "\x04\x03\x02\x01");
  EXPECT_EQ(b.substr(12), "ab");
}

TEST(Frame, RoundTripEachFrame) {
  for (const Frame& f : sample_frames()) {
    Decoder d;
    d.feed(encode(f));
    auto got = d.next();
    ASSERT_TRUE(got);
    EXPECT_TRUE(same(*got, f));
    EXPECT_FALSE(d.next());
    EXPECT_EQ(d.buffered(), 0u);
  }
}

TEST(Frame, EverySplitOfAByteStream) {
  std::string stream;
  auto frames = sample_frames();
  frames.pop_back();  // keep the quadratic loop fast; the big frame is covered below
  for (const Frame& f : frames) encode_to(stream, f);
  for (size_t cut = 0; cut <= stream.size(); ++cut) {
    Decoder d;
    std::vector<Frame> got;
    d.feed(stream.data(), cut);
    while (auto f = d.next()) got.push_back(*f);
    d.feed(stream.data() + cut, stream.size() - cut);
    while (auto f = d.next()) got.push_back(*f);
    ASSERT_EQ(got.size(), frames.size()) << "cut " << cut;
    for (size_t i = 0; i < frames.size(); ++i) EXPECT_TRUE(same(got[i], frames[i]));
  }
}

TEST(Frame, ByteAtATimeAndRandomChunks) {
  std::string stream;
  auto frames = sample_frames();
  for (const Frame& f : frames) encode_to(stream, f);
  Decoder d;
  std::vector<Frame> got;
  for (char c : stream) {
    d.feed(&c, 1);
    while (auto f = d.next()) got.push_back(*f);
  }
  ASSERT_EQ(got.size(), frames.size());
  std::mt19937 rng(42);
  for (int round = 0; round < 50; ++round) {
    Decoder d2;
    size_t n = 0, pos = 0;
    while (pos < stream.size()) {
      size_t len = std::min<size_t>(stream.size() - pos, rng() % 70000 + 1);
      d2.feed(stream.data() + pos, len);
      pos += len;
      while (auto f = d2.next()) ASSERT_TRUE(same(*f, frames[n++]));
    }
    EXPECT_EQ(n, frames.size());
  }
}

TEST(Frame, EncodeRejectsOversizedPayload) {
  expect_protocol_error([] { encode(make(Type::data, 1, 1, std::string(kMaxPayload + 1, 'x'))); });
}

TEST(Frame, OversizedLengthRejectedFromHeaderAlone) {
  std::string h = encode(make(Type::data, 1, 5, ""));
  uint32_t len = kMaxPayload + 1;
  std::memcpy(h.data(), &len, 4);  // little-endian host
  Decoder d;
  d.feed(h);  // header only: rejected before any payload arrives
  expect_protocol_error([&] { d.next(); });
}

TEST(Frame, UnknownTypeRejected) {
  for (int t : {0, 9, 255}) {
    std::string b = encode(make(Type::data, 0, 1, "x"));
    b[4] = static_cast<char>(t);
    Decoder d;
    d.feed(b);
    expect_protocol_error([&] { d.next(); });
  }
}

TEST(Frame, NonzeroFlagsAndUnknownChannelRejected) {
  for (int byte : {6, 7}) {
    std::string b = encode(make(Type::eof, 1, 1, ""));
    b[byte] = 1;
    Decoder d;
    d.feed(b);
    expect_protocol_error([&] { d.next(); });
  }
  std::string b = encode(make(Type::eof, 1, 1, ""));
  b[5] = 3;
  Decoder d;
  d.feed(b);
  expect_protocol_error([&] { d.next(); });
}

TEST(Frame, PoisonedAfterErrorUntilReset) {
  std::string bad = encode(make(Type::data, 0, 1, "x"));
  bad[4] = 99;
  Decoder d;
  d.feed(bad);
  std::string first;
  try {
    d.next();
  } catch (const Error& e) {
    first = e.what();
  }
  EXPECT_NE(first.find("unknown frame type 99"), std::string::npos) << first;
  EXPECT_TRUE(d.poisoned());
  // Even valid bytes afterwards do not revive it, and the error is the same.
  try {
    d.feed(encode(make(Type::request, 0, 2, "{}")));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), first);
  }
  expect_protocol_error([&] { d.next(); });
  d.reset();
  EXPECT_FALSE(d.poisoned());
  d.feed(encode(make(Type::request, 0, 2, "{}")));
  auto f = d.next();
  ASSERT_TRUE(f);
  EXPECT_EQ(f->stream, 2u);
}

TEST(Frame, FeedRefusesUnboundedBuffering) {
  Decoder d;
  std::string big(kMaxBuffered, '\0');
  d.feed(big.data(), kHeaderSize);  // fine
  expect_protocol_error([&] { d.feed(big); });
}

TEST(Frame, Credit) {
  Frame c = make_credit(4, 2, 0xdeadbeef);
  EXPECT_EQ(c.type, Type::credit);
  EXPECT_EQ(c.channel, 2);
  EXPECT_EQ(parse_credit(c), 0xdeadbeefu);
  Frame bad = c;
  bad.payload.pop_back();
  expect_protocol_error([&] { parse_credit(bad); });
  expect_protocol_error([&] { parse_credit(make(Type::data, 1, 1, "abcd")); });
}

TEST(Frame, FindHelloHeader) {
  std::string garbage = "\xff\x01garbage\x00\x01\x02";
  std::string hello = encode(make(Type::hello, 0, 0, R"({"version":1})"));
  std::string s = garbage + encode(make(Type::request, 0, 3, "{}")) + hello;
  size_t at = find_hello_header(s);
  ASSERT_NE(at, std::string_view::npos);
  EXPECT_EQ(s.substr(at), hello);
  EXPECT_EQ(find_hello_header(garbage), std::string_view::npos);
  // A cut-off header is not reported.
  EXPECT_EQ(find_hello_header(hello.substr(0, kHeaderSize - 1)), std::string_view::npos);
  // A hello header with an oversized length is not a resync point.
  std::string big = hello;
  big[2] = 0x10;
  EXPECT_EQ(find_hello_header(big), std::string_view::npos);
}

}  // namespace
}  // namespace airlock::protocol

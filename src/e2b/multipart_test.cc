#include "e2b/multipart.h"

#include <gtest/gtest.h>

#include <vector>

#include "common/error.h"

namespace airlock::e2b {
namespace {

// A source handing out `body` in pieces of `step` bytes.
MultipartReader::Source pieces(std::string body, size_t step) {
  return [body = std::move(body), step, off = size_t(0)]() mutable -> std::optional<std::string> {
    if (off >= body.size()) return std::nullopt;
    std::string out = body.substr(off, step);
    off += out.size();
    return out;
  };
}

struct Part {
  std::string name, filename, content;
};

std::vector<Part> parse(const std::string& body, size_t step, size_t read_max = 7) {
  MultipartReader r("XyZ", pieces(body, step));
  std::vector<Part> parts;
  while (r.next_part()) {
    Part p{r.name(), r.filename(), ""};
    while (auto piece = r.read(read_max)) {
      EXPECT_LE(piece->size(), read_max);
      p.content += *piece;
    }
    parts.push_back(p);
  }
  return parts;
}

std::string body_of(const std::vector<Part>& parts) {
  std::string b = "preamble\r\n";
  for (auto& p : parts)
    b += "--XyZ\r\nContent-Disposition: form-data; name=\"" + p.name + "\"; filename=\"" +
         p.filename + "\"\r\nContent-Type: application/octet-stream\r\n\r\n" + p.content + "\r\n";
  return b + "--XyZ--\r\nepilogue";
}

TEST(Multipart, PartsWithBinaryContentAtEveryChunking) {
  std::string binary;
  for (int i = 0; i < 3000; ++i) binary.push_back(static_cast<char>(i * 31));
  // Delimiter look-alikes inside content (a real boundary never occurs in it).
  binary += "\r\n--XyY\r\n-\r\n--X\r\n--Xy";
  std::vector<Part> want = {{"file", "/home/user/a.txt", "hello"},
                            {"file", "/tmp/b%22c.bin", binary},
                            {"file", "/tmp/empty", ""}};
  std::string body = body_of(want);
  for (size_t step : {1, 2, 5, 64, 1000, 100000}) {
    auto got = parse(body, step);
    ASSERT_EQ(got.size(), 3u) << step;
    EXPECT_EQ(got[0].filename, "/home/user/a.txt");
    EXPECT_EQ(got[1].filename, "/tmp/b\"c.bin");
    EXPECT_TRUE(got[1].content == binary) << step;
    EXPECT_EQ(got[2].content, "");
    EXPECT_EQ(got[0].name, "file");
  }
}

TEST(Multipart, UnreadPartsAreSkipped) {
  MultipartReader r("XyZ", pieces(body_of({{"a", "1", "xxxx"}, {"file", "/f", "data"}}), 3));
  ASSERT_TRUE(r.next_part());
  ASSERT_TRUE(r.next_part());
  EXPECT_EQ(r.filename(), "/f");
  std::string got;
  while (auto piece = r.read(100)) got += *piece;  // pieces of 1..100 bytes
  EXPECT_EQ(got, "data");
  EXPECT_FALSE(r.next_part());
  EXPECT_FALSE(r.next_part());
}

TEST(Multipart, MalformedBodiesAreClearErrors) {
  auto fails = [](const std::string& body, const std::string& words) {
    try {
      parse(body, 4);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_argument);
      EXPECT_EQ(e.field(), "body");
      return std::string(e.what()).find(words) != std::string::npos;
    }
    return false;
  };
  EXPECT_TRUE(fails("no delimiter at all", "no boundary"));
  EXPECT_TRUE(fails("--XyZ\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nabc",
                    "ends inside a part"));
  EXPECT_TRUE(fails("--XyZ\r\nContent-Disposition: form-data", "inside a part's headers"));
  EXPECT_TRUE(
      fails("--XyZ\r\n" + std::string(20000, 'h') + "\r\n\r\nx\r\n--XyZ--", "longer than 16 KiB"));
  EXPECT_TRUE(fails("--XyZ\r\nContent-Disposition: form-data; name=\"fi\r\n\r\nx\r\n--XyZ--",
                    "unterminated"));
  EXPECT_TRUE(fails("--XyZ", "ends after a delimiter"));
  std::string many;
  for (int i = 0; i < 1001; ++i) many += "--XyZ\r\nA: b\r\n\r\nx\r\n";
  EXPECT_TRUE(fails(many + "--XyZ--", "more than 1000 parts"));
}

TEST(Multipart, BoundaryFromContentType) {
  EXPECT_EQ(boundary_of("multipart/form-data; boundary=----formdata-undici-0123"),
            "----formdata-undici-0123");
  EXPECT_EQ(boundary_of("multipart/form-data; charset=utf-8; boundary=\"a b\""), "a b");
  EXPECT_THROW(boundary_of("multipart/form-data"), Error);
  EXPECT_THROW(boundary_of("multipart/form-data; boundary=" + std::string(71, 'a')), Error);
}

}  // namespace
}  // namespace airlock::e2b

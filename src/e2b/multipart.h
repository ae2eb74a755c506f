// A streaming reader of multipart/form-data bodies (RFC 7578), for envd's
// POST /files: the E2B SDK sends several files in one upload, each a part
// named "file" whose filename is the destination path. Parts are read piece
// by piece from the request body as the guest takes them, so memory stays
// bounded (one chunk plus the delimiter) whatever the files' sizes.
//
//   MultipartReader r(boundary_of(content_type), [&] { return ex.read_chunk(n); });
//   while (r.next_part()) { if (r.name() == "file") write(r.filename(), [&] { return r.read(n); });
//   }
//
// Malformed bodies (no delimiter, a part without headers' end, headers over
// kMaxHeaders, a body that ends inside a part, more than kMaxParts parts)
// are Error(invalid_argument) naming the problem, field "body".
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace airlock::e2b {

// The boundary parameter of a multipart Content-Type; Error(invalid_argument,
// field "Content-Type") if there is none or it is not 1..70 characters.
std::string boundary_of(std::string_view content_type);

class MultipartReader {
 public:
  using Source = std::function<std::optional<std::string>()>;
  static constexpr size_t kMaxHeaders = 16 * 1024;
  static constexpr size_t kMaxParts = 1000;

  MultipartReader(std::string boundary, Source source);

  // Skips what is left of the current part and moves to the next one;
  // false after the closing delimiter.
  bool next_part();
  // The current part's form field name and filename (percent escapes of
  // ", CR and LF decoded, as browsers and Node encode them; "" if none).
  const std::string& name() const { return name_; }
  const std::string& filename() const { return filename_; }
  // The next piece (1..max bytes) of the current part's content;
  // std::nullopt at its end.
  std::optional<std::string> read(size_t max);

 private:
  bool fill();  // appends the next chunk of the source; false at its end
  void parse_headers(std::string_view headers);

  std::string delimiter_;  // "\r\n--" + boundary
  Source source_;
  std::string buf_;
  bool source_done_ = false;
  bool started_ = false;  // the first delimiter was found
  bool in_part_ = false;
  bool finished_ = false;
  size_t parts_ = 0;
  std::string name_, filename_;
};

}  // namespace airlock::e2b

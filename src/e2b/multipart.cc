#include "e2b/multipart.h"

#include <algorithm>
#include <cctype>

#include "common/error.h"

namespace airlock::e2b {
namespace {

[[noreturn]] void malformed(const std::string& why) {
  throw Error(Errc::invalid_argument, "malformed multipart body: " + why, "body");
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// The value of parameter `key` in a header like
// `form-data; name="file"; filename="/a/b"` (quoted or token), or nullopt.
std::optional<std::string> param(std::string_view header, std::string_view key) {
  size_t i = header.find(';');
  while (i != std::string_view::npos && i < header.size()) {
    ++i;
    while (i < header.size() && (header[i] == ' ' || header[i] == '\t')) ++i;
    size_t eq = header.find('=', i);
    if (eq == std::string_view::npos) return std::nullopt;
    std::string k = lower(header.substr(i, eq - i));
    while (!k.empty() && k.back() == ' ') k.pop_back();
    size_t v = eq + 1;
    std::string value;
    size_t end;
    if (v < header.size() && header[v] == '"') {
      end = v + 1;
      while (end < header.size() && header[end] != '"') {
        if (header[end] == '\\' && end + 1 < header.size()) ++end;
        value.push_back(header[end++]);
      }
      if (end >= header.size()) malformed("unterminated quoted parameter in Content-Disposition");
      end = header.find(';', end);
    } else {
      end = header.find(';', v);
      value = std::string(header.substr(v, end == std::string_view::npos ? end : end - v));
      while (!value.empty() && value.back() == ' ') value.pop_back();
    }
    if (k == key) return value;
    i = end;
  }
  return std::nullopt;
}

// Node's and browsers' FormData escape these three in a filename.
std::string unescape_filename(std::string s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      std::string code = lower(s.substr(i + 1, 2));
      char c = code == "22" ? '"' : code == "0a" ? '\n' : code == "0d" ? '\r' : 0;
      if (c) {
        out.push_back(c);
        i += 2;
        continue;
      }
    }
    out.push_back(s[i]);
  }
  return out;
}

}  // namespace

std::string boundary_of(std::string_view content_type) {
  auto b = param(content_type, "boundary");
  if (!b || b->empty() || b->size() > 70)
    throw Error(Errc::invalid_argument, "multipart Content-Type without a valid boundary",
                "Content-Type");
  return *b;
}

MultipartReader::MultipartReader(std::string boundary, Source source)
    : delimiter_("\r\n--" + boundary), source_(std::move(source)) {
  // The first delimiter has no CRLF before it: pretend it had one.
  buf_ = "\r\n";
}

bool MultipartReader::fill() {
  if (source_done_) return false;
  auto chunk = source_();
  if (!chunk) {
    source_done_ = true;
    return false;
  }
  buf_ += *chunk;
  return true;
}

bool MultipartReader::next_part() {
  if (finished_) return false;
  if (in_part_) {
    while (read(64 * 1024)) {
    }
  } else if (!started_) {
    started_ = true;
    // Before the first part: skip the preamble up to the first delimiter.
    size_t pos;
    while ((pos = buf_.find(delimiter_)) == std::string::npos) {
      if (buf_.size() > delimiter_.size())  // keep a possible partial delimiter
        buf_.erase(0, buf_.size() - delimiter_.size());
      if (!fill()) malformed("no boundary delimiter found");
    }
    buf_.erase(0, pos + delimiter_.size());
  }
  // After a delimiter: "--" closes the body, else (transport padding and)
  // CRLF start a part's headers.
  while (buf_.size() < 2)
    if (!fill()) malformed("body ends after a delimiter");
  if (buf_.compare(0, 2, "--") == 0) {
    finished_ = true;
    in_part_ = false;
    return false;
  }
  size_t hdr_end;
  while ((hdr_end = buf_.find("\r\n\r\n")) == std::string::npos) {
    if (buf_.size() > kMaxHeaders) malformed("part headers longer than 16 KiB");
    if (!fill()) malformed("body ends inside a part's headers");
  }
  if (hdr_end > kMaxHeaders) malformed("part headers longer than 16 KiB");
  if (++parts_ > kMaxParts) malformed("more than 1000 parts");
  size_t line_end = buf_.find("\r\n");
  for (size_t i = 0; i < line_end; ++i)
    if (buf_[i] != ' ' && buf_[i] != '\t') malformed("garbage after a boundary delimiter");
  parse_headers(std::string_view(buf_).substr(line_end + 2, hdr_end + 2 - (line_end + 2)));
  buf_.erase(0, hdr_end + 4);
  in_part_ = true;
  return true;
}

void MultipartReader::parse_headers(std::string_view headers) {
  name_.clear();
  filename_.clear();
  size_t start = 0;
  while (start < headers.size()) {
    size_t end = headers.find("\r\n", start);
    if (end == std::string_view::npos) end = headers.size();
    std::string_view line = headers.substr(start, end - start);
    start = end + 2;
    size_t colon = line.find(':');
    if (colon == std::string_view::npos) {
      if (line.empty()) continue;
      malformed("a part header line without ':'");
    }
    if (lower(line.substr(0, colon)) != "content-disposition") continue;
    std::string_view value = line.substr(colon + 1);
    name_ = param(value, "name").value_or("");
    filename_ = unescape_filename(param(value, "filename").value_or(""));
  }
}

std::optional<std::string> MultipartReader::read(size_t max) {
  if (!in_part_) return std::nullopt;
  max = std::max<size_t>(max, 1);
  for (;;) {
    size_t pos = buf_.find(delimiter_);
    if (pos == 0) {
      buf_.erase(0, delimiter_.size());
      in_part_ = false;  // just after a delimiter, as next_part() expects
      return std::nullopt;
    }
    // Bytes that cannot be the start of a delimiter are safe to hand out.
    size_t safe =
        pos != std::string::npos
            ? pos
            : (buf_.size() >= delimiter_.size() ? buf_.size() - (delimiter_.size() - 1) : 0);
    if (safe > 0) {
      size_t n = std::min(safe, max);
      std::string out = buf_.substr(0, n);
      buf_.erase(0, n);
      return out;
    }
    if (!fill()) malformed("body ends inside a part (no closing delimiter)");
  }
}

}  // namespace airlock::e2b

#include "frame_decoder_entry.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/error.h"
#include "protocol/frame.h"
#include "protocol/messages.h"

namespace airlock::fuzz {
namespace {

[[noreturn]] void broken(const char* what) {
  std::fprintf(stderr, "frame_decoder invariant broken: %s\n", what);
  std::abort();
}

void check_frame(const protocol::Frame& f) {
  if (f.payload.size() > protocol::kMaxPayload) broken("payload larger than kMaxPayload");
  // Re-encoding and decoding again must give back the same frame.
  std::string bytes = protocol::encode(f);
  if (bytes.size() != protocol::kHeaderSize + f.payload.size()) broken("encoded size");
  protocol::Decoder again;
  again.feed(bytes);
  auto g = again.next();
  if (!g || g->type != f.type || g->channel != f.channel || g->stream != f.stream ||
      g->payload != f.payload)
    broken("round trip");
  // The message helpers must reject bad payloads with Error, nothing else.
  try {
    if (f.type == protocol::Type::credit)
      (void)protocol::parse_credit(f);
    else if (f.type != protocol::Type::data) {
      nlohmann::json j = protocol::parse_json(f);
      // What it accepts is bounded in nesting, so the recursive parts of
      // nlohmann (dump, copy, compare) are safe on it.
      if (protocol::json_too_deep(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)))
        broken("parse_json accepted JSON nested deeper than kMaxJsonDepth");
    }
  } catch (const Error&) {
  }
}

}  // namespace

int frame_decoder_one_input(const uint8_t* data, size_t size) {
  std::string_view all(reinterpret_cast<const char*>(data), size);
  // The resync scanner must never read out of bounds or return a bad offset.
  size_t h = protocol::find_hello_header(all);
  if (h != std::string_view::npos && h + protocol::kHeaderSize > size) broken("find_hello_header");

  size_t chunk = size ? (data[0] % 31) + 1 : 1;
  if (size && data[0] >= 248) chunk = protocol::kMaxPayload;  // also large feeds
  protocol::Decoder d;
  size_t frames = 0;
  try {
    for (size_t pos = 0; pos < size; pos += chunk) {
      d.feed(all.substr(pos, chunk));
      while (auto f = d.next()) {
        check_frame(*f);
        ++frames;
      }
      if (d.buffered() > protocol::kMaxBuffered) broken("buffered beyond kMaxBuffered");
    }
  } catch (const Error& e) {
    if (e.code() != Errc::protocol_error)
      broken("decoder threw an Error that is not protocol_error");
    if (!d.poisoned()) broken("decoder not poisoned after an error");
    // Poisoned: every later call fails too.
    try {
      d.next();
      broken("poisoned decoder returned from next()");
    } catch (const Error&) {
    }
  }
  (void)frames;
  return 0;
}

}  // namespace airlock::fuzz

#include "protocol/frame.h"

#include <cstring>

#include "common/error.h"

namespace airlock::protocol {
namespace {

void put_u32(std::string& out, uint32_t v) {
  char b[4] = {static_cast<char>(v & 0xff), static_cast<char>((v >> 8) & 0xff),
               static_cast<char>((v >> 16) & 0xff), static_cast<char>((v >> 24) & 0xff)};
  out.append(b, 4);
}

uint32_t get_u32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return uint32_t{u[0]} | uint32_t{u[1]} << 8 | uint32_t{u[2]} << 16 | uint32_t{u[3]} << 24;
}

bool valid_type(uint8_t t) {
  return t >= static_cast<uint8_t>(Type::hello) && t <= static_cast<uint8_t>(Type::event);
}

// Channels 0..2 are all version 1 defines; anything else means the peer
// speaks a different protocol (or the stream is corrupt).
constexpr uint8_t kMaxChannel = static_cast<uint8_t>(Channel::err);

}  // namespace

void encode_to(std::string& out, const Frame& frame) {
  if (frame.payload.size() > kMaxPayload)
    throw Error(Errc::protocol_error, "frame payload of " + std::to_string(frame.payload.size()) +
                                          " bytes exceeds the maximum of " +
                                          std::to_string(kMaxPayload));
  if (!valid_type(static_cast<uint8_t>(frame.type)))
    throw Error(Errc::protocol_error,
                "unknown frame type " + std::to_string(static_cast<int>(frame.type)));
  if (frame.channel > kMaxChannel)
    throw Error(Errc::protocol_error, "unknown channel " + std::to_string(frame.channel));
  out.reserve(out.size() + kHeaderSize + frame.payload.size());
  put_u32(out, static_cast<uint32_t>(frame.payload.size()));
  out.push_back(static_cast<char>(frame.type));
  out.push_back(static_cast<char>(frame.channel));
  out.push_back(0);  // flags, low byte
  out.push_back(0);  // flags, high byte
  put_u32(out, frame.stream);
  out.append(frame.payload);
}

std::string encode(const Frame& frame) {
  std::string out;
  encode_to(out, frame);
  return out;
}

Frame make_credit(uint32_t stream, uint8_t channel, uint32_t bytes) {
  Frame f;
  f.type = Type::credit;
  f.channel = channel;
  f.stream = stream;
  put_u32(f.payload, bytes);
  return f;
}

uint32_t parse_credit(const Frame& frame) {
  if (frame.type != Type::credit)
    throw Error(Errc::protocol_error, "parse_credit called on a frame that is not a credit frame");
  if (frame.payload.size() != 4)
    throw Error(Errc::protocol_error, "credit frame payload must be 4 bytes, got " +
                                          std::to_string(frame.payload.size()));
  return get_u32(frame.payload.data());
}

void Decoder::feed(const char* data, size_t size) {
  if (!error_.empty()) throw Error(Errc::protocol_error, error_);
  if (buffered() + size > kMaxBuffered) {
    error_ = "decoder buffer limit exceeded: " + std::to_string(buffered() + size) +
             " bytes buffered (max " + std::to_string(kMaxBuffered) + "); drain next() first";
    throw Error(Errc::protocol_error, error_);
  }
  // Compact lazily: only move the unread tail when the consumed prefix is
  // the larger part, so feeding stays amortised O(n).
  if (offset_ > 0 && offset_ >= buffer_.size() / 2) {
    buffer_.erase(0, offset_);
    offset_ = 0;
  }
  buffer_.append(data, size);
}

std::optional<Frame> Decoder::next() {
  if (!error_.empty()) throw Error(Errc::protocol_error, error_);
  if (buffered() < kHeaderSize) return std::nullopt;
  const char* h = buffer_.data() + offset_;
  const uint32_t len = get_u32(h);
  const auto type = static_cast<uint8_t>(h[4]);
  const auto channel = static_cast<uint8_t>(h[5]);
  const uint16_t flags = static_cast<uint16_t>(static_cast<unsigned char>(h[6]) |
                                               static_cast<unsigned char>(h[7]) << 8);
  const uint32_t stream = get_u32(h + 8);
  // Validate the header before waiting for the payload: an oversized length
  // is refused without buffering anything more.
  if (len > kMaxPayload)
    error_ = "frame payload length " + std::to_string(len) + " exceeds the maximum of " +
             std::to_string(kMaxPayload);
  else if (!valid_type(type))
    error_ = "unknown frame type " + std::to_string(type);
  else if (channel > kMaxChannel)
    error_ = "unknown channel " + std::to_string(channel);
  else if (flags != 0)
    error_ = "nonzero frame flags " + std::to_string(flags) + " (must be 0 in version 1)";
  if (!error_.empty()) {
    error_ += " (stream " + std::to_string(stream) + ")";
    throw Error(Errc::protocol_error, error_);
  }
  if (buffered() < kHeaderSize + len) return std::nullopt;
  Frame f;
  f.type = static_cast<Type>(type);
  f.channel = channel;
  f.stream = stream;
  f.payload.assign(h + kHeaderSize, len);
  offset_ += kHeaderSize + len;
  if (offset_ == buffer_.size()) {
    buffer_.clear();
    offset_ = 0;
  }
  return f;
}

}  // namespace airlock::protocol

namespace airlock::protocol {

size_t find_hello_header(std::string_view bytes) {
  for (size_t i = 0; i + kHeaderSize <= bytes.size(); ++i) {
    const char* h = bytes.data() + i;
    if (static_cast<uint8_t>(h[4]) != static_cast<uint8_t>(Type::hello)) continue;
    if (h[5] != 0 || h[6] != 0 || h[7] != 0 || get_u32(h + 8) != 0) continue;
    if (get_u32(h) > kMaxPayload) continue;
    return i;
  }
  return std::string_view::npos;
}

}  // namespace airlock::protocol

// Host<->guest wire format: length-prefixed binary frames over one
// virtio-serial port, multiplexing many streams. Full description (with the
// JSON messages of every operation) in api/guest-protocol.md.
//
// Frame layout (all integers little-endian), 12-byte header + payload:
//
//   u32 payload_len   0 .. kMaxPayload
//   u8  type          Type below; anything else is a protocol error
//   u8  channel       Channel below (meaningful for data/eof/credit)
//   u16 flags         must be 0 in version 1
//   u32 stream        0 = control (hello); requests use host-chosen ids >= 1
//   payload
//
// Flow control: the sender of `data` frames on a (stream, channel) may have at
// most kInitialCredit unacknowledged bytes in flight; the receiver returns
// credit (`credit` frame, payload = u32 byte count) as it consumes data. So a
// process flooding stdout can never grow the other side's memory unboundedly.
//
//   Decoder d;
//   d.feed(buf, n);                       // any split of the byte stream
//   while (auto f = d.next()) handle(*f); // throws Error(protocol_error) on bad input
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace airlock::protocol {

// Version 2: foreground execs with an exec_id survive the host
// going away (detach) and are resumed with the `attach` op.
inline constexpr uint32_t kVersion = 2;
// The oldest version a guest still answers (with that version).
inline constexpr uint32_t kMinVersion = 1;
inline constexpr size_t kHeaderSize = 12;
inline constexpr size_t kMaxPayload = 64 * 1024;
inline constexpr uint32_t kInitialCredit = 256 * 1024;
// A decoder holds at most one frame's worth of unconsumed bytes beyond what
// next() has returned; feed() refuses to buffer more than this.
inline constexpr size_t kMaxBuffered = 4 * (kHeaderSize + kMaxPayload);

enum class Type : uint8_t {
  hello = 1,     // stream 0, JSON both ways: version handshake (+ host time, entropy)
  request = 2,   // host->guest, JSON {"op": ...}: opens `stream`
  response = 3,  // guest->host, JSON: final result or {"error":{...}}; closes `stream`
  data = 4,      // raw bytes on `channel`
  eof = 5,       // end of `channel` on `stream`
  credit = 6,    // payload u32: bytes the receiver grants for `channel`
  signal = 7,    // host->guest on an exec stream, JSON {"signal": N}
  event = 8,     // guest->host, JSON progress (e.g. {"started": true, "pid": N})
};

enum class Channel : uint8_t {
  none = 0,
  in = 0,   // host->guest bytes: stdin of an exec, content of write_file
  out = 1,  // guest->host: stdout of an exec, content of read_file
  err = 2,  // guest->host: stderr of an exec
};

struct Frame {
  Type type = Type::hello;
  uint8_t channel = 0;
  uint32_t stream = 0;
  std::string payload;
};

// Encodes one frame. Throws Error(protocol_error) if the payload is too large.
std::string encode(const Frame& frame);
void encode_to(std::string& out, const Frame& frame);

// Convenience for credit frames.
Frame make_credit(uint32_t stream, uint8_t channel, uint32_t bytes);
uint32_t parse_credit(const Frame& frame);  // throws Error(protocol_error) if malformed

// Resynchronisation (api/guest-protocol.md §6): the offset in `bytes` of the
// first 12 bytes that form a valid hello header (payload_len <= kMaxPayload,
// type hello, channel 0, flags 0, stream 0), or npos. A header cut off at the
// end of `bytes` is not reported: keep the last kHeaderSize-1 bytes and retry.
size_t find_hello_header(std::string_view bytes);

// Incremental decoder; bytes may arrive split anywhere. After a protocol error
// the decoder is poisoned: every later call throws the same error.
class Decoder {
 public:
  void feed(const char* data, size_t size);
  void feed(std::string_view bytes) { feed(bytes.data(), bytes.size()); }
  std::optional<Frame> next();
  size_t buffered() const { return buffer_.size() - offset_; }
  // The bytes fed but not yet returned as frames (for resynchronisation
  // after an error: the bad header is at the front).
  std::string_view pending() const { return {buffer_.data() + offset_, buffered()}; }
  // True once next()/feed() threw: the byte stream has lost its framing.
  bool poisoned() const { return !error_.empty(); }
  // Forgets every buffered byte and the poison (new connection, or after
  // resynchronising on a hello header found with find_hello_header()).
  void reset() {
    buffer_.clear();
    offset_ = 0;
    error_.clear();
  }

 private:
  std::string buffer_;
  size_t offset_ = 0;
  std::string error_;
};

}  // namespace airlock::protocol

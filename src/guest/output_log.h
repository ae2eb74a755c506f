// The output log of one foreground exec (api/guest-protocol.md §5, "Detach
// and attach"): stdout and stderr as ONE combined sequence of bytes, in the
// order the agent read them, numbered from 0. It keeps the last `capacity`
// bytes, so a host that reconnects after a daemon restart can resume from
// the offset it had reached:
//
//   OutputLog log(1 << 20);
//   log.append(1, "hello\n", 6);          // stdout bytes 0..5
//   log.append(2, "oops\n", 5);           // stderr bytes 6..10
//   auto [ch, bytes] = log.at(6);         // ch 2, "oops\n"
//
// Beyond `capacity` the OLDEST bytes are evicted (the process never blocks
// while nobody reads); start() moves up, and lost() counts the evicted bytes
// no host was ever sent (mark_sent() records how far sending got).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <utility>

namespace airlock::guest {

class OutputLog {
 public:
  explicit OutputLog(size_t capacity) : cap_(capacity) {}

  // Appends bytes of `channel` (1 = stdout, 2 = stderr) at end().
  void append(uint8_t channel, const char* data, size_t size);
  // The offsets the log still holds: [start(), end()).
  uint64_t start() const { return start_; }
  uint64_t end() const { return end_; }
  // The channel and the bytes of the run containing `offset` (start() <=
  // offset < end()), from `offset` to the end of that run (one channel).
  std::pair<uint8_t, std::string_view> at(uint64_t offset) const;
  // A host was sent everything before `offset`.
  void mark_sent(uint64_t offset) {
    if (offset > sent_) sent_ = offset;
  }
  // Bytes evicted before any host was sent them.
  uint64_t lost() const { return lost_; }
  size_t capacity() const { return cap_; }

 private:
  struct Run {
    uint64_t offset;
    uint8_t channel;
    std::string bytes;
  };
  static constexpr size_t kMaxRun = 64 * 1024;  // keeps eviction of a run prefix cheap
  void evict();

  size_t cap_;
  std::deque<Run> runs_;
  uint64_t start_ = 0, end_ = 0, sent_ = 0, lost_ = 0;
};

}  // namespace airlock::guest

#include "guest/output_log.h"

#include <algorithm>

namespace airlock::guest {

void OutputLog::append(uint8_t channel, const char* data, size_t size) {
  while (size > 0) {
    if (runs_.empty() || runs_.back().channel != channel || runs_.back().bytes.size() >= kMaxRun)
      runs_.push_back(Run{end_, channel, {}});
    Run& r = runs_.back();
    size_t n = std::min(size, kMaxRun - r.bytes.size());
    r.bytes.append(data, n);
    end_ += n;
    data += n;
    size -= n;
  }
  evict();
}

void OutputLog::evict() {
  while (end_ - start_ > cap_ && !runs_.empty()) {
    uint64_t excess = end_ - start_ - cap_;
    Run& r = runs_.front();
    uint64_t take = std::min<uint64_t>(excess, r.bytes.size());
    // Bytes [start_, start_ + take) go; those at or past sent_ were never sent.
    uint64_t from = std::max(start_, sent_), to = start_ + take;
    if (to > from) lost_ += to - from;
    start_ += take;
    if (take == r.bytes.size()) {
      runs_.pop_front();
    } else {
      r.bytes.erase(0, take);
      r.offset += take;
    }
  }
  if (runs_.empty()) start_ = end_;
}

std::pair<uint8_t, std::string_view> OutputLog::at(uint64_t offset) const {
  if (offset < start_ || offset >= end_) return {0, {}};
  // The last run starting at or before `offset`.
  auto it = std::upper_bound(runs_.begin(), runs_.end(), offset,
                             [](uint64_t o, const Run& r) { return o < r.offset; });
  const Run& r = *std::prev(it);
  std::string_view v(r.bytes);
  return {r.channel, v.substr(offset - r.offset)};
}

}  // namespace airlock::guest

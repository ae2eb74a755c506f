#include "guest/output_log.h"

#include <gtest/gtest.h>

#include <string>

namespace airlock::guest {
namespace {

// Reads everything from `offset` to the end as "channel:bytes|" runs.
std::string dump(const OutputLog& log, uint64_t offset) {
  std::string out;
  while (offset < log.end()) {
    auto [ch, bytes] = log.at(offset);
    out += std::to_string(ch) + ":" + std::string(bytes) + "|";
    offset += bytes.size();
  }
  return out;
}

TEST(OutputLog, OneSequenceOfBothChannelsInOrder) {
  OutputLog log(1024);
  log.append(1, "ab", 2);
  log.append(1, "c", 1);
  log.append(2, "XY", 2);
  log.append(1, "d", 1);
  EXPECT_EQ(log.start(), 0u);
  EXPECT_EQ(log.end(), 6u);
  EXPECT_EQ(dump(log, 0), "1:abc|2:XY|1:d|");
  // A resume in the middle of a run gets the rest of that run.
  EXPECT_EQ(dump(log, 1), "1:bc|2:XY|1:d|");
  EXPECT_EQ(dump(log, 4), "2:Y|1:d|");
  EXPECT_EQ(log.at(6).second, "");  // at the end: nothing (yet)
  EXPECT_EQ(log.lost(), 0u);
}

TEST(OutputLog, EvictsTheOldestBeyondCapacityAndCountsWhatWasNeverSent) {
  OutputLog log(4);
  log.append(1, "0123", 4);
  log.mark_sent(2);  // a host got "01"
  log.append(2, "45", 2);
  EXPECT_EQ(log.start(), 2u);
  EXPECT_EQ(log.end(), 6u);
  EXPECT_EQ(dump(log, 2), "1:23|2:45|");
  EXPECT_EQ(log.lost(), 0u);  // what went had been sent
  log.append(1, "6789", 4);   // evicts 2345, none of it sent
  EXPECT_EQ(log.start(), 6u);
  EXPECT_EQ(log.lost(), 4u);
  EXPECT_EQ(dump(log, 6), "1:6789|");
  EXPECT_EQ(log.at(5).second, "");  // evicted
}

TEST(OutputLog, LargeAppendsAreSplitAndTrimmedExactly) {
  OutputLog log(100000);
  std::string big(150000, 'x');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>('a' + i % 26);
  log.append(1, big.data(), big.size());
  EXPECT_EQ(log.end(), 150000u);
  EXPECT_EQ(log.start(), 50000u);
  EXPECT_EQ(log.lost(), 50000u);
  std::string back;
  for (uint64_t o = log.start(); o < log.end();) {
    auto [ch, bytes] = log.at(o);
    ASSERT_EQ(ch, 1);
    ASSERT_FALSE(bytes.empty());
    back += bytes;
    o += bytes.size();
  }
  EXPECT_EQ(back, big.substr(50000));
}

TEST(OutputLog, ZeroCapacityKeepsNothingButCountsOffsets) {
  OutputLog log(0);
  log.append(1, "abc", 3);
  EXPECT_EQ(log.start(), 3u);
  EXPECT_EQ(log.end(), 3u);
  EXPECT_EQ(log.lost(), 3u);
}

}  // namespace
}  // namespace airlock::guest

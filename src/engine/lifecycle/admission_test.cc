#include "engine/lifecycle/admission.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "common/error.h"

namespace airlock::engine::lifecycle {
namespace {

TEST(DiskAdmission, ReservationsAddUpAndAReleaseFreesTheirShare) {
  DiskAdmission disk([] { return int64_t{100}; });
  disk.reserve("a", 60, "a", "disk_mb");
  try {
    disk.reserve("b", 41, "disk_mb=41", "disk_mb");
    FAIL() << "41 MiB more than fits was admitted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::unavailable);
    EXPECT_EQ(e.field(), "disk_mb");
    EXPECT_NE(std::string(e.what()).find("hold 60 MiB"), std::string::npos) << e.what();
  }
  disk.reserve("b", 40, "b", "disk_mb");  // exactly full
  disk.release("a");
  disk.reserve("c", 60, "c", "disk_mb");
}

TEST(DiskAdmission, RenameKeepsTheShareAndAdmitIsUnchecked) {
  DiskAdmission disk([] { return int64_t{100}; });
  disk.reserve("pool-1", 70, "m", "disk_mb");
  disk.rename("pool-1", "sb-1", 70);
  disk.release("pool-1");  // gone under its old name: nothing freed
  EXPECT_THROW(disk.reserve("x", 31, "x", "disk_mb"), Error);
  disk.admit("adopted", 500);  // exists already: never refused
  disk.release("sb-1");
  disk.release("adopted");
  disk.reserve("x", 100, "x", "disk_mb");
}

TEST(DiskAdmission, UnknownFreeSpaceNeverRefuses) {
  DiskAdmission disk([] { return int64_t{-1}; });
  disk.reserve("a", 1 << 30, "a", "disk_mb");
  disk.reserve("b", 1 << 30, "b", "disk_mb");
}

TEST(StartSlots, NoMoreThanMaxStartsRunAtOnce) {
  StartSlots slots(2);
  std::atomic<int> inside{0}, most{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 6; ++i)
    threads.emplace_back([&] {
      StartSlots::Slot slot(slots);
      int now = ++inside;
      for (int m = most.load(); now > m && !most.compare_exchange_weak(m, now);) {
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      --inside;
    });
  for (auto& t : threads) t.join();
  EXPECT_LE(most.load(), 2);  // without the bound all six sleep at once
  EXPECT_EQ(inside.load(), 0);
}

}  // namespace
}  // namespace airlock::engine::lifecycle

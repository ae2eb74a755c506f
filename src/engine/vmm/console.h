// Serial console capture: a thread copying QEMU's console socket into a
// size-capped log file, and a cheap reader of the log's last lines.
//
// The log is two files: `log` (current) and `log.old` (previous half). When
// `log` would exceed cap/2 bytes it is renamed to `log.old` (replacing the
// older one) and a fresh `log` is started, so the two together never exceed
// `cap` bytes whatever the guest prints, and the newest output is always kept.
//
//   ConsoleCapture cap(run_dir / "console.sock", run_dir / "console.log", 1 << 20, true, deadline);
//   ... console_tail(run_dir / "console.log", 20) ...
//   // destructor stops the thread (QEMU closing the socket also ends it)
#pragma once

#include <chrono>
#include <cstddef>
#include <filesystem>
#include <string>
#include <thread>

namespace airlock::vmm {

class ConsoleCapture {
 public:
  // Connects to `socket` (retrying until `deadline`; throws Error on failure)
  // and starts copying. `truncate`: start a fresh log (new boot) instead of
  // appending (re-adoption).
  ConsoleCapture(const std::filesystem::path& socket, const std::filesystem::path& log,
                 size_t cap_bytes, bool truncate, std::chrono::steady_clock::time_point deadline);
  ~ConsoleCapture();
  ConsoleCapture(const ConsoleCapture&) = delete;
  ConsoleCapture& operator=(const ConsoleCapture&) = delete;

  // Stops the thread and closes the socket. Idempotent.
  void stop();

 private:
  void run();
  void write_capped(const char* data, size_t size);

  std::filesystem::path log_;
  size_t half_;
  size_t size_ = 0;
  int sock_ = -1;
  int log_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: stop() wakes the thread's poll
  std::thread thread_;
};

// The last `lines` lines of the log at `log` (falling back to `log.old` for
// older lines), with control characters other than newline and tab removed,
// so it can be put in an error message. Reads at most ~64 KiB; never throws;
// empty if there is no log.
std::string console_tail(const std::filesystem::path& log, size_t lines);

}  // namespace airlock::vmm

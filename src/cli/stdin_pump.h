// Streams the CLI's stdin into a running exec (`airlock exec ID -- CMD` with
// stdin not a terminal): a thread reads fd 0 and POSTs what each read()
// returned to .../exec/{exec_id}/stdin, so a line typed into a pipe reaches
// the guest at once, and a 2 GiB pipe goes through with one batch in memory.
//
//   StdinPump pump(socket, id);           // before the exec starts
//   ... on the exec's "start" event: pump.start(exec_id);
//   ... when the exec ended:         pump.stop();   // joins
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

namespace airlock::cli {

// The stdin batch sent per request: everything readable now, at most `max`
// bytes. Blocks (polling `fd` and `wake`) until something is readable; then
// reads what one read() gives and, while that filled up the buffer and more
// is readable at once, reads on (throughput for bulk pipes without waiting
// for interactive input). `eof` is set once fd reached end of file (or a
// read error: stdin is then treated as ended). Returns false if `wake`
// became readable first (stop requested).
struct StdinBatch {
  std::string bytes;
  bool eof = false;
};
bool read_stdin_batch(int fd, int wake, size_t max, StdinBatch& out);

// One POST .../stdin[?eof=true] (StdinSender::send): the daemon's answer,
// Error(unavailable) if airlockd cannot be reached or the answer broke off.
using StdinSend = std::function<nlohmann::json(std::string_view bytes, bool eof)>;
// Sends `batch` (the stream's bytes from `acked` on, `acked` being the
// guest's stdin_total before it). If it fails with unavailable, waits for
// airlockd (polling every 200-500 ms for up to `patience`; `wake` readable
// = give up: nullopt), asks the guest's total with an empty send and sends
// the part of the batch it lacks. Returns the guest's new total. Throws
// the daemon's errors, and Error(internal) if the guest's total does not
// fit what this client sent (another writer).
std::optional<uint64_t> send_resuming(const StdinSend& send, const StdinBatch& batch,
                                      uint64_t acked, std::chrono::milliseconds patience, int wake);

// When airlockd goes away mid-way (killed and restarted: the guest keeps
// the exec and its stdin), a send that failed is resumed once the daemon
// answers again (retrying for `patience`): an empty send asks how many
// bytes the guest has of the stream (stdin_total), and the batch that was
// in flight is sent again from there, so no byte is lost or repeated.
class StdinPump {
 public:
  StdinPump(std::filesystem::path socket, std::string id, int fd = 0,
            std::chrono::milliseconds patience = std::chrono::milliseconds(0));
  ~StdinPump();  // stop()
  StdinPump(const StdinPump&) = delete;
  StdinPump& operator=(const StdinPump&) = delete;

  // Starts the thread for `exec_id` (once; later calls are ignored).
  void start(const std::string& exec_id);
  // Ends the thread (a pending read is abandoned; a pending request, which
  // the daemon answers as soon as the exec ended, is waited for).
  void stop();
  // Bytes the daemon accepted so far.
  uint64_t sent() const { return sent_.load(); }

 private:
  void run(std::string exec_id);

  std::filesystem::path socket_;
  std::string id_;
  int fd_;
  std::chrono::milliseconds patience_;
  int wake_[2] = {-1, -1};
  std::thread thread_;
  std::atomic<uint64_t> sent_{0};
};

}  // namespace airlock::cli

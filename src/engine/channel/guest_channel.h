// Host side of the guest protocol (api/guest-protocol.md): one connection to
// the airlock-guest agent over the VM's virtio-serial port (QEMU's chardev
// unix socket, <run_dir>/agent.sock), multiplexing many operations.
//
//   auto ch = GuestChannel::connect(vm->agent_socket(), deadline);
//   ch->hello({.hostname = id}, deadline);               // agent is ready
//   uint32_t s = ch->open_stream();                      // so kill can find it
//   nlohmann::json r = ch->exec(s, {{"argv", {"echo", "hi"}}}, nullptr,
//       {.on_output = [](int ch, std::string_view b) { ...; return true; }});
//   ch->call({{"op", "stat"}, {"path", "/etc"}}, deadline);
//
// Threads: one reader thread decodes frames and routes them by stream id into
// a small per-stream queue; each operation is driven on its CALLER's thread,
// which hands output to its callback and only then returns credit to the
// guest. So a slow consumer stalls only its own stream, and the host holds at
// most kInitialCredit bytes per (stream, channel) whatever the guest does.
//
// Failure: when the connection closes (guest died, VM killed, protocol
// violation) every waiting call fails promptly with Error(guest_error,
// "guest agent connection lost: <why>"); every call also has a deadline.
// Guest {"error":...} responses become airlock::Error with the Errc of
// protocol::errc_from_guest_code and the guest's message.
//
// Hostile guests: every JSON message from the guest is bounded in size
// (kMaxPayload) and nesting (protocol::kMaxJsonDepth); a response that breaks
// that fails its call (Error(guest_error)), a hello fails hello(). Frames
// that do not fit the protocol's sequence but harm nothing — a second
// `started`, a `started` after output or with an ill-typed field, an event
// that is not a JSON object, frames for a stream that is not open, anything
// but hello on stream 0, data on a JSON-only stream — are dropped and
// counted (ignored_messages()); they never throw out of the channel, and
// ExecHandlers::on_start runs at most once per exec, before any output.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "protocol/frame.h"

namespace airlock::channel {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

struct HelloParams {
  std::string hostname;  // the sandbox id
  // Sends kHeaderSize + kMaxPayload zero bytes first, so a guest left in the
  // middle of a frame by a previous (dead) host resynchronises (§6).
  bool resync = false;
  // The guest's network, if the VM has a NIC: {"address": "10.0.2.15/24",
  // "gateway": "10.0.2.2", "dns": "10.0.2.3"}; null = leave it alone.
  nlohmann::json network;
  // /etc/machine-id for the guest (32 lowercase hex digits); empty = keep.
  // Every sandbox gets its own, so clones of one template differ.
  std::string machine_id;
};

struct ExecHandlers {
  // The guest started the process (at most once, and never after on_output;
  // a guest that sends no well-formed `started` event gets no call).
  std::function<void(int pid)> on_start;
  // Output chunk; channel 1 = stdout, 2 = stderr. Called on the caller's
  // thread. Returning false kills the process tree (signal 9); the stream is
  // still drained until the guest's response, without further callbacks.
  std::function<bool(int channel, std::string_view bytes)> on_output;
};

struct AttachHandlers {
  // The guest's `attached` event, checked: {"offset": first byte that will
  // come (>= the asked offset), "dropped": bytes between the asked offset
  // and it that the guest no longer holds, "end", "running", "lost", "pid"}.
  std::function<void(const nlohmann::json& attached)> on_attached;
  // Output from the offset on, both channels in the order the guest read
  // them. Returning false detaches (the exec keeps running).
  std::function<bool(int channel, std::string_view bytes)> on_output;
  // Asked every `tick` while nothing arrives; true detaches.
  std::function<bool()> cancelled;
  std::chrono::milliseconds tick{500};
  // The attach stream's id, before the request goes out (send_input and
  // resize take it).
  std::function<void(uint32_t stream)> on_stream;
};

struct WatchHandlers {
  // The guest watches: its `watching` event, checked ({"path", "dirs"}).
  std::function<void(const nlohmann::json& watching)> on_start;
  // One event, checked and rebuilt from its known fields only:
  // {"type": "created"|"modified"|"deleted"|"renamed", "path", "is_dir",
  // "old_path" (renamed)} or {"type": "overflow", "dropped"}. Returning false
  // stops the watch.
  std::function<bool(const nlohmann::json& event)> on_event;
  // Called every `tick` while nothing arrives; returning false stops the
  // watch (the daemon checks whether its client is still there).
  std::function<bool()> on_idle;
  std::chrono::milliseconds tick{500};
};

// Next chunk of an upload; std::nullopt = end.
using ChunkSource = std::function<std::optional<std::string>()>;
// Receives a download chunk by chunk; returning false aborts.
using ChunkSink = std::function<bool(std::string_view)>;

class GuestChannel {
 public:
  // Connects to the unix socket at `path`, retrying until it accepts or
  // `deadline` passes (Error(timeout) naming the path and the last errno).
  static std::unique_ptr<GuestChannel> connect(const std::filesystem::path& path,
                                               Deadline deadline);
  // Adopts an already connected stream socket (tests: socketpair).
  static std::unique_ptr<GuestChannel> from_fd(int fd);

  ~GuestChannel();  // closes; pending calls fail with "connection lost"
  GuestChannel(const GuestChannel&) = delete;
  GuestChannel& operator=(const GuestChannel&) = delete;

  // Version handshake with host time, hostname and 64 bytes of getrandom
  // entropy; returns the guest's hello ({"version","agent_version","kernel"}).
  // Error(timeout) if no reply by `deadline`, Error(guest_error) if the
  // guest refuses the version.
  nlohmann::json hello(const HelloParams& params, Deadline deadline);

  // Sends a JSON-only request (§5) without waiting for its answer: the
  // agent handles requests in the order they arrive, so what it does is
  // done before anything sent after it is looked at. The answer is dropped
  // unread (an error answer is counted in ignored_messages()). Error
  // (guest_error) if the connection is closed.
  void post(const nlohmann::json& request);
  // post()s `set_time` with the host's clock now: for a guest whose clock
  // stood still (a stopped VM) or moved (a pool member's warm-up). A
  // non-empty `hostname` is set with it (a pool member's public id).
  void post_host_time(const std::string& hostname = "");

  // A fresh stream id (>= 1, never reused on this connection).
  uint32_t open_stream();
  // How many stream ids were handed out so far (the warm pool's check that
  // nothing ran in a member since its warm-up).
  uint32_t streams_opened() const { return next_stream_.load() - 1; }

  // Runs an exec on `stream` (from open_stream()). `request` holds the exec
  // fields of §5 without "op" (argv, env, cwd, user, timeout_ms); "stdin" is
  // set from whether `stdin_source` is given. Blocks until the response,
  // which it returns ({"exit_code","signal","timed_out",...}). If `deadline`
  // passes the process is killed and Error(timeout) thrown.
  // Streamed stdin: with `request["stdin"] == true` and no `stdin_source`,
  // the process's stdin stays open and other threads feed it with
  // write_stdin() while this call delivers output.
  nlohmann::json exec(uint32_t stream, nlohmann::json request, const ChunkSource& stdin_source,
                      const ExecHandlers& handlers, std::optional<Deadline> deadline = {});
  // Appends `source` (chunks of any size) to the stdin of the streamed-stdin
  // exec running on `stream`, then sends eof if `eof`. Each chunk is sent as
  // data frames within the guest's credit window, and the next chunk is
  // pulled only once the previous one is on the wire: a process that does
  // not read blocks this call (and so its source), never grows memory.
  // Returns once the guest has taken every byte (its credit is all back:
  // written into the process's pipe) or the exec has ended: bytes still in
  // transit (QEMU's socket buffer) would be lost with a killed daemon, and
  // the caller tells its client they are in. Returns the bytes sent. Error(conflict) if the exec
  // has ended (also when it ends during the call), Error(guest_error) if the connection is lost.
  // Callers serialise writes to one stream. While it waits for credit, `cancelled` (if given) is
  // asked every 200 ms; true ends the call with Error(unavailable) (the HTTP client went away).
  uint64_t write_stdin(uint32_t stream, const ChunkSource& source, bool eof,
                       const std::function<bool()>& cancelled = {});
  // The same for a background exec started with "stdin": true, on a
  // job_stdin stream of its own: returns the guest's {"stdin_bytes",
  // "stdin_total", "stdin_closed"}; `close` closes the job's stdin after.
  nlohmann::json job_stdin(const std::string& exec_id, const ChunkSource& source, bool close,
                           Deadline deadline);
  // Resumes the detached foreground exec `exec_id` (§5 attach) from byte
  // `offset` of its output log (stdout and stderr as one sequence). Blocks
  // until the exec ends (returns its response, as exec() does) or the
  // caller detaches again (returns {"detached": true, "offset": N}).
  // Errors: not_found (no such detached exec), conflict (attached
  // elsewhere), invalid_argument (offset beyond the end); Error(timeout) if
  // the guest does not answer by `start_deadline`.
  nlohmann::json attach(const std::string& exec_id, uint64_t offset, const AttachHandlers& handlers,
                        Deadline start_deadline);
  // Sends a signal to the exec running on `stream` (no-op if it has ended).
  void signal(uint32_t stream, int signo);
  // Terminal input of the pty exec running on `stream` (an exec() with
  // "pty" and no stdin_source, driven on another thread): sent as data on
  // channel in within the guest's credit, blocking until the guest grants
  // more (the program is not reading its terminal). Returns false, having
  // sent what it could, once the stream has ended or the connection closed.
  bool send_input(uint32_t stream, std::string_view bytes);
  // New window size of the pty exec on `stream` (no-op if it has ended):
  // a signal frame {"resize": {"cols", "rows"}}.
  void resize(uint32_t stream, int cols, int rows);

  // Streams `source` into the guest file `path` (atomic on the guest side).
  // Returns the guest's byte count.
  // `owner` (a guest user; empty = root) owns the file and what `parents` made.
  uint64_t write_file(const std::string& path, uint32_t mode, bool parents,
                      const ChunkSource& source, Deadline deadline, const std::string& owner = {});
  // Streams the guest file `path` into `sink`; returns the bytes delivered.
  // If `sink` returns false, nothing more is delivered: the guest is asked to
  // stop (signal frame) and the rest of the stream is drained and dropped.
  uint64_t read_file(const std::string& path, const ChunkSink& sink, Deadline deadline);

  // Watches the guest directory `path` (§5 watch) until the guest ends it,
  // a handler returns false (then the host sends eof and waits briefly for
  // the guest's answer) or the connection is lost (Error). An error before
  // the `watching` event (no such directory, not a directory, a cap) is
  // thrown; `start_deadline` bounds the wait for it. Returns the guest's
  // final response: {"reason", "events", "dropped", "message"?}; "reason" is
  // "cancelled" when the host stopped it. Memory is bounded: at most
  // kInitialCredit bytes are in flight, a line is at most kMaxWatchLine.
  nlohmann::json watch(const std::string& path, bool recursive, const WatchHandlers& handlers,
                       Deadline start_deadline);
  static constexpr size_t kMaxWatchLine = 64 * 1024;

  // A JSON-only operation (list, stat, mkdir, remove, info, ping): sends
  // `request` (with "op") and returns the response object.
  nlohmann::json call(const nlohmann::json& request, Deadline deadline);

  // Guest frames this connection dropped because they were forged, repeated,
  // ill-typed or for no open stream (see the header comment), and why the
  // last one was. For the engine's diagnostics (sandbox info, logs).
  uint64_t ignored_messages() const { return ignored_.load(); }
  std::string last_ignored() const;

  // True once the connection is gone; closed_reason() says why.
  bool closed() const;
  std::string closed_reason() const;
  // Closes the connection (idempotent); pending calls fail promptly.
  void close(const std::string& why = "closed by host");

 private:
  struct Stream;
  // Waits on `st` until ready() (checked under mu_, held by `lock`), asking
  // `cancelled` every 200 ms outside the lock: true ends the wait with
  // Error(unavailable) (the writer of the exec's stdin went away).
  void wait_stream(std::unique_lock<std::mutex>& lock, Stream& st,
                   const std::function<bool()>& ready, const std::function<bool()>& cancelled);
  explicit GuestChannel(int fd);

  void reader_loop();
  void dispatch(protocol::Frame frame);
  void send(const protocol::Frame& frame);
  void send_raw(std::string_view bytes);
  void fail_all(const std::string& why);
  std::shared_ptr<Stream> register_stream(uint32_t id);
  void unregister_stream(uint32_t id);
  // Blocks until `st` has a frame (returned), or, if `want_credit`, until the
  // guest granted stdin/upload credit (returns nullopt). Throws on close,
  // stream failure or deadline.
  std::optional<protocol::Frame> wait_frame(Stream& st, Deadline deadline, bool want_credit);
  // Takes up to `max` bytes of the host->guest window of `st` (0 if none).
  uint32_t take_credit(Stream& st, uint32_t max);
  // Sends as much of `pending` (refilled from `source`) as the window allows;
  // sends eof once `source` ends. Returns true when the upload is complete.
  bool pump_upload(uint32_t id, Stream& st, const ChunkSource& source, std::string& pending);
  // Sends `request`, streams `source` as its data and returns the guest's
  // response and whether the whole source was sent before it came.
  std::pair<nlohmann::json, bool> upload(const nlohmann::json& request, const ChunkSource& source,
                                         Deadline deadline);
  // Returns credit for `bytes` consumed from `st`'s guest->host `channel`.
  void grant(uint32_t id, Stream& st, uint8_t channel, uint32_t bytes);
  // Counts a dropped guest frame; `why` names it. Takes mu_ unless `locked`.
  void ignore(const std::string& why, bool locked = false);
  // Handles an exec `event` frame: calls on_start for the first well-formed
  // `started` before any output, ignores (and counts) everything else.
  void exec_event(const protocol::Frame& f, bool& started, bool output_seen,
                  const ExecHandlers& handlers);

  int fd_;
  std::thread reader_;
  std::mutex write_mu_;  // one frame at a time on the wire

  mutable std::mutex mu_;  // streams_, closed_, why_, hello replies
  std::condition_variable hello_cv_;
  std::deque<nlohmann::json> hello_replies_;
  std::map<uint32_t, std::shared_ptr<Stream>> streams_;
  std::set<uint32_t> posted_;  // post()ed streams whose answer is not in yet (bounded)
  bool closed_ = false;
  std::string why_;
  std::atomic<uint32_t> next_stream_{1};
  std::atomic<uint64_t> ignored_{0};
  std::string last_ignored_;  // under mu_
};

}  // namespace airlock::channel

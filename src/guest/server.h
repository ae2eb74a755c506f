// The guest agent's single-threaded epoll loop: reads frames from the port,
// dispatches requests to operation streams (exec.h, files.h), writes frames
// back, reaps children (it may be init) and resynchronises after garbage.
// Protocol: api/guest-protocol.md.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "protocol/frame.h"

namespace airlock::guest {

class Server;
class Jobs;

// One open operation. Created by a `request`, ended by Server::finish().
class Stream {
 public:
  Stream(Server& server, uint32_t id) : server_(server), id_(id) {}
  virtual ~Stream() = default;
  uint32_t id() const { return id_; }

  // Host->guest frames on this stream. The defaults fail the stream with
  // protocol_error (the operation does not take that frame).
  virtual void on_data(uint8_t channel, const std::string& bytes);
  virtual void on_eof(uint8_t channel);
  virtual void on_credit(uint8_t /*channel*/, uint32_t /*bytes*/) {}
  virtual void on_signal(int signo);
  // A `signal` frame {"resize": {"cols","rows"}} (pty execs only).
  virtual void on_resize(uint16_t cols, uint16_t rows);
  // Streams that produce output without an fd event (read_file) ask to be
  // pumped whenever the port has room.
  virtual bool wants_pump() const { return false; }
  virtual void pump() {}
  // The connection is gone or reset: release everything, send nothing.
  virtual void abort() = 0;

  // Detach and attach (api/guest-protocol.md §5, foreground execs with an
  // exec_id): the name a detached stream waits under; empty = the stream
  // cannot detach (it is aborted when the host goes away).
  virtual std::string detach_key() const { return {}; }
  // The host went away (or sent {"detach": true}): keep running, keep the
  // output in the log, send nothing. Returns {"detached": true, "offset": N}.
  virtual nlohmann::json detach() { return nlohmann::json::object(); }
  // An `attach` request on `stream` resumes it from byte `offset` of its
  // output. Throws GuestError / Error(invalid_argument) for a bad offset.
  virtual void attach(uint32_t /*stream*/, uint64_t /*offset*/) {}
  // A detached stream whose process has ended (the first to go when the
  // table of detached streams is full).
  virtual bool ended() const { return false; }
  // kill_job / job_stdin by exec_id on a foreground exec (detached, or
  // attached to an attach stream): the host of a restarted daemon reaches
  // an exec its predecessor started. signal_by_id signals the process tree
  // and returns {"exec_id","running","attached","end"}; feed_stdin returns
  // the stream that feeds its stdin (GuestError(exists) if it has none
  // open, or another feeds it).
  virtual nlohmann::json signal_by_id(int /*signo*/) { return nlohmann::json::object(); }
  virtual std::unique_ptr<Stream> feed_stdin(uint32_t /*stream*/, bool /*close_after*/) {
    return nullptr;
  }

 protected:
  // Sends {"error":{code,message}} as the response and closes the stream.
  void fail(const char* code, const std::string& message);
  Server& server_;
  uint32_t id_;
};

// One exec's fresh cgroup: its path, its directory open O_PATH (for
// clone3's CLONE_INTO_CGROUP, spawn.h), and the two files every exec uses
// at its end, opened ahead (-1 where the kernel has none: cgroup.kill
// before 5.14, memory.events without the memory controller).
struct ExecCgroup {
  std::string path;
  int fd = -1;
  int kill_fd = -1;    // cgroup.kill, O_WRONLY
  int events_fd = -1;  // memory.events, O_RDONLY
  // Used before by an exec without limits and left empty
  // (Server::recycle_cgroup): the cumulative counters as they were then,
  // so the next exec reads only its own.
  bool reused = false;
  uint64_t base_oom_kills = 0;  // memory.events oom_kill
  uint64_t base_pids_max = 0;   // pids.events max
  void close_fds();
};

struct ServerOptions {
  int fd = -1;               // the port / socket, O_NONBLOCK
  bool system = false;       // PID 1 in the VM: hello sets clock, hostname, RNG
  bool exit_on_eof = false;  // test mode: peer closed -> return from run()
  std::string cgroup_root;   // e.g. /sys/fs/cgroup/airlock; empty = no cgroups
};

class Server {
 public:
  explicit Server(ServerOptions options);
  ~Server();
  // Serves until exit_on_eof and the peer closed. Never throws.
  void run();

  // fd readiness callbacks (level-triggered unless events has EPOLLET).
  using Handler = std::function<void(uint32_t events)>;
  void watch(int fd, uint32_t events, Handler handler);
  void unwatch(int fd);

  // Outgoing frames; queued and written after the current batch of events
  // (one write per batch), as the port allows.
  void send(const protocol::Frame& frame);
  // The same for a frame nobody waits for (an exec's `started` event, its
  // eofs): written with the next frame sent, or after at most
  // kHoldMs. An exec that ends within that time sends its started, eofs and
  // response in one write instead of two or three.
  void send_soon(const protocol::Frame& frame);
  void send_json_soon(protocol::Type type, uint32_t stream, const nlohmann::json& body);
  static constexpr int kHoldMs = 25;
  void send_json(protocol::Type type, uint32_t stream, const nlohmann::json& body);
  void send_data(uint32_t stream, uint8_t channel, const char* data, size_t size);
  void send_credit(uint32_t stream, uint8_t channel, uint32_t bytes);
  // Sends the response and closes the stream (destroyed after the callback).
  void finish(uint32_t stream, const nlohmann::json& response);
  // True while so much output is queued that producers should wait.
  bool congested() const { return out_.size() - out_off_ > kCongested; }

  // Children: `on_exit` runs when `pid` is reaped. Every child is reaped
  // (as init, orphans of the whole system end up here).
  void on_child_exit(pid_t pid, std::function<void(int status)> on_exit);
  // The stream is going away: reap `pid` silently.
  void forget_child(pid_t pid) { children_.erase(pid); }
  // A cgroup that still had processes when its exec ended: removed once empty.
  void linger_cgroup(std::string path) { lingering_.push_back(std::move(path)); }
  const std::string& cgroup_root() const { return opts_.cgroup_root; }
  // A new, empty cgroup under cgroup_root for one exec (memory.oom.group
  // set), owned by the caller from then on. Made ahead: the server keeps
  // one spare, made again after a reply went out, so the mkdir is neither
  // on an exec's path nor competing with its process for the vCPU. Throws
  // GuestError if none can be made. `fresh`: never one used before (an
  // exec with limits: they are set on it, and it must not inherit what an
  // earlier exec charged to it).
  ExecCgroup take_cgroup(bool fresh);
  // An exec without limits ended and left its cgroup empty: it becomes the
  // spare (no rmdir now and no mkdir for the next exec: 2.7-3.2 ms each on
  // the vCPU under TCG), or is removed if there is one already.
  void recycle_cgroup(ExecCgroup cg);
  // Background execs (jobs.h); they outlive connections.
  Jobs& jobs() { return *jobs_; }
  uint64_t next_serial() { return ++serial_; }

 private:
  static constexpr size_t kCongested = 1 << 20;
  void on_port(uint32_t events);
  void on_input(const char* data, size_t size);
  void resync_scan();
  void handle(protocol::Frame& frame);
  void handle_hello(const protocol::Frame& frame);
  void handle_request(protocol::Frame& frame);
  void connection_reset(const char* why, bool reset_decoder = true);
  // Moves stream `s` (detachable) into detached_; evicts the oldest ended
  // detached streams beyond kMaxDetached.
  void park(std::unique_ptr<Stream> s);
  std::unique_ptr<Stream> start_attach(uint32_t id, const nlohmann::json& req);
  // The foreground exec named `exec_id` (detached or attached), or nullptr.
  Stream* find_exec(const std::string& exec_id);
  // {"op": "set_time", "time_ns": N}: the host's clock at a pool member's
  // hand-out (api/guest-protocol.md). In host mode (not system) a no-op.
  nlohmann::json op_set_time(const nlohmann::json& req);
  static constexpr size_t kMaxDetached = 64;
  void flush();
  // Writes what is queued if a frame is due or the hold expired; returns
  // the epoll timeout (ms) until the hold expires, or -1.
  int flush_if_due();
  void on_sigchld();
  void collect_garbage();
  ExecCgroup make_cgroup();
  void refill_spare_cgroup();

  ServerOptions opts_;
  int epoll_ = -1;
  int sigfd_ = -1;
  bool stop_ = false;
  uint64_t next_token_ = 1;
  uint64_t serial_ = 0;
  std::unordered_map<uint64_t, Handler> handlers_;
  std::unordered_map<int, uint64_t> tokens_;

  enum class State { awaiting_hello, serving, resyncing } state_ = State::awaiting_hello;
  protocol::Decoder decoder_;
  std::string scan_;  // bytes being searched for a hello header while resyncing
  std::string out_;
  size_t out_off_ = 0;
  bool flush_due_ = false;     // a frame that goes out after this batch is queued
  int64_t hold_until_us_ = 0;  // held frames are queued (send_soon) until then; 0: none
  bool port_writable_ = true;

  std::map<uint32_t, std::unique_ptr<Stream>> streams_;
  // Detached foreground execs by exec_id, in the order they were parked.
  std::vector<std::pair<std::string, std::unique_ptr<Stream>>> detached_;
  std::vector<std::unique_ptr<Stream>> graveyard_;
  std::unordered_map<pid_t, std::function<void(int)>> children_;
  std::vector<std::string> lingering_;
  ExecCgroup spare_;        // fd -1: none
  bool refill_due_ = true;  // a reply went out since the last attempt to make one
  std::unique_ptr<Jobs> jobs_;
};

}  // namespace airlock::guest

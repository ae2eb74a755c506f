// What airlockd bounds per client connection (internal to airlockd): the
// limits, the counters behind GET /v1/info's "daemon.connections", and the
// socket wrapper that lets the server's watchdog see a stalled connection.
//
// Idleness is measured per socket operation, not per request: a read or a
// write that has been blocked for longer than the idle timeout means the
// client sends nothing (between requests or mid-request) or reads nothing
// (a stalled reader of a stream). Time spent in the engine is never idle, so
// an exec that is silent for an hour, or a follow stream waiting for events,
// is not cut; a stream is cut only once its client stops taking its bytes.
#pragma once

#include <atomic>
#include <boost/asio/buffer.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "common/metrics/metrics.h"
#include "daemon/conn_caps.h"

namespace airlock::daemon {

using Socket = boost::asio::local::stream_protocol::socket;

// A client connection's byte stream, whatever carries it: the unix socket,
// plain TCP (loopback only) or TLS over TCP (listener.h). One interface so
// the HTTP exchange, the watchdog and the metrics are the same code for all
// three. Blocking; one reader and one (serialized) writer at a time.
class Stream {
 public:
  virtual ~Stream() = default;
  virtual size_t read_some(boost::asio::mutable_buffer buffer, boost::system::error_code& ec) = 0;
  virtual size_t write_some(std::span<const boost::asio::const_buffer> buffers,
                            boost::system::error_code& ec) = 0;
  // Both directions at once, without any goodbye (a TLS stream sends no
  // close_notify): a reader of an aborted download must see a truncation.
  virtual void shutdown() = 0;
  // The orderly end after the last answer (TLS: close_notify first).
  virtual void finish() { shutdown(); }
  // The socket's fd: poll() it for POLLHUP, shutdown(2) it from the watchdog.
  virtual int native_handle() = 0;

  // Where the connection came from: "unix" for the socket file (the operator),
  // else the peer's address ("127.0.0.1", "::1"), used to rate-limit
  // authentication failures and in the audit log.
  bool network = false;
  bool tls = false;
  std::string peer = "unix";
};

// A plain socket (unix or TCP) as a Stream.
template <class Sock>
class SocketStream final : public Stream {
 public:
  explicit SocketStream(Sock sock) : sock_(std::move(sock)) {}
  size_t read_some(boost::asio::mutable_buffer b, boost::system::error_code& ec) override {
    return sock_.read_some(b, ec);
  }
  size_t write_some(std::span<const boost::asio::const_buffer> b,
                    boost::system::error_code& ec) override {
    return sock_.write_some(b, ec);
  }
  void shutdown() override {
    boost::system::error_code ignored;
    sock_.shutdown(Sock::shutdown_both, ignored);
  }
  int native_handle() override { return sock_.native_handle(); }
  Sock& socket() { return sock_; }

 private:
  Sock sock_;
};

struct ServerCounters {
  std::atomic<int> open{0};
  std::atomic<uint64_t> refused{0};                // over any connection cap
  std::atomic<uint64_t> idle_closed{0};            // cut by the idle timeout
  std::atomic<uint64_t> header_timeouts{0};        // cut by the header timeout
  std::atomic<uint64_t> duplicate_exec_starts{0};  // repeated on_start ignored
  ServerLimits limits;
  ConnectionCaps caps;
  // GET /metrics: answered requests by route template and status, and
  // their time (server.cc counts each once its answer is written).
  metrics::CounterVec http_requests;
  metrics::HistogramVec http_seconds{metrics::latency_buckets()};

  // `names`: with the per-tenant and per-source counts by name (the
  // operator's view).
  nlohmann::json to_json(bool names = true) const {
    nlohmann::json j = {{"open", open.load()},
                        {"max", limits.max_connections},
                        {"unix_reserve", limits.effective_reserve()},
                        {"max_per_source", limits.max_per_source},
                        {"max_per_tenant", limits.max_per_tenant},
                        {"refused", refused.load()},
                        {"idle_closed", idle_closed.load()},
                        {"idle_timeout_s", limits.idle_timeout.count() / 1000.0},
                        {"header_timeouts", header_timeouts.load()},
                        {"header_timeout_s", limits.header_timeout.count() / 1000.0},
                        {"duplicate_exec_starts_ignored", duplicate_exec_starts.load()}};
    j.update(caps.to_json(names));
    return j;
  }
};

inline int64_t steady_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// One connection's I/O progress, written by its thread, read by the watchdog.
struct Activity {
  std::atomic<int64_t> op_since_ms{0};  // steady ms the pending read/write began; 0: none
  std::atomic<bool> reading{false};     // the pending operation is a read
  std::atomic<bool> timed_out{false};   // the watchdog cut this connection
  // The header deadline: steady ms the current request head began (its
  // first byte; accept for a connection's first request); 0: none running.
  std::atomic<int64_t> head_since_ms{0};
  // A request head is awaited: its first byte starts head_since_ms.
  std::atomic<bool> awaiting_head{false};
  std::atomic<bool> head_timed_out{false};  // cut by the header deadline
};

// A Beast SyncReadStream/SyncWriteStream over a Stream that records when
// each read_some/write_some starts and ends in an Activity.
class WatchedSocket {
 public:
  WatchedSocket(Stream& stream, Activity& activity) : socket_(stream), activity_(activity) {}

  template <class Buffers>
  size_t read_some(const Buffers& buffers, boost::system::error_code& ec) {
    Op op(activity_, true);
    ec = {};
    // A read_some may fill less than asked: the first non-empty buffer will do.
    for (auto it = boost::asio::buffer_sequence_begin(buffers);
         it != boost::asio::buffer_sequence_end(buffers); ++it) {
      boost::asio::mutable_buffer b(*it);
      if (b.size() == 0) continue;
      size_t n = socket_.read_some(b, ec);
      if (n > 0 && activity_.awaiting_head && activity_.head_since_ms == 0)
        activity_.head_since_ms = steady_ms();
      return n;
    }
    return 0;
  }
  template <class Buffers>
  size_t read_some(const Buffers& buffers) {
    boost::system::error_code ec;
    size_t n = read_some(buffers, ec);
    if (ec) throw boost::system::system_error(ec);
    return n;
  }
  template <class Buffers>
  size_t write_some(const Buffers& buffers, boost::system::error_code& ec) {
    Op op(activity_, false);
    std::vector<boost::asio::const_buffer> v;
    for (auto it = boost::asio::buffer_sequence_begin(buffers);
         it != boost::asio::buffer_sequence_end(buffers); ++it)
      v.emplace_back(*it);
    return socket_.write_some(v, ec);
  }
  template <class Buffers>
  size_t write_some(const Buffers& buffers) {
    boost::system::error_code ec;
    size_t n = write_some(buffers, ec);
    if (ec) throw boost::system::system_error(ec);
    return n;
  }

  Stream& stream() { return socket_; }
  const Activity& activity() const { return activity_; }

 private:
  struct Op {
    Activity& a;
    Op(Activity& act, bool reading) : a(act) {
      a.reading = reading;
      a.op_since_ms = steady_ms();
    }
    ~Op() { a.op_since_ms = 0; }
  };
  Stream& socket_;
  Activity& activity_;
};

}  // namespace airlock::daemon

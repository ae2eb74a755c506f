#include "engine/channel/guest_channel.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>

#include "common/error.h"
#include "engine/channel/guest_channel_detail.h"
#include "protocol/messages.h"

namespace airlock::channel {

using detail::kIn;
using detail::kKillGrace;
using detail::kOut;
using detail::parse_response;
using detail::StreamGuard;
using protocol::Frame;
using protocol::Type;
namespace {

constexpr uint8_t kErr = 2;
// Non-data frames a stream may have queued (event, 2 eof, response, plus
// slack). A guest that floods more is breaking the protocol.
constexpr size_t kMaxQueuedControl = 64;
// A write that cannot make progress for this long means the guest stopped
// reading its port entirely: treat the connection as lost rather than hang.
constexpr auto kWriteStall = std::chrono::seconds(60);

}  // namespace

struct GuestChannel::Stream {
  std::condition_variable cv;
  std::deque<Frame> frames;
  size_t control = 0;
  // Guest->host windows (what the guest may still send us) per channel.
  uint64_t recv_window[3] = {protocol::kInitialCredit, protocol::kInitialCredit,
                             protocol::kInitialCredit};
  // Host->guest window on channel in.
  uint64_t send_window = protocol::kInitialCredit;
  std::string failed;  // set by the reader when the guest broke the rules
  bool done = false;   // unregistered: write_stdin() must stop waiting
};

std::unique_ptr<GuestChannel> GuestChannel::connect(const std::filesystem::path& path,
                                                    Deadline deadline) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.native().size() >= sizeof(addr.sun_path))
    throw Error(Errc::internal, "agent socket path too long: " + path.string());
  std::memcpy(addr.sun_path, path.c_str(), path.native().size() + 1);
  int last_errno = 0;
  for (;;) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw_errno("socket");
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return from_fd(fd);
    last_errno = errno;
    ::close(fd);
    // QEMU creates the socket shortly after it starts; until then ENOENT or
    // ECONNREFUSED are expected. Anything else will not get better.
    if (last_errno != ENOENT && last_errno != ECONNREFUSED && last_errno != EAGAIN) break;
    if (Clock::now() >= deadline) {
      throw Error(Errc::timeout, "agent socket " + path.string() +
                                     " did not accept in time: " + std::strerror(last_errno));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  throw Error(Errc::internal,
              "cannot connect to agent socket " + path.string() + ": " + std::strerror(last_errno));
}

std::unique_ptr<GuestChannel> GuestChannel::from_fd(int fd) {
  return std::unique_ptr<GuestChannel>(new GuestChannel(fd));
}

GuestChannel::GuestChannel(int fd) : fd_(fd) {
  // Non-blocking so writes can give up on a guest that stopped reading
  // (poll with a stall limit) instead of blocking forever.
  int flags = ::fcntl(fd_, F_GETFL);
  ::fcntl(fd_, F_SETFL, flags | O_NONBLOCK);
  reader_ = std::thread([this] { reader_loop(); });
}

GuestChannel::~GuestChannel() {
  close("channel destroyed");
  if (reader_.joinable()) reader_.join();
  ::close(fd_);
}

std::string GuestChannel::last_ignored() const {
  std::lock_guard lock(mu_);
  return last_ignored_;
}

void GuestChannel::ignore(const std::string& why, bool locked) {
  ignored_.fetch_add(1);
  if (locked) {
    last_ignored_ = why;
  } else {
    std::lock_guard lock(mu_);
    last_ignored_ = why;
  }
}

bool GuestChannel::closed() const {
  std::lock_guard lock(mu_);
  return closed_;
}

std::string GuestChannel::closed_reason() const {
  std::lock_guard lock(mu_);
  return why_;
}

void GuestChannel::close(const std::string& why) {
  fail_all(why);
  // Wakes the reader's poll (POLLHUP) so it exits promptly.
  ::shutdown(fd_, SHUT_RDWR);
}

void GuestChannel::fail_all(const std::string& why) {
  std::lock_guard lock(mu_);
  if (closed_) return;
  closed_ = true;
  why_ = why;
  for (auto& [id, st] : streams_) st->cv.notify_all();
  hello_cv_.notify_all();
}

void GuestChannel::reader_loop() {
  protocol::Decoder decoder;
  std::string buf(64 * 1024, '\0');
  for (;;) {
    pollfd p{fd_, POLLIN, 0};
    int r = ::poll(&p, 1, -1);
    if (r < 0) {
      if (errno == EINTR) continue;
      fail_all(std::string("poll failed: ") + std::strerror(errno));
      return;
    }
    ssize_t n = ::recv(fd_, buf.data(), buf.size(), 0);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      fail_all(std::string("read failed: ") + std::strerror(errno));
      return;
    }
    if (n == 0) {
      fail_all("the guest closed the connection (VM stopped?)");
      return;
    }
    try {
      decoder.feed(buf.data(), static_cast<size_t>(n));
      while (auto f = decoder.next()) dispatch(std::move(*f));
    } catch (const Error& e) {
      // The host does not resynchronise: a guest that garbles its framing is
      // broken or hostile, and the engine treats the sandbox as failed.
      fail_all(std::string("protocol error from guest: ") + e.what());
      ::shutdown(fd_, SHUT_RDWR);
      return;
    }
  }
}

void GuestChannel::dispatch(Frame f) {
  std::lock_guard lock(mu_);
  if (f.stream == 0) {
    // The guest may only say hello on 0.
    if (f.type != Type::hello)
      return ignore("frame type " + std::to_string(static_cast<int>(f.type)) + " on stream 0",
                    true);
    nlohmann::json j;
    try {
      j = protocol::parse_json(f);
    } catch (const Error& e) {
      // hello() turns this into its error; nothing deep is ever kept.
      j = protocol::error_json(protocol::code::protocol_error,
                               std::string("malformed hello reply: ") + e.what());
    }
    if (hello_replies_.size() >= 8) return ignore("unsolicited hello", true);
    hello_replies_.push_back(std::move(j));
    hello_cv_.notify_all();
    return;
  }
  auto it = streams_.find(f.stream);
  if (it == streams_.end()) {
    // The answer to a post(): nobody waits for it.
    if (f.type == Type::response && posted_.erase(f.stream)) {
      std::string why;
      try {
        auto j = protocol::parse_json(f);
        if (!j.is_object() || !j.contains("error")) return;
        why = j["error"].dump().substr(0, 200);
      } catch (const Error& e) {
        why = e.what();
      }
      return ignore("posted request on stream " + std::to_string(f.stream) + " failed: " + why,
                    true);
    }
    // Late frames of a stream we abandoned (its call timed out) land here
    // too, as do ids the host never opened: either way nothing reads them.
    return ignore("frame type " + std::to_string(static_cast<int>(f.type)) + " for stream " +
                      std::to_string(f.stream) + ", which is not open",
                  true);
  }
  Stream& st = *it->second;
  if (!st.failed.empty()) return;
  auto violate = [&](const std::string& what) {
    st.failed = "guest broke the protocol on stream " + std::to_string(f.stream) + ": " + what;
    st.cv.notify_all();
  };
  switch (f.type) {
    case Type::credit: {
      uint32_t n;
      try {
        n = protocol::parse_credit(f);
      } catch (const Error& e) {
        return violate(e.what());
      }
      if (f.channel == kIn) {
        st.send_window = std::min<uint64_t>(st.send_window + n, UINT32_MAX);
        st.cv.notify_all();  // an upload may be waiting for it
      }
      return;  // credit is consumed here, never queued
    }
    case Type::data: {
      if (f.channel != kOut && f.channel != kErr) return violate("data on channel in");
      if (f.payload.size() > st.recv_window[f.channel])
        return violate("data beyond the credit window");
      st.recv_window[f.channel] -= f.payload.size();
      break;
    }
    case Type::response:
    case Type::event:
    case Type::eof:
      if (++st.control > kMaxQueuedControl) return violate("too many control frames");
      break;
    default:
      return violate("unexpected frame type " + std::to_string(static_cast<int>(f.type)));
  }
  st.frames.push_back(std::move(f));
  st.cv.notify_all();
}

void GuestChannel::send_raw(std::string_view bytes) {
  auto stalled_since = Clock::now();
  while (!bytes.empty()) {
    ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n > 0) {
      bytes.remove_prefix(static_cast<size_t>(n));
      stalled_since = Clock::now();
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      if (closed()) break;
      if (Clock::now() - stalled_since > kWriteStall) {
        close("the guest stopped reading its port");
        break;
      }
      pollfd p{fd_, POLLOUT, 0};
      ::poll(&p, 1, 100);
      continue;
    }
    close(std::string("write failed: ") + std::strerror(errno));
    break;
  }
  if (!bytes.empty()) {
    throw Error(Errc::guest_error, "guest agent connection lost: " + closed_reason());
  }
}

void GuestChannel::send(const Frame& frame) {
  std::string wire = protocol::encode(frame);
  std::lock_guard lock(write_mu_);
  if (closed()) throw Error(Errc::guest_error, "guest agent connection lost: " + closed_reason());
  send_raw(wire);
}

uint32_t GuestChannel::open_stream() { return next_stream_.fetch_add(1); }

void GuestChannel::post(const nlohmann::json& request) {
  // A guest that never answers must not grow this set: the oldest go.
  constexpr size_t kMaxPosted = 64;
  uint32_t id = open_stream();
  {
    std::lock_guard lock(mu_);
    if (closed_) throw Error(Errc::guest_error, "guest agent connection lost: " + why_);
    posted_.insert(id);
    while (posted_.size() > kMaxPosted) posted_.erase(posted_.begin());
  }
  send(protocol::json_frame(Type::request, id, request));
}

void GuestChannel::post_host_time(const std::string& hostname) {
  auto now = std::chrono::system_clock::now().time_since_epoch();
  nlohmann::json req{
      {"op", "set_time"},
      {"time_ns", std::chrono::duration_cast<std::chrono::nanoseconds>(now).count()}};
  if (!hostname.empty()) req["hostname"] = hostname;
  post(req);
}

std::shared_ptr<GuestChannel::Stream> GuestChannel::register_stream(uint32_t id) {
  if (id == 0) throw Error(Errc::internal, "stream 0 is reserved for hello");
  std::lock_guard lock(mu_);
  if (closed_) throw Error(Errc::guest_error, "guest agent connection lost: " + why_);
  auto st = std::make_shared<Stream>();
  if (!streams_.emplace(id, st).second)
    throw Error(Errc::internal, "stream " + std::to_string(id) + " is already in use");
  return st;
}

void GuestChannel::unregister_stream(uint32_t id) {
  std::lock_guard lock(mu_);
  auto it = streams_.find(id);
  if (it == streams_.end()) return;
  it->second->done = true;
  it->second->cv.notify_all();  // a write_stdin() waiting for credit
  streams_.erase(it);
}

std::optional<Frame> GuestChannel::wait_frame(Stream& st, Deadline deadline, bool want_credit) {
  std::unique_lock lock(mu_);
  for (;;) {
    if (!st.frames.empty()) {
      Frame f = std::move(st.frames.front());
      st.frames.pop_front();
      if (f.type != Type::data) --st.control;
      return f;
    }
    if (!st.failed.empty()) throw Error(Errc::guest_error, st.failed);
    if (closed_) throw Error(Errc::guest_error, "guest agent connection lost: " + why_);
    if (want_credit && st.send_window > 0) return std::nullopt;
    if (st.cv.wait_until(lock, deadline) == std::cv_status::timeout && st.frames.empty() &&
        !(want_credit && st.send_window > 0) && st.failed.empty() && !closed_) {
      throw Error(Errc::timeout, "the guest agent did not answer in time");
    }
  }
}

uint32_t GuestChannel::take_credit(Stream& st, uint32_t max) {
  std::lock_guard lock(mu_);
  uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(st.send_window, max));
  st.send_window -= n;
  return n;
}

void GuestChannel::grant(uint32_t id, Stream& st, uint8_t channel, uint32_t bytes) {
  {
    std::lock_guard lock(mu_);
    st.recv_window[channel] += bytes;
  }
  send(protocol::make_credit(id, channel, bytes));
}

bool GuestChannel::pump_upload(uint32_t id, Stream& st, const ChunkSource& source,
                               std::string& pending) {
  for (;;) {
    if (pending.empty()) {
      auto chunk = source();
      if (!chunk) {
        send(Frame{Type::eof, kIn, id, {}});
        return true;
      }
      pending = std::move(*chunk);
      continue;  // empty chunks are skipped: data frames carry >= 1 byte
    }
    uint32_t want = static_cast<uint32_t>(std::min(pending.size(), protocol::kMaxPayload));
    uint32_t n = take_credit(st, want);
    if (n == 0) return false;
    send(Frame{Type::data, kIn, id, pending.substr(0, n)});
    pending.erase(0, n);
  }
}

nlohmann::json GuestChannel::hello(const HelloParams& params, Deadline deadline) {
  std::string entropy(64, '\0');
  size_t got = 0;
  while (got < entropy.size()) {
    ssize_t n = ::getrandom(entropy.data() + got, entropy.size() - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno("getrandom");
    got += static_cast<size_t>(n);
  }
  auto now = std::chrono::system_clock::now().time_since_epoch();
  nlohmann::json body{
      {"version", protocol::kVersion},
      {"time_ns", std::chrono::duration_cast<std::chrono::nanoseconds>(now).count()},
      {"entropy", protocol::to_hex(entropy)}};
  if (!params.hostname.empty()) body["hostname"] = params.hostname;
  if (params.network.is_object()) body["network"] = params.network;
  if (!params.machine_id.empty()) body["machine_id"] = params.machine_id;
  {
    std::lock_guard lock(mu_);
    hello_replies_.clear();
  }
  {
    std::string wire;
    if (params.resync) wire.assign(protocol::kHeaderSize + protocol::kMaxPayload, '\0');
    protocol::encode_to(wire, protocol::json_frame(Type::hello, 0, body));
    std::lock_guard lock(write_mu_);
    if (closed()) throw Error(Errc::guest_error, "guest agent connection lost: " + closed_reason());
    send_raw(wire);
  }
  std::unique_lock lock(mu_);
  if (!hello_cv_.wait_until(lock, deadline, [&] { return closed_ || !hello_replies_.empty(); }))
    throw Error(Errc::timeout, "the guest agent did not answer hello in time");
  if (hello_replies_.empty())
    throw Error(Errc::guest_error, "guest agent connection lost: " + why_);
  nlohmann::json reply = std::move(hello_replies_.front());
  hello_replies_.pop_front();
  lock.unlock();
  protocol::throw_if_error(reply);
  if (reply.value("version", nlohmann::json()) != protocol::kVersion)
    throw Error(Errc::guest_error, "guest agent speaks protocol version " +
                                       reply.value("version", nlohmann::json()).dump() +
                                       ", the host speaks " + std::to_string(protocol::kVersion));
  return reply;
}

namespace detail {
nlohmann::json parse_response(const Frame& f) {
  nlohmann::json j;
  try {
    j = protocol::parse_json(f);
  } catch (const Error& e) {
    throw Error(Errc::guest_error, std::string("malformed response from guest: ") + e.what());
  }
  protocol::throw_if_error(j);
  return j;
}
}  // namespace detail

nlohmann::json GuestChannel::exec(uint32_t id, nlohmann::json request,
                                  const ChunkSource& stdin_source, const ExecHandlers& handlers,
                                  std::optional<Deadline> deadline) {
  auto st = register_stream(id);
  StreamGuard guard{[&] { unregister_stream(id); }};
  request["op"] = "exec";
  // Streamed stdin (write_stdin() from other threads) or a source pumped here.
  const bool stdin_stream = !stdin_source && request.value("stdin", false);
  request["stdin"] = stdin_stream || static_cast<bool>(stdin_source);
  send(protocol::json_frame(Type::request, id, request));

  bool upload_done = !stdin_source;
  std::string pending;
  bool consumer_gone = false, killed = false, started = false, output_seen = false;
  // "No deadline" as a far one: Deadline::max() overflows some wait_until paths.
  Deadline until = deadline.value_or(Clock::now() + std::chrono::hours(24 * 365));
  for (;;) {
    if (!upload_done) upload_done = pump_upload(id, *st, stdin_source, pending);
    std::optional<Frame> f;
    try {
      f = wait_frame(*st, until, !upload_done);
    } catch (const Error& e) {
      if (e.code() != Errc::timeout || killed) throw;
      // Host-side deadline: kill the tree, then give the guest a moment to
      // report how it ended.
      signal(id, 9);
      killed = true;
      until = Clock::now() + kKillGrace;
      continue;
    }
    if (!f) continue;  // credit for stdin arrived
    switch (f->type) {
      case Type::event:
        exec_event(*f, started, output_seen, handlers);
        break;
      case Type::data: {
        output_seen = true;
        uint32_t n = static_cast<uint32_t>(f->payload.size());
        if (!consumer_gone && handlers.on_output && !handlers.on_output(f->channel, f->payload)) {
          consumer_gone = true;
          signal(id, 9);
        }
        grant(id, *st, f->channel, n);  // only now: the consumer has it
        break;
      }
      case Type::eof:
        output_seen = true;
        break;
      case Type::response: {
        auto j = parse_response(*f);
        if (killed && deadline) j["timed_out"] = true;
        return j;
      }
      default:
        break;
    }
  }
}

uint64_t GuestChannel::write_stdin(uint32_t id, const ChunkSource& source, bool eof,
                                   const std::function<bool()>& cancelled) {
  std::shared_ptr<Stream> st;
  {
    std::lock_guard lock(mu_);
    if (closed_) throw Error(Errc::guest_error, "guest agent connection lost: " + why_);
    auto it = streams_.find(id);
    if (it == streams_.end())
      throw Error(Errc::conflict, "the exec has ended; its stdin is closed");
    st = it->second;
  }
  // Waits for credit and takes up to `want` bytes of it.
  auto take = [&](size_t want) -> uint32_t {
    std::unique_lock lock(mu_);
    wait_stream(
        lock, *st,
        [&] { return st->send_window > 0 || st->done || closed_ || !st->failed.empty(); },
        cancelled);
    if (closed_) throw Error(Errc::guest_error, "guest agent connection lost: " + why_);
    if (st->done || !st->failed.empty())
      throw Error(Errc::conflict, "the exec has ended; its stdin is closed");
    uint32_t n = static_cast<uint32_t>(
        std::min<uint64_t>({st->send_window, want, uint64_t{protocol::kMaxPayload}}));
    st->send_window -= n;
    return n;
  };
  uint64_t sent = 0;
  while (auto chunk = source()) {
    std::string_view rest = *chunk;
    while (!rest.empty()) {
      uint32_t n = take(rest.size());
      send(Frame{Type::data, kIn, id, std::string(rest.substr(0, n))});
      rest.remove_prefix(n);
      sent += n;
    }
  }
  if (eof) {
    {
      std::lock_guard lock(mu_);
      if (st->done) throw Error(Errc::conflict, "the exec has ended; its stdin is closed");
    }
    send(Frame{Type::eof, kIn, id, {}});
  }
  // Until the guest's credit is all back, what was sent may be in transit.
  std::unique_lock lock(mu_);
  wait_stream(
      lock, *st,
      [&] {
        return st->send_window >= protocol::kInitialCredit || st->done || closed_ ||
               !st->failed.empty();
      },
      cancelled);
  if (closed_ && !st->done) throw Error(Errc::guest_error, "guest agent connection lost: " + why_);
  return sent;
}

void GuestChannel::wait_stream(std::unique_lock<std::mutex>& lock, Stream& st,
                               const std::function<bool()>& ready,
                               const std::function<bool()>& cancelled) {
  while (!st.cv.wait_for(lock, std::chrono::milliseconds(200), ready)) {
    if (!cancelled) continue;
    lock.unlock();
    bool stop = cancelled();  // outside mu_: it may poll a socket
    lock.lock();
    if (stop && !ready())
      throw Error(Errc::unavailable, "the writer of the exec's stdin went away");
  }
}

void GuestChannel::exec_event(const Frame& f, bool& started, bool output_seen,
                              const ExecHandlers& handlers) {
  const std::string where = "exec event on stream " + std::to_string(f.stream);
  nlohmann::json j;
  try {
    j = protocol::parse_json(f);
  } catch (const Error& e) {
    return ignore(where + ": " + e.what());
  }
  // {"started": true, "pid": N} is the only event of version 1.
  auto s = j.find("started");
  if (s == j.end()) return ignore(where + " without \"started\"");
  if (!s->is_boolean() || !s->get<bool>())
    return ignore(where + ": \"started\" is " + s->dump() + ", not true");
  // Once, and first: the daemon writes its response header from on_start.
  if (started) return ignore("second \"started\" " + where);
  if (output_seen) return ignore("\"started\" after output, " + where);
  int pid = 0;
  auto p = j.find("pid");
  if (p != j.end() && !p->is_null()) {
    if (!p->is_number_integer() || p->get<int64_t>() < 1 || p->get<int64_t>() > INT32_MAX)
      return ignore(where + ": \"pid\" is " + p->dump() + ", not a process id");
    pid = static_cast<int>(p->get<int64_t>());
  }
  started = true;
  if (handlers.on_start) handlers.on_start(pid);
}

void GuestChannel::signal(uint32_t stream, int signo) {
  {
    std::lock_guard lock(mu_);
    if (closed_ || !streams_.count(stream)) return;  // already over
  }
  try {
    send(protocol::json_frame(Type::signal, stream, {{"signal", signo}}));
  } catch (const Error&) {
    // The connection died meanwhile; the stream's waiter reports that.
  }
}

bool GuestChannel::send_input(uint32_t id, std::string_view bytes) {
  while (!bytes.empty()) {
    uint32_t n = 0;
    {
      std::unique_lock lock(mu_);
      for (;;) {
        auto it = streams_.find(id);
        if (closed_ || it == streams_.end() || !it->second->failed.empty()) return false;
        Stream& st = *it->second;
        if (st.send_window > 0) {
          n = static_cast<uint32_t>(
              std::min<uint64_t>({st.send_window, bytes.size(), protocol::kMaxPayload}));
          st.send_window -= n;
          break;
        }
        // The exec's own loop holds the shared_ptr; keep ours only while
        // waiting, and look again (the stream may have ended meanwhile).
        auto keep = it->second;
        keep->cv.wait_for(lock, std::chrono::milliseconds(200));
      }
    }
    try {
      send(Frame{Type::data, kIn, id, std::string(bytes.substr(0, n))});
    } catch (const Error&) {
      return false;
    }
    bytes.remove_prefix(n);
  }
  return true;
}

void GuestChannel::resize(uint32_t stream, int cols, int rows) {
  {
    std::lock_guard lock(mu_);
    if (closed_ || !streams_.count(stream)) return;
  }
  try {
    send(
        protocol::json_frame(Type::signal, stream, {{"resize", {{"cols", cols}, {"rows", rows}}}}));
  } catch (const Error&) {
  }
}

uint64_t GuestChannel::write_file(const std::string& path, uint32_t mode, bool parents,
                                  const ChunkSource& source, Deadline deadline,
                                  const std::string& owner) {
  nlohmann::json req = {{"op", "write_file"}, {"path", path}, {"mode", mode}, {"parents", parents}};
  if (!owner.empty()) req["owner"] = owner;
  auto [j, done] = upload(req, source, deadline);
  if (!done) throw Error(Errc::guest_error, "guest answered write_file before the end of data");
  auto size = j.value("size", nlohmann::json());
  if (!size.is_number_unsigned())
    throw Error(Errc::guest_error, "guest write_file response has no size");
  return size.get<uint64_t>();
}

nlohmann::json GuestChannel::job_stdin(const std::string& exec_id, const ChunkSource& source,
                                       bool close, Deadline deadline) {
  // An early answer is an error (unknown job, stdin closed): the rest of
  // the source is left unread.
  return upload({{"op", "job_stdin"}, {"exec_id", exec_id}, {"close", close}}, source, deadline)
      .first;
}

std::pair<nlohmann::json, bool> GuestChannel::upload(const nlohmann::json& request,
                                                     const ChunkSource& source, Deadline deadline) {
  uint32_t id = open_stream();
  auto st = register_stream(id);
  StreamGuard guard{[&] { unregister_stream(id); }};
  send(protocol::json_frame(Type::request, id, request));
  // Until the guest answers, a failure here (the caller's source threw because
  // its client's body broke off, a deadline) must not leave the guest holding
  // the upload open (a write_file's temp file): a signal frame on a stream that
  // is not an exec makes the guest abort it (api/guest-protocol.md).
  bool answered = false;
  StreamGuard cancel{[&] {
    if (answered) return;
    try {
      send(protocol::json_frame(Type::signal, id, {{"signal", 9}}));
    } catch (const Error&) {  // the connection is gone: the guest aborts everything anyway
    }
  }};
  bool done = false;
  std::string pending;
  for (;;) {
    if (!done) done = pump_upload(id, *st, source, pending);
    auto f = wait_frame(*st, deadline, !done);
    if (!f) continue;
    if (f->type != Type::response) {
      ignore("frame type " + std::to_string(static_cast<int>(f->type)) + " on " +
             request.value("op", std::string("upload")) + " stream " + std::to_string(id));
      continue;
    }
    answered = true;
    return {parse_response(*f), done};
  }
}

uint64_t GuestChannel::read_file(const std::string& path, const ChunkSink& sink,
                                 Deadline deadline) {
  uint32_t id = open_stream();
  auto st = register_stream(id);
  StreamGuard guard{[&] { unregister_stream(id); }};
  send(protocol::json_frame(Type::request, id, {{"op", "read_file"}, {"path", path}}));
  uint64_t delivered = 0;
  bool aborted = false;
  for (;;) {
    auto f = wait_frame(*st, deadline, false);
    if (f->type == Type::data) {
      uint32_t n = static_cast<uint32_t>(f->payload.size());
      if (f->channel != kOut) throw Error(Errc::guest_error, "read_file data on stderr");
      if (!aborted) {
        if (sink(f->payload)) {
          delivered += n;
        } else {
          aborted = true;
          signal(id, 9);  // a guest that understands it stops early
        }
      }
      grant(id, *st, kOut, n);
    } else if (f->type == Type::response) {
      if (aborted) return delivered;  // whatever the guest says now
      auto j = parse_response(*f);
      auto size = j.value("size", nlohmann::json());
      if (!size.is_number_unsigned() || size.get<uint64_t>() != delivered)
        throw Error(Errc::guest_error, "guest read_file size " + size.dump() +
                                           " does not match the " + std::to_string(delivered) +
                                           " bytes it sent for " + path);
      return delivered;
    } else if (f->type != Type::eof) {
      ignore("frame type " + std::to_string(static_cast<int>(f->type)) + " on read_file stream " +
             std::to_string(id));
    }
  }
}

nlohmann::json GuestChannel::call(const nlohmann::json& request, Deadline deadline) {
  uint32_t id = open_stream();
  auto st = register_stream(id);
  StreamGuard guard{[&] { unregister_stream(id); }};
  send(protocol::json_frame(Type::request, id, request));
  for (;;) {
    auto f = wait_frame(*st, deadline, false);
    if (f->type == Type::response) return parse_response(*f);
    // JSON ops carry no data; a guest that sends some gets no credit back
    // and is simply ignored.
    ignore("frame type " + std::to_string(static_cast<int>(f->type)) + " on JSON-only stream " +
           std::to_string(id));
  }
}

}  // namespace airlock::channel

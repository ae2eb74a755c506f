#include "guest/server.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <utility>

#include "common/error.h"
#include "guest/exec_tree.h"
#include "guest/init.h"
#include "guest/jobs.h"
#include "guest/log.h"
#include "guest/ops.h"
#include "guest/spawn.h"
#include "protocol/messages.h"

namespace airlock::guest {

using nlohmann::json;
using protocol::Frame;
using protocol::Type;

void Stream::on_data(uint8_t channel, const std::string&) {
  fail(protocol::code::protocol_error,
       "this operation takes no data (channel " + std::to_string(channel) + ")");
}
void Stream::on_eof(uint8_t channel) {
  fail(protocol::code::protocol_error,
       "this operation takes no eof (channel " + std::to_string(channel) + ")");
}
void Stream::on_signal(int) {
  fail(protocol::code::protocol_error, "signal frames are only valid on exec streams");
}

void Stream::on_resize(uint16_t, uint16_t) {
  fail(protocol::code::protocol_error, "resize frames are only valid on pty exec streams");
}
void Stream::fail(const char* code, const std::string& message) {
  abort();
  server_.finish(id_, protocol::error_json(code, message));
}

Server::Server(ServerOptions options) : opts_(std::move(options)) {
  epoll_ = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_ < 0) throw_errno("epoll_create1");
  // SIGCHLD through a signalfd so reaping happens in the loop, not in a
  // handler. The mask is reset in every exec'd child.
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  sigprocmask(SIG_BLOCK, &mask, nullptr);
  sigfd_ = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
  if (sigfd_ < 0) throw_errno("signalfd");
  watch(sigfd_, EPOLLIN, [this](uint32_t) { on_sigchld(); });
  watch(opts_.fd, EPOLLIN | EPOLLOUT | EPOLLET, [this](uint32_t ev) { on_port(ev); });
  jobs_ = std::make_unique<Jobs>(*this);
}

Server::~Server() {
  for (auto& [id, s] : streams_) s->abort();
  streams_.clear();
  for (auto& [key, s] : detached_) s->abort();
  detached_.clear();
  graveyard_.clear();
  jobs_.reset();  // kills the background execs' trees
  if (spare_.fd >= 0) {
    spare_.close_fds();
    rmdir(spare_.path.c_str());
  }
  // Leaving (test mode only): do not leave exec cgroups behind. Kill what is
  // left in them and wait briefly for the kernel to empty them.
  for (const auto& cg : lingering_) {
    if (FILE* f = fopen((cg + "/cgroup.kill").c_str(), "we")) {
      fputs("1", f);
      fclose(f);
    }
    for (int i = 0; i < 100 && rmdir(cg.c_str()) != 0 && errno == EBUSY; ++i) {
      while (waitpid(-1, nullptr, WNOHANG) > 0) {
      }
      usleep(10000);
    }
  }
  close(sigfd_);
  close(epoll_);
}

void Server::watch(int fd, uint32_t events, Handler handler) {
  uint64_t token = next_token_++;
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = token;
  if (epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &ev) < 0) throw_errno("epoll_ctl add");
  handlers_[token] = std::move(handler);
  tokens_[fd] = token;
}

void Server::unwatch(int fd) {
  auto it = tokens_.find(fd);
  if (it == tokens_.end()) return;
  epoll_ctl(epoll_, EPOLL_CTL_DEL, fd, nullptr);
  // Events already fetched for this token are skipped (token unknown), so a
  // reused fd number never reaches the old handler.
  handlers_.erase(it->second);
  tokens_.erase(it);
}

void Server::run() {
  epoll_event events[64];
  while (!stop_) {
    // What the last batch of events sent goes out in one write: each write
    // to the port is a virtqueue kick handled by QEMU while the vCPU waits:
    // 0.05-4 ms of the guest's time per write under TCG on a loaded host
    // (bench/RESULTS.md).
    const int hold_ms = flush_if_due();
    collect_garbage();
    // After a batch of events that sent a reply, never while an exec's
    // process starts: one vCPU runs both, and the mkdir would delay it.
    refill_spare_cgroup();
    bool pumping = false;
    if (!congested())
      for (auto& [id, s] : streams_)
        if (s->wants_pump()) pumping = true;
    int n = epoll_wait(epoll_, events, 64, pumping ? 0 : hold_ms);
    if (n < 0) {
      if (errno != EINTR) logf("epoll_wait: %s", strerror(errno));
      continue;
    }
    for (int i = 0; i < n; ++i) {
      auto it = handlers_.find(events[i].data.u64);
      if (it == handlers_.end()) continue;
      Handler h = it->second;  // copy: the handler may unwatch itself
      try {
        h(events[i].events);
      } catch (const std::exception& e) {
        logf("event handler failed: %s", e.what());
      }
    }
    if (pumping || n == 0) {
      // Round-robin one pump per stream per turn so one big read_file does
      // not starve the others.
      std::vector<uint32_t> ids;
      for (auto& [id, s] : streams_)
        if (s->wants_pump()) ids.push_back(id);
      for (uint32_t id : ids) {
        if (congested()) break;
        auto it = streams_.find(id);
        if (it == streams_.end()) continue;
        try {
          it->second->pump();
        } catch (const std::exception& e) {
          logf("stream %u pump failed: %s", id, e.what());
        }
      }
    }
  }
}

void Server::collect_garbage() { graveyard_.clear(); }

// ---- output -----------------------------------------------------------------

void Server::send(const Frame& frame) {
  if (state_ != State::serving && frame.type != Type::hello) return;
  protocol::encode_to(out_, frame);  // written after this batch of events (run)
  flush_due_ = true;
}

void Server::send_soon(const Frame& frame) {
  if (state_ != State::serving) return;
  protocol::encode_to(out_, frame);
  if (hold_until_us_ == 0) hold_until_us_ = monotonic_us() + kHoldMs * 1000;
}

void Server::send_json_soon(Type type, uint32_t stream, const json& body) {
  send_soon(protocol::json_frame(type, stream, body));
}

int Server::flush_if_due() {
  if (hold_until_us_ != 0 && !flush_due_) {
    const int64_t left = hold_until_us_ - monotonic_us();
    if (left > 0) return static_cast<int>((left + 999) / 1000);
  }
  if (flush_due_ || hold_until_us_ != 0) flush();
  flush_due_ = false;
  hold_until_us_ = 0;
  return -1;
}

void Server::send_json(Type type, uint32_t stream, const json& body) {
  Frame f;
  try {
    f = protocol::json_frame(type, stream, body);
  } catch (const Error& e) {
    // Only a huge message can get here; say so instead of sending nothing.
    f = protocol::json_frame(type, stream,
                             protocol::error_json(protocol::code::internal, e.what()));
  }
  send(f);
}

void Server::send_data(uint32_t stream, uint8_t channel, const char* data, size_t size) {
  while (size > 0) {
    size_t n = std::min(size, protocol::kMaxPayload);
    Frame f;
    f.type = Type::data;
    f.channel = channel;
    f.stream = stream;
    f.payload.assign(data, n);
    send(f);
    data += n;
    size -= n;
  }
}

void Server::send_credit(uint32_t stream, uint8_t channel, uint32_t bytes) {
  if (bytes) send(protocol::make_credit(stream, channel, bytes));
}

void Server::finish(uint32_t stream, const json& response) {
  auto it = streams_.find(stream);
  send_json(Type::response, stream, response);
  refill_due_ = true;
  if (it != streams_.end()) {
    graveyard_.push_back(std::move(it->second));
    streams_.erase(it);
  }
}

void Server::flush() {
  while (out_off_ < out_.size() && port_writable_) {
    ssize_t n = write(opts_.fd, out_.data() + out_off_, out_.size() - out_off_);
    if (n > 0) {
      out_off_ += n;
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      // EAGAIN (host slow or not connected) or an error: wait for EPOLLOUT.
      port_writable_ = false;
    }
  }
  if (out_off_ == out_.size()) {
    out_.clear();
    out_off_ = 0;
  } else if (out_off_ > (1 << 20)) {
    out_.erase(0, out_off_);
    out_off_ = 0;
  }
}

// ---- input ------------------------------------------------------------------

void Server::on_port(uint32_t events) {
  if (events & EPOLLOUT) {
    port_writable_ = true;
    flush();
  }
  // Edge-triggered: read until EAGAIN.
  char buf[64 * 1024];
  for (;;) {
    ssize_t n = read(opts_.fd, buf, sizeof buf);
    if (n > 0) {
      on_input(buf, n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) break;
    // 0 (virtio-serial: host not connected; socket: peer closed) or an error.
    if (opts_.exit_on_eof) {
      connection_reset("peer closed the connection");
      stop_ = true;
    } else if (state_ != State::awaiting_hello || decoder_.buffered() > 0) {
      connection_reset("host disconnected");
    }
    break;
  }
}

void Server::connection_reset(const char* why, bool reset_decoder) {
  if (!streams_.empty()) logf("%s: ending %zu open streams", why, streams_.size());
  // Execs that can be re-attached keep running into their output log;
  // everything else is aborted.
  std::vector<std::unique_ptr<Stream>> keep;
  for (auto& [id, s] : streams_) {
    if (!s->detach_key().empty()) {
      s->detach();
      keep.push_back(std::move(s));
      continue;
    }
    s->abort();
    graveyard_.push_back(std::move(s));
  }
  streams_.clear();
  for (auto& s : keep) park(std::move(s));
  out_.clear();
  out_off_ = 0;
  // A new hello arrives through the decoder: the frames after it stay.
  if (reset_decoder) decoder_.reset();
  scan_.clear();
  state_ = State::awaiting_hello;
}

void Server::on_input(const char* data, size_t size) {
  if (state_ == State::resyncing) {
    scan_.append(data, size);
    resync_scan();
    return;
  }
  try {
    decoder_.feed(data, size);
    while (state_ != State::resyncing) {
      auto f = decoder_.next();
      if (!f) break;
      handle(*f);
    }
  } catch (const Error& e) {
    logf("undecodable input from host (%s); resynchronising on the next hello", e.what());
    std::string rest(decoder_.pending());
    connection_reset("protocol error");
    state_ = State::resyncing;
    // The bad header itself is not a hello; search after its first byte.
    scan_ = rest.size() > 1 ? rest.substr(1) : std::string();
    resync_scan();
  }
}

// Looks for a hello frame (header + a JSON-object payload) in scan_; on
// success hands it and everything after it to a fresh decoder.
void Server::resync_scan() {
  using protocol::kHeaderSize;
  for (;;) {
    size_t at = protocol::find_hello_header(scan_);
    if (at == std::string::npos) {
      // Keep a possible partial header at the end.
      if (scan_.size() >= kHeaderSize) scan_.erase(0, scan_.size() - (kHeaderSize - 1));
      return;
    }
    scan_.erase(0, at);
    uint32_t len = static_cast<unsigned char>(scan_[0]) |
                   static_cast<unsigned char>(scan_[1]) << 8 |
                   static_cast<unsigned char>(scan_[2]) << 16 |
                   static_cast<uint32_t>(static_cast<unsigned char>(scan_[3])) << 24;
    if (scan_.size() < kHeaderSize + len) return;  // wait for the payload
    json j =
        json::parse(scan_.begin() + kHeaderSize, scan_.begin() + kHeaderSize + len, nullptr, false);
    if (!j.is_object()) {
      scan_.erase(0, 1);
      continue;
    }
    std::string rest = std::move(scan_);
    scan_.clear();
    decoder_.reset();
    state_ = State::awaiting_hello;
    logf("resynchronised on a hello");
    on_input(rest.data(), rest.size());
    return;
  }
}

void Server::handle(Frame& f) {
  if (f.type == Type::hello) {
    if (f.stream != 0) {
      logf("hello on stream %u ignored (must be stream 0)", f.stream);
      return;
    }
    handle_hello(f);
    return;
  }
  if (state_ != State::serving) return;  // nothing before the handshake
  if (f.type == Type::request) {
    handle_request(f);
    return;
  }
  auto it = streams_.find(f.stream);
  if (it == streams_.end()) return;  // late frames for a closed stream: expected
  Stream& s = *it->second;
  switch (f.type) {
    case Type::data:
      if (!f.payload.empty()) s.on_data(f.channel, f.payload);
      break;
    case Type::eof:
      s.on_eof(f.channel);
      break;
    case Type::credit:
      try {
        s.on_credit(f.channel, protocol::parse_credit(f));
      } catch (const Error& e) {
        s.abort();
        finish(f.stream, protocol::error_json(protocol::code::protocol_error, e.what()));
      }
      break;
    case Type::signal: {
      // {"signal": N}, or {"resize": {"cols", "rows"}} on a pty exec.
      int signo = -1;
      bool resize = false;
      uint16_t cols = 0, rows = 0;
      std::string bad = "signal frame must be {\"signal\": 1..64} or {\"resize\": {cols, rows}}";
      try {
        json j = protocol::parse_json(f);
        if (auto d = j.find("detach"); d != j.end() && *d == true) {
          // The host lets go of the exec without ending it (§5, detach).
          if (s.detach_key().empty()) {
            s.abort();
            finish(f.stream, protocol::error_json(protocol::code::protocol_error,
                                                  "only a foreground exec with an exec_id "
                                                  "can be detached"));
            return;
          }
          json r = s.detach();
          send_json(Type::response, f.stream, r);
          auto node = streams_.extract(f.stream);
          park(std::move(node.mapped()));
          return;
        }
        if (auto r = j.find("resize"); r != j.end()) {
          parse_winsize(*r, "resize", cols, rows);
          resize = true;
        } else {
          signo = static_cast<int>(protocol::optional_int(j, "signal", -1, 1, 64));
        }
      } catch (const Error& e) {
        bad = e.what();
      }
      if (resize) {
        s.on_resize(cols, rows);
      } else if (signo < 1) {
        s.abort();
        finish(f.stream, protocol::error_json(protocol::code::invalid_argument, bad));
      } else {
        s.on_signal(signo);
      }
      break;
    }
    default:
      logf("frame type %d from host on stream %u is not allowed", static_cast<int>(f.type),
           f.stream);
      s.abort();
      finish(f.stream, protocol::error_json(protocol::code::protocol_error,
                                            "frame type " + std::to_string(int(f.type)) +
                                                " may not be sent by the host"));
  }
}

void Server::handle_hello(const Frame& f) {
  // A hello at any time starts a new session: whatever was open is gone.
  if (state_ == State::serving) connection_reset("new hello", /*reset_decoder=*/false);
  state_ = State::serving;  // so the reply can be sent
  json req;
  int64_t version = -1;
  try {
    req = protocol::parse_json(f);
    version = protocol::optional_int(req, "version", -1);
    if (version < protocol::kMinVersion || version > protocol::kVersion)
      throw GuestError(protocol::code::unsupported_version,
                       "protocol version " + std::to_string(version) +
                           " is not supported (this agent speaks version " +
                           std::to_string(protocol::kVersion) + ")");
  } catch (const std::exception& e) {
    auto* ge = dynamic_cast<const GuestError*>(&e);
    send_json(Type::hello, 0,
              protocol::error_json(ge ? ge->code() : protocol::code::unsupported_version,
                                   std::string("hello rejected: ") + e.what()));
    state_ = State::awaiting_hello;
    return;
  }
  if (opts_.system) apply_hello(req);
  utsname u{};
  uname(&u);
  send_json(
      Type::hello, 0,
      {{"version", version}, {"agent_version", protocol::kAgentVersion}, {"kernel", u.release}});
}

void Server::handle_request(Frame& f) {
  const uint32_t id = f.stream;
  if (id == 0) {
    logf("request on stream 0 ignored");
    return;
  }
  if (auto it = streams_.find(id); it != streams_.end()) {
    it->second->abort();
    finish(id, protocol::error_json(protocol::code::invalid_argument,
                                    "stream " + std::to_string(id) + " is already open"));
    return;
  }
  std::string op;
  try {
    json req = protocol::parse_json(f);
    op = protocol::require_string(req, "op");
    std::unique_ptr<Stream> stream;
    if (op == "exec") {
      stream = start_exec(*this, id, req);
    } else if (op == "write_file") {
      stream = start_write_file(*this, id, req);
    } else if (op == "read_file") {
      stream = start_read_file(*this, id, req);
    } else if (op == "watch") {
      stream = start_watch(*this, id, req);
    } else if (op == "attach") {
      // Registered first: sending the backlog may finish (and so close) it.
      auto& s = streams_[id] = start_attach(id, req);
      s->pump();
      return;
    } else if (op == "wait_job") {
      stream = jobs_->wait(id, req);
    } else if (op == "job_stdin") {
      // A background job's stdin, or else a foreground exec's (§5: after a
      // daemon restart its stdin is fed by exec_id).
      Stream* fg = find_exec(protocol::require_string(req, "exec_id"));
      stream = fg ? fg->feed_stdin(id, protocol::optional_bool(req, "close", false))
                  : jobs_->write_stdin(id, req);
    } else {
      json result;
      if (op == "ping")
        result = json::object();
      else if (op == "list")
        result = op_list(req);
      else if (op == "stat")
        result = op_stat(req);
      else if (op == "move")
        result = op_move(req);
      else if (op == "mkdir")
        result = op_mkdir(req);
      else if (op == "remove")
        result = op_remove(req);
      else if (op == "info")
        result = op_info(req);
      else if (op == "user") {
        User u = parse_user(req);
        result = {
            {"name", u.name}, {"uid", u.uid}, {"gid", u.gid}, {"home", u.home}, {"shell", u.shell}};
      } else if (op == "sync")
        result = op_sync(req);
      else if (op == "set_time")
        result = op_set_time(req);
      else if (op == "jobs")
        result = jobs_->list();
      else if (op == "kill_job") {
        Stream* fg = find_exec(protocol::require_string(req, "exec_id"));
        result = fg ? fg->signal_by_id(
                          static_cast<int>(protocol::optional_int(req, "signal", SIGKILL, 1, 64)))
                    : jobs_->kill(req);
      } else
        throw Error(Errc::invalid_argument, "unknown op '" + op + "'", "op");
      finish(id, result);
      return;
    }
    if (stream) streams_[id] = std::move(stream);
  } catch (const GuestError& e) {
    finish(id, protocol::error_json(e.code(), e.what()));
  } catch (const Error& e) {
    const char* c = e.code() == Errc::invalid_argument || e.code() == Errc::protocol_error
                        ? protocol::code::invalid_argument
                        : protocol::code::internal;
    finish(id, protocol::error_json(c, (op.empty() ? "" : op + ": ") + e.what()));
  } catch (const std::exception& e) {
    finish(id, protocol::error_json(protocol::code::internal,
                                    (op.empty() ? "" : op + ": ") + e.what()));
  }
}

nlohmann::json Server::op_set_time(const json& req) {
  int64_t ns = protocol::optional_int(req, "time_ns", 0, 1, INT64_MAX);
  if (ns < 1) throw Error(Errc::invalid_argument, "time_ns is required", "time_ns");
  // Host mode runs on a developer's machine or in tests: its clock is the
  // host's own, never ours to set.
  if (opts_.system && !set_clock_ns(ns))
    throw GuestError(protocol::code::internal, std::string("clock_settime: ") + strerror(errno));
  // A pool member's hand-out names the guest after its public id (checked
  // and applied as a hello's hostname is).
  if (opts_.system && req.contains("hostname")) apply_hello({{"hostname", req["hostname"]}});
  return json::object();
}

// ---- detach and attach ------------------------------------------------------

void Server::park(std::unique_ptr<Stream> s) {
  std::string key = s->detach_key();
  detached_.emplace_back(std::move(key), std::move(s));
  // Bounded: running execs are never dropped, the oldest ended ones are.
  for (size_t i = 0; detached_.size() > kMaxDetached && i < detached_.size();) {
    if (detached_[i].second->ended()) {
      detached_[i].second->abort();
      graveyard_.push_back(std::move(detached_[i].second));
      detached_.erase(detached_.begin() + i);
    } else {
      ++i;
    }
  }
}

std::unique_ptr<Stream> Server::start_attach(uint32_t id, const json& req) {
  std::string exec_id = protocol::require_string(req, "exec_id");
  int64_t offset = protocol::optional_int(req, "offset", 0, 0, INT64_MAX);
  for (auto it = detached_.begin(); it != detached_.end(); ++it) {
    if (it->first != exec_id) continue;
    it->second->attach(id, static_cast<uint64_t>(offset));  // throws on a bad offset
    std::unique_ptr<Stream> s = std::move(it->second);
    detached_.erase(it);
    return s;
  }
  for (auto& [sid, s] : streams_)
    if (s->detach_key() == exec_id)
      throw GuestError(protocol::code::exists,
                       "attach " + exec_id + ": the exec is attached to another stream");
  throw GuestError(protocol::code::not_found, "attach " + exec_id + ": no such detached exec");
}

Stream* Server::find_exec(const std::string& exec_id) {
  if (exec_id.empty()) return nullptr;
  for (auto& [key, s] : detached_)
    if (key == exec_id) return s.get();
  for (auto& [sid, s] : streams_)
    if (s->detach_key() == exec_id) return s.get();
  return nullptr;
}

// ---- children ---------------------------------------------------------------

ExecCgroup Server::make_cgroup() {
  ExecCgroup cg;
  for (int attempt = 0;; ++attempt) {
    cg.path = opts_.cgroup_root + "/exec-" + std::to_string(next_serial());
    if (mkdir(cg.path.c_str(), 0755) == 0) break;
    // EEXIST: a leftover of an earlier agent on the same root.
    if (errno != EEXIST || attempt == 8) throw_sys("mkdir exec cgroup under " + opts_.cgroup_root);
  }
  // An OOM kill takes the whole exec, not one random member of it.
  if (FILE* f = fopen((cg.path + "/memory.oom.group").c_str(), "we")) {
    fputs("1", f);
    fclose(f);
  }
  cg.fd = open(cg.path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (cg.fd < 0) {
    int e = errno;
    rmdir(cg.path.c_str());
    errno = e;
    throw_sys("open " + cg.path);
  }
  cg.kill_fd = openat(cg.fd, "cgroup.kill", O_WRONLY | O_CLOEXEC);
  cg.events_fd = openat(cg.fd, "memory.events", O_RDONLY | O_CLOEXEC);
  return cg;
}

void ExecCgroup::close_fds() {
  for (int* f : {&fd, &kill_fd, &events_fd})
    if (*f >= 0) close(*f), *f = -1;
}

ExecCgroup Server::take_cgroup(bool fresh) {
  if (spare_.fd >= 0 && !(fresh && spare_.reused)) return std::exchange(spare_, ExecCgroup{});
  return make_cgroup();
}

void Server::recycle_cgroup(ExecCgroup cg) {
  if (spare_.fd >= 0 || cg.fd < 0) {
    cg.close_fds();
    if (rmdir(cg.path.c_str()) != 0 && errno != ENOENT) linger_cgroup(cg.path);
    return;
  }
  cg.reused = true;
  cg.base_oom_kills = cgroup_key(cg.fd, "memory.events", "oom_kill");
  cg.base_pids_max = cgroup_key(cg.fd, "pids.events", "max");
  spare_ = std::move(cg);
}

void Server::refill_spare_cgroup() {
  if (opts_.cgroup_root.empty() || !refill_due_ || state_ != State::serving) return;
  // Due once per reply, and met by a spare that reply's exec handed on
  // (recycle_cgroup). Left due, the next exec's loop turn would mkdir while
  // its process runs on the one vCPU, and the cgroup recycled after its
  // reply would find a spare and be removed.
  refill_due_ = false;
  if (spare_.fd >= 0) return;
  try {
    spare_ = make_cgroup();
  } catch (const std::exception& e) {
    // The next exec makes its own (and reports why it cannot).
    logf("spare exec cgroup: %s", e.what());
  }
}

void Server::on_child_exit(pid_t pid, std::function<void(int status)> on_exit) {
  children_[pid] = std::move(on_exit);
}

void Server::on_sigchld() {
  signalfd_siginfo si;
  while (read(sigfd_, &si, sizeof si) == sizeof si) {
  }
  for (;;) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) break;
    auto it = children_.find(pid);
    if (it == children_.end()) continue;  // an orphan we inherited as init
    auto cb = std::move(it->second);
    children_.erase(it);
    cb(status);
  }
  for (size_t i = 0; i < lingering_.size();) {
    if (rmdir(lingering_[i].c_str()) == 0 || errno == ENOENT) {
      lingering_[i] = std::move(lingering_.back());
      lingering_.pop_back();
    } else {
      ++i;
    }
  }
}

}  // namespace airlock::guest

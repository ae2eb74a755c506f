// exec (api/guest-protocol.md §5): one child per stream, in its own session
// and cgroup (exec_tree.h), stdout/stderr streamed under credit and capped,
// stdin fed from the host. When the main process ends, what it left running
// is killed; background execs go to jobs.cc instead.
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/timerfd.h>
#include <termios.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "common/error.h"
#include "guest/exec_tree.h"
#include "guest/jobs.h"
#include "guest/log.h"
#include "guest/ops.h"
#include "guest/output_log.h"
#include "guest/spawn.h"
#include "protocol/messages.h"

namespace airlock::guest {
namespace {

using nlohmann::json;
using protocol::kInitialCredit;
namespace code = protocol::code;

void set_nonblock(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

class StdinFeed;

class Exec : public Stream {
 public:
  Exec(Server& server, uint32_t id, size_t log_capacity, int64_t received_us)
      : Stream(server, id),
        tree_(server),
        received_(std::chrono::steady_clock::now()),
        received_us_(received_us),
        log_(log_capacity) {}
  ~Exec() override { release(); }

  void start(const ExecSpec& spec);
  void on_data(uint8_t channel, const std::string& bytes) override;
  void on_eof(uint8_t channel) override;
  void on_credit(uint8_t channel, uint32_t bytes) override;
  void on_signal(int signo) override { tree_.signal(signo, /*from_host=*/true); }
  void on_resize(uint16_t cols, uint16_t rows) override;
  void abort() override {
    tree_.kill();
    release();
  }
  std::string detach_key() const override { return exec_id_; }
  json detach() override;
  void attach(uint32_t stream, uint64_t offset) override;
  bool ended() const override { return done_; }
  json signal_by_id(int signo) override;
  std::unique_ptr<Stream> feed_stdin(uint32_t stream, bool close_after) override;

  // The feeding side of a StdinFeed stream (job_stdin on a foreground exec).
  void feed(const std::string& bytes);
  void feed_eof();
  void unfeed();  // the feed stream goes away (answered or aborted)

 private:
  struct Out {
    int fd = -1;
    uint64_t credit = kInitialCredit;
    uint64_t sent = 0;     // read below the cap (into the log)
    uint64_t dropped = 0;  // read beyond the cap and discarded
    bool watched = false;
    bool closed = false;    // the pipe reached eof
    bool eof_sent = false;  // ... and the current host was told so
  };
  // Sends from the log at cursor_ as the host's credit allows; then the
  // eofs and the response once everything was sent.
  void pump() override;
  void update_watches() {
    update_watch(1);
    update_watch(2);
  }
  void on_output(uint8_t ch);
  void update_watch(uint8_t ch);
  void write_stdin();
  void close_stdin();
  // A detached exec's open stdin is closed once nobody attached or fed it
  // for detached_stdin_ms (the bound on what a forgotten exec holds).
  void arm_stdin_linger();
  void disarm_stdin_linger();
  void feed_answer_if_done();
  void maybe_finish();
  void release();
  void close_fd(int& fd) {
    if (fd >= 0) {
      server_.unwatch(fd);
      close(fd);
      fd = -1;
    }
  }

  ProcTree tree_;
  std::chrono::steady_clock::time_point received_;  // the exec request
  int64_t received_us_;  // monotonic_us() before the request was parsed (phase trace)
  uint64_t limit_ = kDefaultOutputLimit;
  Out out_[3];  // index 1 = stdout, 2 = stderr
  int in_fd_ = -1;
  bool in_watched_ = false;
  std::string in_buf_;
  bool in_eof_ = false;
  uint64_t in_window_ = kInitialCredit;
  uint64_t in_bytes_ = 0;
  // Stdin after a detach (§5): the original stream no longer feeds it
  // (host_stdin_ false); a StdinFeed may. feed_pending_ = bytes at the tail
  // of in_buf_ that came from the feed (credited to it as written).
  bool host_stdin_ = true;
  StdinFeed* feed_ = nullptr;
  uint64_t feed_pending_ = 0;
  bool feed_eof_ = false, feed_close_ = false;
  bool has_stdin_ = false;  // started with a stdin pipe
  // A pty exec's terminal input comes on whichever stream is attached (the
  // original or an attach stream); in_orphan_ = bytes at the head of
  // in_buf_ sent by a stream that is gone (credited to nobody).
  bool pty_ = false;
  uint64_t in_orphan_ = 0;
  int64_t linger_ms_ = 0;
  int linger_fd_ = -1;
  bool exited_ = false, done_ = false;
  json result_;  // the response, once done_
  // Detach and attach: the exec's output log, the next offset to send, and
  // whether a host stream is attached (a detached exec sends nothing).
  std::string exec_id_;  // empty: not detachable (pty, or a host without it)
  OutputLog log_;
  uint64_t cursor_ = 0;
  bool attached_ = true;
  int master_ = -1;  // pty execs: the master (read side = out_[1].fd, write side = in_fd_)
};

// A job_stdin stream on a foreground exec (after a daemon restart the new
// host feeds a detached exec's stdin by exec_id): data goes into the exec's
// stdin buffer, credit comes back as the exec writes it into the pipe, and
// its eof is answered once everything buffered was written
// ({"stdin_bytes","stdin_total","stdin_closed"}, as for a job).
class StdinFeed : public Stream {
 public:
  StdinFeed(Server& server, uint32_t id, Exec& exec) : Stream(server, id), exec_(&exec) {}
  ~StdinFeed() override { abort(); }

  void on_data(uint8_t ch, const std::string& bytes) override {
    if (ch != 0 || bytes.size() > window_) {
      fail(code::protocol_error, ch != 0 ? "job_stdin takes data only on channel 0"
                                         : "job_stdin data beyond the granted credit");
      return;
    }
    window_ -= bytes.size();
    if (!exec_) {  // the exec's stdin is gone: discard, keep the window open
      dropped(bytes.size());
      return;
    }
    exec_->feed(bytes);
  }
  void on_eof(uint8_t ch) override {
    if (ch != 0 || eof_) return;
    eof_ = true;
    if (exec_)
      exec_->feed_eof();  // answers through answer() once written
    else
      answer(total_, true);
  }
  void abort() override {
    if (exec_) exec_->unfeed();
    exec_ = nullptr;
  }

  // From the exec: `n` of this stream's bytes went into the pipe / were dropped.
  void written(uint64_t n) {
    bytes_ += n;
    dropped(n);
  }
  void dropped(uint64_t n) {
    window_ += n;
    server_.send_credit(id_, 0, static_cast<uint32_t>(n));
  }
  // The exec's stdin is closed for good (the process ended, or its stdin).
  void exec_gone(uint64_t total) {
    exec_ = nullptr;
    total_ = total;
    if (eof_) answer(total_, true);
  }
  void answer(uint64_t total, bool closed) {
    exec_ = nullptr;
    server_.finish(id_,
                   {{"stdin_bytes", bytes_}, {"stdin_total", total}, {"stdin_closed", closed}});
  }

 private:
  Exec* exec_;
  bool eof_ = false;
  uint64_t window_ = kInitialCredit, bytes_ = 0, total_ = 0;
};

// The master and slave of a fresh pty sized cols x rows. Both O_CLOEXEC; the
// master non-blocking. Throws GuestError.
void open_pty(uint16_t cols, uint16_t rows, int& master, int& slave) {
  master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (master < 0) throw_sys("posix_openpt");
  char name[64];
  if (grantpt(master) != 0 || unlockpt(master) != 0 || ptsname_r(master, name, sizeof name) != 0) {
    int e = errno;
    close(master);
    errno = e;
    throw_sys("setting up the pty");
  }
  slave = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (slave < 0) {
    int e = errno;
    close(master);
    errno = e;
    throw_sys(std::string("open ") + name);
  }
  winsize ws{};
  ws.ws_col = cols;
  ws.ws_row = rows;
  ioctl(master, TIOCSWINSZ, &ws);
}

void Exec::on_resize(uint16_t cols, uint16_t rows) {
  if (master_ < 0) {
    fail(code::protocol_error, "resize frames are only valid on pty exec streams");
    return;
  }
  winsize ws{};
  ws.ws_col = cols;
  ws.ws_row = rows;
  // The kernel sends SIGWINCH to the terminal's foreground process group.
  if (ioctl(master_, TIOCSWINSZ, &ws) != 0) logf("exec %u: TIOCSWINSZ: %s", id_, strerror(errno));
}

void Exec::start(const ExecSpec& spec) {
  limit_ = spec.output_limit;
  exec_id_ = spec.exec_id;
  pty_ = spec.pty;
  linger_ms_ = spec.detached_stdin_ms;
  if (spec.pty) {
    int master = -1, slave = -1;
    open_pty(spec.cols, spec.rows, master, slave);
    // A second fd for writing, so reading and writing are watched apart.
    int writer = fcntl(master, F_DUPFD_CLOEXEC, 0);
    if (writer < 0) {
      int e = errno;
      close(master);
      close(slave);
      errno = e;
      throw_sys("dup pty master");
    }
    try {
      tree_.spawn(spec, slave, slave, slave, [this](int) {
        exited_ = true;
        tree_.kill();  // as below; then the slave is closed and the master reads EIO
        maybe_finish();
      });
    } catch (...) {
      close(master);
      close(writer);
      close(slave);
      throw;
    }
    close(slave);
    server_.send_json_soon(protocol::Type::event, id_, {{"started", true}, {"pid", tree_.pid()}});
    master_ = master;
    out_[1].fd = master;
    set_nonblock(master);
    update_watch(1);
    in_fd_ = writer;
    set_nonblock(in_fd_);
    return;
  }
  int in[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1};
  auto close_all = [&] {
    for (int fd : {in[0], in[1], out[0], out[1], err[0], err[1]})
      if (fd >= 0) close(fd);
  };
  if (pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC) || (spec.want_stdin && pipe2(in, O_CLOEXEC))) {
    int e = errno;
    close_all();
    errno = e;
    throw_sys("pipe");
  }
  try {
    tree_.spawn(spec, in[0], out[1], err[1], [this](int) {
      exited_ = true;
      // The main process is done: whatever it left behind (background
      // children, setsid'ed or double-forked daemons) goes with it. Their
      // pipes then close and the exec can finish.
      tree_.kill();
      maybe_finish();
    });
  } catch (...) {
    close_all();
    throw;
  }
  for (int fd : {in[0], out[1], err[1]})
    if (fd >= 0) close(fd);
  server_.send_json_soon(protocol::Type::event, id_, {{"started", true}, {"pid", tree_.pid()}});
  out_[1].fd = out[0];
  out_[2].fd = err[0];
  for (uint8_t ch : {1, 2}) {
    set_nonblock(out_[ch].fd);
    update_watch(ch);
  }
  if (spec.want_stdin) {
    in_fd_ = in[1];
    has_stdin_ = true;
    set_nonblock(in_fd_);
  }
}

// Below the cap a pipe is read only while the host has granted credit: with
// none left the fd leaves the epoll set, the pipe fills and the child blocks
// in write(). Beyond the cap it is always read, and what is read is dropped.
// Detached, it is always read (into the log, which evicts its oldest bytes).
// Attached, only once everything in the log was sent (a resuming host first
// gets the backlog, in order).
void Exec::update_watch(uint8_t ch) {
  Out& o = out_[ch];
  bool want =
      o.fd >= 0 && (!attached_ || o.sent >= limit_ || (o.credit > 0 && cursor_ == log_.end()));
  if (want && !o.watched) server_.watch(o.fd, EPOLLIN, [this, ch](uint32_t) { on_output(ch); });
  if (!want && o.watched) server_.unwatch(o.fd);
  o.watched = want;
}

void Exec::on_output(uint8_t ch) {
  Out& o = out_[ch];
  char buf[protocol::kMaxPayload];
  const uint64_t room = o.sent < limit_ ? limit_ - o.sent : 0;
  uint64_t want = sizeof buf;
  if (room > 0) want = std::min<uint64_t>({attached_ ? o.credit : want, want, room});
  ssize_t n = read(o.fd, buf, want);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n > 0) {
    if (room > 0) {
      log_.append(ch, buf, n);
      o.sent += n;
      pump();
    } else {
      o.dropped += n;
    }
    update_watch(ch);
    return;
  }
  // EOF (every writer closed) or a read error; a pty master reads EIO
  // once every slave fd is closed.
  o.watched = false;
  if (ch == 1) master_ = -1;  // the same fd for a pty exec
  close_fd(o.fd);
  o.closed = true;
  pump();  // the eof goes after the data still in the log
  maybe_finish();
}

void Exec::pump() {
  if (!attached_) return;
  while (cursor_ < log_.end()) {
    auto [ch, bytes] = log_.at(cursor_);
    Out& o = out_[ch];
    size_t n = std::min<uint64_t>({bytes.size(), o.credit, protocol::kMaxPayload});
    if (n == 0) break;  // in order: wait for this channel's credit
    server_.send_data(id_, ch, bytes.data(), n);
    o.credit -= n;
    cursor_ += n;
  }
  log_.mark_sent(cursor_);
  if (cursor_ < log_.end()) return;
  for (uint8_t ch : {1, 2}) {
    Out& o = out_[ch];
    if (!o.closed || o.eof_sent) continue;
    o.eof_sent = true;
    protocol::Frame eof;
    eof.type = protocol::Type::eof;
    eof.channel = ch;
    eof.stream = id_;
    server_.send_soon(eof);  // the response or more eofs usually follow at once
  }
  update_watches();
  if (done_) {
    attached_ = false;  // finish() destroys this stream
    server_.finish(id_, result_);
  }
}

json Exec::detach() {
  attached_ = false;
  // The stream that started the exec no longer feeds its stdin; what it
  // sent is still written (in_buf_), credited to nobody. The stdin stays
  // open for a later host (job_stdin by exec_id) for linger_ms_.
  host_stdin_ = false;
  in_orphan_ = in_buf_.size() - feed_pending_;
  arm_stdin_linger();
  update_watches();
  return {{"detached", true}, {"offset", cursor_}};
}

void Exec::arm_stdin_linger() {
  // (A pty's input is its terminal: it stays as long as the exec.)
  if (!has_stdin_ || in_fd_ < 0 || attached_ || feed_ || linger_fd_ >= 0) return;
  if (linger_ms_ <= 0) {
    close_stdin();
    return;
  }
  linger_fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (linger_fd_ < 0) {
    close_stdin();  // cannot bound it: do not keep it
    return;
  }
  itimerspec its{};
  its.it_value.tv_sec = linger_ms_ / 1000;
  its.it_value.tv_nsec = (linger_ms_ % 1000) * 1000000;
  timerfd_settime(linger_fd_, 0, &its, nullptr);
  server_.watch(linger_fd_, EPOLLIN, [this](uint32_t) {
    disarm_stdin_linger();
    if (!attached_ && !feed_) {
      logf("exec %s: nobody fed its stdin for %lld ms: closed", exec_id_.c_str(),
           static_cast<long long>(linger_ms_));
      close_stdin();
    }
  });
}

void Exec::disarm_stdin_linger() { close_fd(linger_fd_); }

json Exec::signal_by_id(int signo) {
  if (!exited_) tree_.signal(signo, /*from_host=*/true);
  return {{"exec_id", exec_id_}, {"background", false},   {"pid", tree_.pid()},
          {"running", !done_},   {"attached", attached_}, {"end", log_.end()}};
}

std::unique_ptr<Stream> Exec::feed_stdin(uint32_t stream, bool close_after) {
  if (!has_stdin_)
    throw GuestError(code::exists, "exec " + exec_id_ + " was not started with streamed stdin");
  if (in_fd_ < 0) throw GuestError(code::exists, "the stdin of " + exec_id_ + " is closed");
  if (host_stdin_)
    throw GuestError(code::exists, "the stdin of " + exec_id_ + " is fed by its exec stream");
  if (feed_) throw GuestError(code::exists, "another job_stdin is writing to " + exec_id_);
  auto f = std::make_unique<StdinFeed>(server_, stream, *this);
  feed_ = f.get();
  feed_pending_ = 0;
  feed_eof_ = false;
  feed_close_ = close_after;
  disarm_stdin_linger();
  return f;
}

void Exec::feed(const std::string& bytes) {
  in_buf_ += bytes;
  feed_pending_ += bytes.size();
  write_stdin();
}

void Exec::feed_eof() {
  feed_eof_ = true;
  write_stdin();
}

void Exec::unfeed() {
  feed_ = nullptr;
  feed_pending_ = 0;  // still written, credited to nobody
  feed_eof_ = false;
  arm_stdin_linger();
}

// The feed's eof is answered once everything buffered before it went into
// the pipe: its stdin_total is then exactly what the process was given.
void Exec::feed_answer_if_done() {
  if (!feed_ || !feed_eof_) return;
  if (in_fd_ >= 0 && !in_buf_.empty()) return;
  if (feed_close_) close_stdin();
  StdinFeed* f = feed_;
  feed_ = nullptr;
  feed_eof_ = false;
  f->answer(in_bytes_, in_fd_ < 0);
  arm_stdin_linger();
}

void Exec::close_stdin() {
  if (feed_ && feed_pending_) feed_->dropped(feed_pending_);
  feed_pending_ = 0;
  in_orphan_ = 0;
  in_buf_.clear();
  in_watched_ = false;
  close_fd(in_fd_);
  disarm_stdin_linger();
}

void Exec::attach(uint32_t stream, uint64_t offset) {
  if (offset > log_.end())
    throw Error(Errc::invalid_argument,
                "offset " + std::to_string(offset) + " is beyond the end of the output (" +
                    std::to_string(log_.end()) + " bytes so far)",
                "offset");
  id_ = stream;
  attached_ = true;
  disarm_stdin_linger();
  if (pty_) {
    // The attach stream types into the terminal, with a window of its own.
    host_stdin_ = true;
    in_window_ = kInitialCredit;
    in_eof_ = false;
  }
  cursor_ = std::max(offset, log_.start());
  for (uint8_t ch : {1, 2}) {
    out_[ch].credit = kInitialCredit;
    out_[ch].eof_sent = false;
  }
  json ev{{"attached", true},  {"exec_id", exec_id_},         {"pid", tree_.pid()},
          {"offset", cursor_}, {"dropped", cursor_ - offset}, {"end", log_.end()},
          {"running", !done_}, {"lost", log_.lost()}};
  server_.send_json(protocol::Type::event, id_, ev);
  // The server pumps the backlog once the stream is registered again.
}

void Exec::on_credit(uint8_t ch, uint32_t bytes) {
  if (ch != 1 && ch != 2) return;
  out_[ch].credit = std::min<uint64_t>(out_[ch].credit + bytes, UINT32_MAX);
  pump();  // attached: sends the response once the log is drained
  if (attached_) update_watch(ch);
}

void Exec::on_data(uint8_t ch, const std::string& bytes) {
  if (ch != 0 || bytes.size() > in_window_) {
    fail(code::protocol_error, ch != 0 ? "exec takes data only on channel 0 (stdin)"
                                       : "stdin data beyond the granted credit");
    return;
  }
  in_window_ -= bytes.size();
  if (in_fd_ < 0 || !host_stdin_) {
    // No stdin (not requested, or the process closed it), or an attach
    // stream (which does not feed it): discard, but keep the host's window open.
    in_window_ += bytes.size();
    server_.send_credit(id_, 0, bytes.size());
    return;
  }
  in_buf_ += bytes;
  write_stdin();
}

void Exec::on_eof(uint8_t ch) {
  if (ch != 0 || !host_stdin_) return;
  in_eof_ = true;
  write_stdin();
}

void Exec::write_stdin() {
  // in_buf_ = [bytes of the exec stream (credited to it while it feeds
  // stdin) | feed_pending_ bytes of the StdinFeed (credited to it)].
  auto credit = [&](uint64_t n) {
    const uint64_t orphan = std::min(n, in_orphan_);
    in_orphan_ -= orphan;
    n -= orphan;
    const uint64_t head = std::min<uint64_t>(n, in_buf_.size() - orphan - feed_pending_);
    if (head && host_stdin_) {
      in_window_ += head;
      server_.send_credit(id_, 0, head);
    }
    return n - head;  // the feed's share
  };
  while (in_fd_ >= 0 && !in_buf_.empty()) {
    ssize_t n = write(in_fd_, in_buf_.data(), in_buf_.size());
    if (n > 0) {
      uint64_t fed = credit(n);
      in_buf_.erase(0, n);
      in_bytes_ += n;
      if (fed) {
        feed_pending_ -= fed;
        feed_->written(fed);
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      if (!in_watched_) server_.watch(in_fd_, EPOLLOUT, [this](uint32_t) { write_stdin(); });
      in_watched_ = true;
      return;
    }
    // EPIPE: the process does not read stdin any more. Drop what is left.
    credit(in_buf_.size());
    close_stdin();
  }
  if (in_watched_ && in_fd_ >= 0) server_.unwatch(in_fd_);
  in_watched_ = false;
  if (in_eof_ && in_buf_.empty()) close_stdin();
  feed_answer_if_done();
}

void Exec::maybe_finish() {
  if (done_ || !exited_ || out_[1].fd >= 0 || out_[2].fd >= 0) return;
  done_ = true;
  json r = tree_.outcome();
  r["stdout_bytes"] = out_[1].sent + out_[1].dropped;
  r["stderr_bytes"] = out_[2].sent + out_[2].dropped;
  r["stdout_dropped"] = out_[1].dropped;
  r["stderr_dropped"] = out_[2].dropped;
  r["truncated"] = out_[1].dropped > 0 || out_[2].dropped > 0;
  r["stdin_bytes"] = in_bytes_;
  if (!exec_id_.empty()) {
    r["exec_id"] = exec_id_;
    r["output_lost"] = log_.lost();
    r["output_end"] = log_.end();
  }
  r["spawn_us"] = tree_.spawn_trace(received_us_, monotonic_us());
  release();
  // Request to reply inside the agent (cgroup set-up, spawn, wait, reap).
  r["agent_us"] = std::chrono::duration_cast<std::chrono::microseconds>(
                      std::chrono::steady_clock::now() - received_)
                      .count();
  result_ = std::move(r);
  pump();  // attached: sends the response once the log is drained
}

void Exec::release() {
  for (uint8_t ch : {1, 2}) {
    out_[ch].watched = false;
    close_fd(out_[ch].fd);
  }
  master_ = -1;  // was out_[1].fd
  in_watched_ = false;
  close_fd(in_fd_);
  disarm_stdin_linger();
  if (feed_) {
    StdinFeed* f = feed_;
    feed_ = nullptr;
    f->exec_gone(in_bytes_);
  }
}

}  // namespace

std::unique_ptr<Stream> start_exec(Server& server, uint32_t id, const json& req) {
  const int64_t received_us = monotonic_us();
  ExecSpec spec = parse_exec_spec(req);
  if (spec.background) {
    // Answered at once; the job lives on in the server's job table.
    server.finish(id, server.jobs().start(spec));
    return nullptr;
  }
  // Every exec sends through its log; one frame's worth is the least it
  // needs. A pty exec cannot detach and keeps just that.
  auto e = std::make_unique<Exec>(
      server, id, std::max<uint64_t>(spec.output_buffer, protocol::kMaxPayload), received_us);
  e->start(spec);
  return e;
}

}  // namespace airlock::guest

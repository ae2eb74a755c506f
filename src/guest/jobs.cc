#include "guest/jobs.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>

#include "common/error.h"
#include "guest/exec_tree.h"
#include "guest/ops.h"
#include "protocol/messages.h"

namespace airlock::guest {

using nlohmann::json;
namespace code = protocol::code;

struct Jobs::Job {
  std::string exec_id;
  std::vector<std::string> argv;
  int pid = 0;
  int64_t started_at_ms = 0;
  std::unique_ptr<ProcTree> tree;
  bool running = true;
  json outcome;                  // once it ended
  std::vector<Waiter*> waiters;  // wait_job streams for it
  // Streamed stdin ("stdin": true): the pipe's write end, non-blocking.
  bool has_stdin = false;
  int stdin_fd = -1;
  uint64_t stdin_total = 0;       // bytes written into the pipe
  StdinWriter* writer = nullptr;  // the job_stdin stream feeding it, if any
  ~Job() {
    if (stdin_fd >= 0) close(stdin_fd);
  }
};

// A job_stdin stream: data -> the job's stdin pipe, credit as it is
// written (never more than the window held), eof -> the answer.
class Jobs::StdinWriter : public Stream {
 public:
  StdinWriter(Server& server, uint32_t id, Job& job, bool close_after)
      : Stream(server, id), job_(&job), close_after_(close_after) {
    job.writer = this;
  }
  ~StdinWriter() override { abort(); }

  void on_data(uint8_t ch, const std::string& bytes) override {
    if (ch != 0 || bytes.size() > window_) {
      abort();
      fail(code::protocol_error, ch != 0 ? "job_stdin takes data only on channel 0"
                                         : "job_stdin data beyond the granted credit");
      return;
    }
    window_ -= bytes.size();
    if (!job_ || job_->stdin_fd < 0) {  // nobody reads: discard, keep the window open
      window_ += bytes.size();
      server_.send_credit(id_, 0, bytes.size());
      return;
    }
    buf_ += bytes;
    write_some();
  }
  void on_eof(uint8_t ch) override {
    if (ch != 0) return;
    eof_ = true;
    write_some();
  }
  void abort() override {
    if (!job_) return;
    if (watched_ && job_->stdin_fd >= 0) server_.unwatch(job_->stdin_fd);
    watched_ = false;
    job_->writer = nullptr;
    job_ = nullptr;
  }

 private:
  void write_some() {
    while (job_ && job_->stdin_fd >= 0 && !buf_.empty()) {
      ssize_t n = write(job_->stdin_fd, buf_.data(), buf_.size());
      if (n > 0) {
        buf_.erase(0, n);
        bytes_ += n;
        job_->stdin_total += n;
        window_ += n;
        server_.send_credit(id_, 0, n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) {
        if (!watched_) server_.watch(job_->stdin_fd, EPOLLOUT, [this](uint32_t) { write_some(); });
        watched_ = true;
        return;
      }
      // EPIPE: no process reads the job's stdin any more. Drop and close.
      close_stdin();
    }
    if (!buf_.empty()) {  // the pipe is gone: what is held is dropped
      window_ += buf_.size();
      server_.send_credit(id_, 0, buf_.size());
      buf_.clear();
    }
    if (watched_ && job_ && job_->stdin_fd >= 0) server_.unwatch(job_->stdin_fd);
    watched_ = false;
    if (!eof_) return;
    if (job_ && close_after_) close_stdin();
    // No job any more (forgotten meanwhile): its stdin is as good as closed.
    json r{{"stdin_bytes", bytes_},
           {"stdin_total", job_ ? job_->stdin_total : bytes_},
           {"stdin_closed", !job_ || job_->stdin_fd < 0}};
    abort();
    server_.finish(id_, r);  // destroys this stream
  }
  void close_stdin() {
    if (watched_ && job_->stdin_fd >= 0) server_.unwatch(job_->stdin_fd);
    watched_ = false;
    if (job_->stdin_fd >= 0) close(job_->stdin_fd);
    job_->stdin_fd = -1;
  }

  Job* job_;
  bool close_after_;
  bool eof_ = false, watched_ = false;
  std::string buf_;
  uint64_t window_ = protocol::kInitialCredit;
  uint64_t bytes_ = 0;
};

// A wait_job stream: answered by Jobs::on_exit or by its own timer.
class Jobs::Waiter : public Stream {
 public:
  Waiter(Server& server, uint32_t id, Jobs& jobs, Job& job)
      : Stream(server, id), jobs_(jobs), job_(&job) {
    job.waiters.push_back(this);
  }
  ~Waiter() override { abort(); }
  void arm(int64_t timeout_ms) {
    timer_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (timer_ < 0) throw_sys("timerfd_create");
    itimerspec its{};
    its.it_value.tv_sec = timeout_ms / 1000;
    its.it_value.tv_nsec = (timeout_ms % 1000) * 1000000;
    timerfd_settime(timer_, 0, &its, nullptr);
    server_.watch(timer_, EPOLLIN, [this](uint32_t) { answer(); });
  }
  // Sends the job as it is now and closes the stream.
  void answer() {
    if (!job_) return;
    json j = jobs_.to_json(*job_);
    abort();
    server_.finish(id_, j);
  }
  void abort() override {
    if (job_) {
      auto& w = job_->waiters;
      w.erase(std::remove(w.begin(), w.end(), this), w.end());
      job_ = nullptr;
    }
    if (timer_ >= 0) {
      server_.unwatch(timer_);
      close(timer_);
      timer_ = -1;
    }
  }

 private:
  Jobs& jobs_;
  Job* job_;
  int timer_ = -1;
};

Jobs::Jobs(Server& server) : server_(server) {}

void Jobs::drop(Job& job) {
  for (Waiter* w : std::vector<Waiter*>(job.waiters)) w->answer();
  if (job.writer) job.writer->abort();  // its stream discards the rest, then answers
}

Jobs::~Jobs() {
  for (auto& j : jobs_) {
    for (Waiter* w : std::vector<Waiter*>(j->waiters)) w->abort();
    if (j->writer) j->writer->abort();
  }
  // ProcTree's destructor kills each tree.
  jobs_.clear();
}

json Jobs::start(const ExecSpec& spec) {
  std::string id = spec.exec_id.empty() ? "job-" + std::to_string(++serial_) : spec.exec_id;
  for (auto& j : jobs_)
    if (j->exec_id == id) throw GuestError(code::exists, "exec_id " + id + " is already in use");
  if (jobs_.size() >= kMaxJobs) {
    auto done = std::find_if(jobs_.begin(), jobs_.end(), [](auto& j) { return !j->running; });
    if (done == jobs_.end())
      throw GuestError(code::internal,
                       "too many background execs (" + std::to_string(kMaxJobs) + " are running)");
    drop(**done);
    jobs_.erase(done);
  }
  auto job = std::make_unique<Job>();
  job->exec_id = id;
  job->argv = spec.argv;
  job->tree = std::make_unique<ProcTree>(server_);
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  job->started_at_ms = int64_t{now.tv_sec} * 1000 + now.tv_nsec / 1000000;
  Job* raw = job.get();
  int in[2] = {-1, -1};
  if (spec.want_stdin) {
    if (pipe2(in, O_CLOEXEC) != 0) throw_sys("pipe2");
    job->has_stdin = true;
    job->stdin_fd = in[1];
    fcntl(in[1], F_SETFL, fcntl(in[1], F_GETFL) | O_NONBLOCK);
  }
  try {
    job->tree->spawn(spec, in[0], -1, -1, [this, raw](int) { on_exit(*raw); });
  } catch (...) {
    if (in[0] >= 0) close(in[0]);
    throw;  // ~Job closes the write end
  }
  if (in[0] >= 0) close(in[0]);  // the child has it
  job->pid = job->tree->pid();
  jobs_.push_back(std::move(job));
  return to_json(*raw);
}

void Jobs::on_exit(Job& job) {
  job.running = false;
  job.outcome = job.tree->outcome();
  for (Waiter* w : std::vector<Waiter*>(job.waiters)) w->answer();
}

json Jobs::to_json(const Job& job) const {
  json j{{"exec_id", job.exec_id},
         {"argv", job.argv},
         {"pid", job.pid},
         {"background", true},
         {"started_at_ms", job.started_at_ms},
         {"running", job.running}};
  if (job.has_stdin) {
    j["stdin_bytes"] = job.stdin_total;
    j["stdin_closed"] = job.stdin_fd < 0;
  }
  if (!job.running) j.update(job.outcome);
  return j;
}

json Jobs::list() const {
  json arr = json::array();
  for (const auto& j : jobs_) arr.push_back(to_json(*j));
  return {{"jobs", arr}};
}

Jobs::Job& Jobs::find(const json& req) {
  std::string id = protocol::require_string(req, "exec_id");
  for (auto& j : jobs_)
    if (j->exec_id == id) return *j;
  throw GuestError(code::not_found, "no background exec " + id);
}

std::unique_ptr<Stream> Jobs::wait(uint32_t stream, const json& req) {
  Job& job = find(req);
  int64_t timeout_ms = protocol::optional_int(req, "timeout_ms", 0, 0, 365LL * 86400 * 1000);
  if (!job.running || timeout_ms == 0) {
    server_.finish(stream, to_json(job));
    return nullptr;
  }
  auto w = std::make_unique<Waiter>(server_, stream, *this, job);
  w->arm(timeout_ms);
  return w;
}

std::unique_ptr<Stream> Jobs::write_stdin(uint32_t stream, const json& req) {
  Job& job = find(req);
  bool close_after = protocol::optional_bool(req, "close", false);
  if (!job.has_stdin)
    throw GuestError(code::exists,
                     "background exec " + job.exec_id + " was not started with streamed stdin");
  if (job.stdin_fd < 0)
    throw GuestError(code::exists, "the stdin of " + job.exec_id + " is closed");
  if (job.writer) throw GuestError(code::exists, "another job_stdin is writing to " + job.exec_id);
  return std::make_unique<StdinWriter>(server_, stream, job, close_after);
}

json Jobs::kill(const json& req) {
  Job& job = find(req);
  int signo = static_cast<int>(protocol::optional_int(req, "signal", SIGKILL, 1, 64));
  job.tree->signal(signo, /*from_host=*/true);
  return to_json(job);
}

}  // namespace airlock::guest

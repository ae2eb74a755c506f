#include "guest/jobs.h"

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

Jobs::~Jobs() {
  for (auto& j : jobs_)
    for (Waiter* w : std::vector<Waiter*>(j->waiters)) w->abort();
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
    for (Waiter* w : std::vector<Waiter*>((*done)->waiters)) w->answer();
    jobs_.erase(done);
  }
  auto job = std::make_unique<Job>();
  job->exec_id = id;
  job->argv = spec.argv;
  job->tree = std::make_unique<ProcTree>(server_, "job-" + std::to_string(server_.next_serial()));
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  job->started_at_ms = int64_t{now.tv_sec} * 1000 + now.tv_nsec / 1000000;
  Job* raw = job.get();
  job->tree->spawn(spec, -1, -1, -1, [this, raw](int) { on_exit(*raw); });
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

json Jobs::kill(const json& req) {
  Job& job = find(req);
  int signo = static_cast<int>(protocol::optional_int(req, "signal", SIGKILL, 1, 64));
  job.tree->signal(signo, /*from_host=*/true);
  return to_json(job);
}

}  // namespace airlock::guest

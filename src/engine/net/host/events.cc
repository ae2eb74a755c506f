// The helper's event stream (docs/network.md "Event intake"): one reader
// thread per sandbox connects to run_dir/net-events.sock (peer checked),
// checks and rate-limits every report (net/intake.h) and journals the
// accepted ones; the helper itself never reaches the journal.
#include "engine/net/host/events.h"

#include <fcntl.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "common/error.h"
#include "engine/net/host/helper.h"
#include "engine/net/intake.h"

namespace airlock::engine::nethost {

namespace fs = std::filesystem;

class EventReader {
 public:
  EventReader(AuditJournal& journal, std::string id, fs::path run_dir, pid_t pid,
              EngineMetrics* metrics)
      : journal_(journal),
        metrics_(metrics),
        id_(std::move(id)),
        run_dir_(std::move(run_dir)),
        pid_(pid) {
    if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) throw_errno("pipe2");
    thread_ = std::thread([this] { run(); });
  }
  ~EventReader() {
    stop_ = true;
    char c = 1;
    (void)!::write(wake_[1], &c, 1);
    thread_.join();
    ::close(wake_[0]);
    ::close(wake_[1]);
  }
  std::atomic<uint64_t> bytes_out{0}, bytes_in{0};  // of ended flows (stats)
  EventReader(const EventReader&) = delete;
  EventReader& operator=(const EventReader&) = delete;

 private:
  // A connection to the helper's event socket, or -1. The peer must be the
  // helper process itself (SO_PEERCRED): a socket file someone else put in
  // the run dir is refused.
  int connect_checked() {
    fs::path path = run_dir_ / "net-events.sock";
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (path.string().size() >= sizeof addr.sun_path) return -1;
    std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      ::close(fd);
      return -1;
    }
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.pid != pid_) {
      if (!warned_peer_)
        spdlog::warn("sandbox {}: {} is served by pid {}, not its network helper {}: ignored", id_,
                     path.string(), cred.pid, pid_);
      warned_peer_ = true;
      ::close(fd);
      return -1;
    }
    return fd;
  }

  void append(const std::vector<net::EventIntake::Record>& records) {
    for (const auto& r : records) {
      try {
        if (metrics_) metrics_->net_event(r.event, r.fields);  // checked records only
        if (r.event == "net_flow_end") {
          auto num = [&](const char* k) {
            auto it = r.fields.find(k);
            return it != r.fields.end() && it->is_number_unsigned() ? it->get<uint64_t>() : 0;
          };
          bytes_out += num("bytes_out");
          bytes_in += num("bytes_in");
        }
        journal_.append(id_, r.event, r.fields);
      } catch (const std::exception& e) {
        spdlog::error("sandbox {}: cannot journal {}: {}", id_, r.event, e.what());
      }
    }
  }

  // Reads what `fd` has now; false at EOF/error.
  bool read_some(int fd, bool nonblocking) {
    char buf[65536];
    ssize_t n = ::recv(fd, buf, sizeof buf, nonblocking ? MSG_DONTWAIT : 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
    if (n <= 0) return false;
    append(intake_.feed(std::string_view(buf, static_cast<size_t>(n))));
    return true;
  }

  void run() {
    int fd = -1;
    bool gone = false;  // the helper is dead: nothing more will come
    while (!stop_) {
      if (fd < 0 && !gone) {
        fd = connect_checked();
        if (fd < 0 && !is_ours(pid_, run_dir_)) gone = true;
      }
      pollfd p[2] = {{wake_[0], POLLIN, 0}, {fd, POLLIN, 0}};
      int rc = ::poll(p, fd >= 0 ? 2 : 1, fd >= 0 ? 1000 : 200);
      if (stop_) break;
      if (rc > 0 && fd >= 0 && (p[1].revents & (POLLIN | POLLHUP | POLLERR)) &&
          !read_some(fd, false)) {
        // The helper exited, or a newer connection replaced this one.
        ::close(fd);
        fd = -1;
      }
      append(intake_.tick());
    }
    // Teardown killed the helper first: what it wrote before is still in
    // the socket; take it (bounded), then the final summary.
    if (fd >= 0) {
      for (int i = 0; i < 256 && read_some(fd, true);) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 0) <= 0) break;
        ++i;
      }
      ::close(fd);
    }
    append(intake_.flush());
  }

  AuditJournal& journal_;
  EngineMetrics* metrics_;  // may be null (tests)
  std::string id_;
  fs::path run_dir_;
  pid_t pid_;
  net::EventIntake intake_;
  int wake_[2] = {-1, -1};
  std::atomic<bool> stop_{false};
  bool warned_peer_ = false;
  std::thread thread_;
};

std::pair<uint64_t, uint64_t> flow_bytes(const EventReader& reader) {
  return {reader.bytes_out.load(), reader.bytes_in.load()};
}

std::shared_ptr<EventReader> attach_events(AuditJournal& journal, const std::string& id,
                                           const fs::path& run_dir, pid_t helper_pid,
                                           EngineMetrics* metrics) {
  if (helper_pid <= 0) return nullptr;
  return std::make_shared<EventReader>(journal, id, run_dir, helper_pid, metrics);
}

}  // namespace airlock::engine::nethost

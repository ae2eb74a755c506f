#include "guest/watch.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "guest/ops.h"
#include "protocol/messages.h"

namespace airlock::guest {

using nlohmann::json;
namespace code = protocol::code;

namespace {

constexpr uint32_t kMask = IN_CREATE | IN_DELETE | IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM |
                           IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR |
                           IN_DONT_FOLLOW | IN_EXCL_UNLINK;

std::string join(const std::string& dir, const std::string& name) {
  return dir == "/" ? "/" + name : dir + "/" + name;
}

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool under(const std::string& path, const std::string& dir) {
  return path == dir || (path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
                         (dir == "/" || path[dir.size()] == '/'));
}

}  // namespace

WatchBudget& agent_watch_budget() {
  static WatchBudget budget;
  return budget;
}

json WatchEvent::to_json() const {
  if (type == "overflow") return {{"type", type}, {"dropped", dropped}};
  json j = {{"type", type}, {"path", path}, {"is_dir", is_dir}};
  if (type == "renamed") j["old_path"] = old_path;
  return j;
}

Watcher::Watcher(std::string root, bool recursive, WatchBudget& budget, size_t max_queue)
    : root_(std::move(root)), recursive_(recursive), budget_(budget), max_queue_(max_queue) {
  if (budget_.watches >= budget_.max_watches)
    throw GuestError(code::no_space, "watch " + root_ + ": the sandbox already has " +
                                         std::to_string(budget_.watches) +
                                         " watches open (the limit)");
  struct stat st {};
  if (lstat(root_.c_str(), &st) != 0) throw_sys("watch " + root_);
  if (!S_ISDIR(st.st_mode))
    throw GuestError(code::not_a_directory, "watch " + root_ + ": not a directory");
  fd_ = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (fd_ < 0) throw_sys("watch " + root_ + ": inotify_init1");
  ++budget_.watches;
  try {
    add_tree(root_, /*initial=*/true, /*report=*/false);
  } catch (...) {
    release();  // the watches and the budget taken so far
    throw;
  }
}

Watcher::~Watcher() { release(); }

void Watcher::release() {
  if (fd_ < 0) return;
  budget_.dirs -= wds_.size();
  wds_.clear();
  --budget_.watches;
  close(fd_);  // drops every inotify watch with it
  fd_ = -1;
}

void Watcher::end(const char* reason, const std::string& message) {
  if (!ended_.empty()) return;
  ended_ = reason;
  ended_message_ = message;
}

bool Watcher::add_watch(const std::string& dir, bool initial) {
  if (budget_.dirs >= budget_.max_dirs) {
    std::string m = "watch " + root_ + ": cannot watch " + dir + ": " +
                    std::to_string(budget_.max_dirs) +
                    " directories are watched in this sandbox (the limit)";
    if (initial) throw GuestError(code::no_space, m);
    end("watch_limit", m);
    return false;
  }
  int wd = inotify_add_watch(fd_, dir.c_str(), kMask);
  if (wd < 0) {
    int e = errno;
    if (e == ENOSPC) {
      std::string m = "watch " + root_ + ": cannot watch " + dir +
                      ": the kernel's inotify watch limit (max_user_watches) is reached";
      if (initial) throw GuestError(code::no_space, m);
      end("watch_limit", m);
      return false;
    }
    // A subdirectory that vanished or is not accessible is skipped; the root
    // itself must be watchable.
    if (initial && dir == root_) {
      errno = e;
      throw_sys("watch " + root_);
    }
    return true;
  }
  // The same directory reached twice (a bind mount) returns the same wd.
  if (wds_.emplace(wd, dir).second) ++budget_.dirs;
  return true;
}

void Watcher::add_tree(const std::string& dir, bool initial, bool report) {
  if (!add_watch(dir, initial)) return;
  if (!recursive_ && !report) return;
  DIR* d = opendir(dir.c_str());
  if (!d) return;  // raced away: its deletion is reported by the parent
  std::vector<std::string> subdirs;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    struct stat st {};
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    bool is_dir = S_ISDIR(st.st_mode);
    if (report) push({"created", join(dir, name), "", is_dir, 0});
    if (is_dir && recursive_) subdirs.push_back(join(dir, name));
  }
  closedir(d);
  for (const auto& s : subdirs) {
    add_tree(s, initial, report);
    if (!ended_.empty()) return;
  }
}

void Watcher::remove_tree(const std::string& dir) {
  for (auto it = wds_.begin(); it != wds_.end();) {
    if (under(it->second, dir)) {
      inotify_rm_watch(fd_, it->first);
      --budget_.dirs;
      it = wds_.erase(it);
    } else {
      ++it;
    }
  }
}

void Watcher::rename_tree(const std::string& from, const std::string& to) {
  for (auto& [wd, path] : wds_)
    if (under(path, from)) path = to + path.substr(from.size());
}

void Watcher::push(WatchEvent e) {
  if (!queue_.empty()) {
    WatchEvent& last = queue_.back();
    // Repeated writes to one file are one change to a watcher.
    if (e.type == "modified" && last.type == "modified" && last.path == e.path) return;
  }
  if (queue_.size() >= max_queue_) {
    ++dropped_total_;
    if (!queue_.empty() && queue_.back().type == "overflow") {
      queue_.back().dropped++;
    } else {
      queue_.push_back({"overflow", "", "", false, 1});
    }
    return;
  }
  queue_.push_back(std::move(e));
}

void Watcher::flush_pending_move() {
  if (!move_.set) return;
  // Moved out of the watched tree: gone from the watcher's point of view.
  if (move_.is_dir) remove_tree(move_.path);
  push({"deleted", move_.path, "", move_.is_dir, 0});
  move_ = {};
}

void Watcher::handle(int wd, uint32_t mask, uint32_t cookie, const std::string& name) {
  if (mask & IN_Q_OVERFLOW) {
    flush_pending_move();
    ++dropped_total_;
    if (!queue_.empty() && queue_.back().type == "overflow")
      queue_.back().dropped++;
    else
      queue_.push_back({"overflow", "", "", false, 1});
    return;
  }
  auto it = wds_.find(wd);
  if (it == wds_.end()) return;        // a watch we already removed
  const std::string dir = it->second;  // a copy: the map changes below
  const bool is_dir = mask & IN_ISDIR;
  const std::string path = name.empty() ? dir : join(dir, name);

  if ((mask & IN_MOVED_TO) && move_.set && move_.cookie == cookie) {
    if (move_.is_dir) rename_tree(move_.path, path);
    push({"renamed", path, move_.path, is_dir, 0});
    move_ = {};
    return;
  }
  flush_pending_move();

  if (mask & IN_IGNORED) {
    if (wds_.erase(wd)) --budget_.dirs;
    if (dir == root_) end("path_deleted", "watch " + root_ + ": the directory was removed");
    return;
  }
  if (mask & IN_UNMOUNT) {
    if (dir == root_) end("unmounted", "watch " + root_ + ": its filesystem was unmounted");
    return;
  }
  if (mask & IN_DELETE_SELF) {
    if (dir == root_) end("path_deleted", "watch " + root_ + ": the directory was removed");
    return;  // the parent reports the deletion; IN_IGNORED follows
  }
  if (mask & IN_MOVE_SELF) {
    if (dir == root_) end("path_moved", "watch " + root_ + ": the directory was moved away");
    return;  // inside the tree: the parent's MOVED_FROM/TO handles it
  }
  if (mask & IN_MOVED_FROM) {
    move_ = {cookie, path, is_dir, true, now_ms()};
    return;
  }
  if (mask & (IN_CREATE | IN_MOVED_TO)) {
    push({"created", path, "", is_dir, 0});
    // A new (or moved-in) directory: watch it and report what was made in
    // it before the watch existed.
    if (is_dir && recursive_) add_tree(path, /*initial=*/false, /*report=*/true);
    return;
  }
  if (mask & IN_DELETE) {
    push({"deleted", path, "", is_dir, 0});
    return;
  }
  if (mask & (IN_MODIFY | IN_ATTRIB)) {
    // The directory itself changing (its own mode, times) is reported for
    // the root only: a subdirectory's change is already seen by its parent.
    if (name.empty() && dir != root_) return;
    push({"modified", path, "", is_dir || name.empty(), 0});
  }
}

void Watcher::read_events() {
  alignas(inotify_event) char buf[64 * 1024];
  bool again = true;
  while (again && ended_.empty()) {
    ssize_t n = read(fd_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      again = false;
      break;
    }
    for (char* p = buf; p < buf + n;) {
      auto* ev = reinterpret_cast<inotify_event*>(p);
      std::string name = ev->len ? std::string(ev->name) : std::string();
      handle(ev->wd, ev->mask, ev->cookie, name);
      p += sizeof(inotify_event) + ev->len;
    }
  }
  // Both halves of a rename are queued by one rename(2), but the reader may
  // run in between: a MOVED_FROM gets kMoveWaitMs to find its MOVED_TO.
  if (move_.set && (move_wait_ms() == 0 || !ended_.empty())) flush_pending_move();
}

int Watcher::move_wait_ms() const {
  if (!move_.set) return -1;
  return static_cast<int>(std::max<int64_t>(0, move_.since_ms + kMoveWaitMs - now_ms()));
}

// ---- the protocol stream ------------------------------------------------------

namespace {

class WatchStream : public Stream {
 public:
  WatchStream(Server& s, uint32_t id, const json& req)
      : Stream(s, id),
        w_(require_path(req), protocol::optional_bool(req, "recursive", false),
           agent_watch_budget(),
           static_cast<size_t>(protocol::optional_int(req, "max_queue", 1024, 1, 65536))) {
    timer_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (timer_ < 0) throw_sys("watch: timerfd_create");
    try {
      server_.watch(timer_, EPOLLIN, [this](uint32_t) { on_timer(); });
      server_.watch(w_.fd(), EPOLLIN, [this](uint32_t) { on_inotify(); });
    } catch (...) {
      server_.unwatch(timer_);
      close(timer_);
      throw;
    }
    watching_ = true;
  }
  ~WatchStream() override {
    abort();
    server_.unwatch(timer_);
    close(timer_);
  }

  void started(const std::string& path) {
    server_.send_json(protocol::Type::event, id_,
                      {{"watching", true}, {"path", path}, {"dirs", w_.dirs()}});
  }

  bool wants_pump() const override { return !done_ && w_.front() && fits(); }
  void pump() override { flush(); }
  void on_credit(uint8_t ch, uint32_t bytes) override {
    if (ch != 1) return;
    credit_ = std::min<uint64_t>(credit_ + bytes, UINT32_MAX);
    flush();
  }
  // The host is done: eof on channel in (or a signal frame) ends the watch.
  void on_eof(uint8_t) override { stop("cancelled"); }
  void on_signal(int) override { stop("cancelled"); }
  void on_data(uint8_t, const std::string&) override {
    fail(protocol::code::protocol_error, "a watch takes no data");
  }
  void abort() override {
    if (watching_) server_.unwatch(w_.fd());
    watching_ = false;
    done_ = true;
    // Give the watches and the budget back now, before the answer goes out
    // (the stream object itself may outlive it): a host that asks `info`
    // right after the end sees them released.
    w_.release();
  }

 private:
  // The next event's line, cached so its size can be checked against credit.
  const std::string& next_line() const {
    if (line_.empty() && w_.front())
      line_ = w_.front()->to_json().dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
    return line_;
  }
  bool fits() const { return next_line().size() <= credit_; }

  void on_timer() {
    uint64_t n;
    [[maybe_unused]] ssize_t r = read(timer_, &n, sizeof n);
    if (watching_) on_inotify();
  }

  void on_inotify() {
    w_.read_events();
    // A rename half waits for its other half: look again when its time is up.
    int wait = w_.move_wait_ms();
    if (wait >= 0) {
      itimerspec t{};
      t.it_value.tv_nsec = (wait > 0 ? wait : 1) * 1000000L;
      timerfd_settime(timer_, 0, &t, nullptr);
    }
    // Ended: stop reading (the fd stays readable, and epoll is
    // level-triggered), then send what is queued as credit allows.
    if (!w_.ended().empty() && watching_) {
      server_.unwatch(w_.fd());
      watching_ = false;
    }
    flush();
  }

  // Sends whole lines while credit lasts, up to one frame per call so a busy
  // watch does not monopolise the port.
  void flush() {
    if (done_) return;
    while (!server_.congested() && w_.front() && fits()) {
      std::string batch;
      while (w_.front() && fits() && batch.size() + next_line().size() <= protocol::kMaxPayload) {
        batch += line_;
        credit_ -= line_.size();
        ++events_;
        line_.clear();
        w_.pop();
      }
      if (batch.empty()) break;
      server_.send_data(id_, 1, batch.data(), batch.size());
    }
    if (!w_.ended().empty() && !w_.front()) {
      // The watch cannot go on (its directory went away, a cap): what was
      // queued has been sent; the response says why it ended.
      if (watching_) server_.unwatch(w_.fd());
      watching_ = false;
      stop(w_.ended().c_str());
    }
  }

  void stop(const char* reason) {
    if (done_) return;
    json r = {{"reason", reason},
              {"events", events_},
              {"dropped", w_.dropped_total()},
              {"queued", w_.queued()}};
    if (!w_.ended_message().empty() && w_.ended() == reason) r["message"] = w_.ended_message();
    abort();
    server_.finish(id_, r);
  }

  Watcher w_;
  int timer_ = -1;
  bool watching_ = false;
  bool done_ = false;
  uint64_t credit_ = protocol::kInitialCredit;
  uint64_t events_ = 0;
  mutable std::string line_;
};

}  // namespace

std::unique_ptr<Stream> start_watch(Server& server, uint32_t id, const json& req) {
  auto s = std::make_unique<WatchStream>(server, id, req);
  s->started(require_path(req));
  return s;
}

json watch_info() {
  const WatchBudget& b = agent_watch_budget();
  return {{"watches", b.watches},
          {"watched_dirs", b.dirs},
          {"max_watches", b.max_watches},
          {"max_watched_dirs", b.max_dirs}};
}

}  // namespace airlock::guest

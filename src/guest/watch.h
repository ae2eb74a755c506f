// File watching in the guest (api/guest-protocol.md §5 "watch"): inotify on
// a directory (and, if recursive, every directory below it), turned into
// created / modified / deleted / renamed events in a bounded queue.
//
//   WatchBudget budget;                         // one per agent: caps all watches
//   Watcher w("/work", true, budget);           // throws GuestError (not_found, ...)
//   server.watch(w.fd(), EPOLLIN, ...);         // readable -> w.read_events()
//   while (auto* e = w.front()) { send(e->to_json()); w.pop(); }
//
// Bounded: the queue holds at most `max_queue` events; beyond that events
// are dropped and counted in one `overflow` entry at the queue's end (so the
// consumer sees where the gap is). The kernel's own queue overflowing
// (IN_Q_OVERFLOW: it does not say how many) counts as one dropped event.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

namespace airlock::guest {

// Caps shared by every watch of one agent (the sandbox): concurrent watch
// streams and inotify watches (= watched directories) in total.
struct WatchBudget {
  size_t max_watches = 16;
  size_t max_dirs = 8192;
  size_t watches = 0;  // open watch streams
  size_t dirs = 0;     // inotify watches held by them
};
// The agent's budget (server-wide; op "info" reports it).
WatchBudget& agent_watch_budget();

struct WatchEvent {
  std::string type;  // created | modified | deleted | renamed | overflow
  std::string path;
  std::string old_path;  // renamed only
  bool is_dir = false;
  uint64_t dropped = 0;  // overflow only
  nlohmann::json to_json() const;
};

class Watcher {
 public:
  // Watches `root` (absolute, a directory). Throws GuestError: not_found,
  // not_a_directory, permission_denied, no_space (a cap of the budget or the
  // kernel's max_user_watches reached). Nothing is held after a throw.
  Watcher(std::string root, bool recursive, WatchBudget& budget, size_t max_queue = 1024);
  ~Watcher();
  Watcher(const Watcher&) = delete;
  Watcher& operator=(const Watcher&) = delete;

  int fd() const { return fd_; }
  // Closes the inotify fd and gives the watches back to the budget (also
  // done by the destructor; idempotent).
  void release();
  // Reads everything the kernel has queued (non-blocking) into the queue.
  void read_events();
  // A rename's IN_MOVED_FROM waits up to this long for its IN_MOVED_TO (the
  // reader may wake between the two); then it is a `deleted`. While one
  // waits, move_wait_ms() is the time left (call read_events() after it),
  // else -1.
  static constexpr int kMoveWaitMs = 20;
  int move_wait_ms() const;
  const WatchEvent* front() const { return queue_.empty() ? nullptr : &queue_.front(); }
  void pop() { queue_.pop_front(); }
  size_t queued() const { return queue_.size(); }
  size_t dirs() const { return wds_.size(); }
  uint64_t dropped_total() const { return dropped_total_; }
  // Set once the watch cannot go on: "path_deleted", "path_moved",
  // "unmounted" (the root itself), or "watch_limit" (a new subdirectory could
  // not be watched: the budget or the kernel's limit). Empty while fine.
  const std::string& ended() const { return ended_; }
  const std::string& ended_message() const { return ended_message_; }

 private:
  struct PendingMove {
    uint32_t cookie = 0;
    std::string path;
    bool is_dir = false;
    bool set = false;
    int64_t since_ms = 0;  // steady clock
  };
  // Adds a watch for `dir`; false (and ended_ = watch_limit) when a cap is
  // hit. Throws GuestError for other failures when `initial`.
  bool add_watch(const std::string& dir, bool initial);
  // Watches `dir` and (recursive) every directory below it. With `report`,
  // every entry found is queued as `created` (a new directory's contents may
  // have been made before its watch existed).
  void add_tree(const std::string& dir, bool initial, bool report);
  void remove_tree(const std::string& dir);
  void rename_tree(const std::string& from, const std::string& to);
  void handle(int wd, uint32_t mask, uint32_t cookie, const std::string& name);
  void flush_pending_move();
  void push(WatchEvent e);
  void end(const char* reason, const std::string& message);

  std::string root_;
  bool recursive_;
  WatchBudget& budget_;
  size_t max_queue_;
  int fd_ = -1;
  std::map<int, std::string> wds_;  // inotify watch -> directory path
  std::deque<WatchEvent> queue_;
  PendingMove move_;
  uint64_t dropped_total_ = 0;
  std::string ended_, ended_message_;
};

}  // namespace airlock::guest

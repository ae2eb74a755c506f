// Running a parser of guest-written bytes (the ext4 diff walker, qemu-img,
// e2fsck, diff) in airlock-confine: a separate, freshly executed helper, never
// a fork of the multi-threaded daemon.
//
// The daemon side (this file) starts airlock-confine with fork + immediate
// execve: only the descriptors a Spec names survive (as 3, 4, ... in order;
// stdin /dev/null, stdout and stderr pipes), a clean environment, its own
// process group, and a wall-clock deadline after which the whole group is
// killed. The helper (lockdown.cc, main.cc) then, before touching a byte:
// sets rlimits (AS, CPU, FSIZE, NOFILE, NPROC, CORE 0), drops every
// capability and becomes the Scratch's leased unprivileged uid/gid, sets
// no_new_privs and installs a seccomp filter (walk: an allowlist that opens
// nothing; exec: no network, ptrace, mount, namespaces, modules, ... and one
// execve, the tool's).
//
// Files reach the helper as descriptors (its uid could not open a
// sandbox's disk or walk the daemon's 0700 data directory by name): a tool
// names them /proc/self/fd/N, and a directory descriptor /proc/self/fd/N/x.
// A named file the uid cannot read gets one POSIX ACL entry for that uid
// (exclusive to this Scratch) for as long as the Scratch lives.
//
//   confine::Scratch s(tmp_dir);               // dir owned by the leased uid
//   std::string in = s.give(disk_path);        // "/proc/self/fd/3"
//   std::string out = s.give_dir() + "/x.raw"; // "/proc/self/fd/4/x.raw"
//   auto r = confine::run(s.exec({"qemu-img", "convert", "-O", "raw", in, out}, "qemu-img"));
//   r.check();                                  // Error naming qemu-img
//   fs::path produced = s.dir() / "x.raw";      // after s.reclaim(): root's again
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/unique_fd.h"

namespace airlock::engine::confine {

struct Limits {
  uint64_t memory_bytes = 4ull << 30;  // RLIMIT_AS
  int cpu_seconds = 600;               // RLIMIT_CPU
  uint64_t file_bytes = 256ull << 30;  // RLIMIT_FSIZE: the largest file it may write
  int open_files = 256;                // RLIMIT_NOFILE
  int processes = 256;                 // RLIMIT_NPROC (threads count; the uid is its own)
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};  // wall clock
  size_t max_output = 1 << 20;  // stdout bytes kept (beyond: failure)
};

struct Spec {
  std::string mode;               // "walk", "exec" or "import" (storage::import_oci)
  std::string what;               // names the tool in errors ("qemu-img")
  std::vector<std::string> argv;  // exec: the tool (looked up in PATH) and its arguments
  nlohmann::json args;            // walk: the walker's arguments
  std::vector<int> fds;           // become 3, 4, ... in the helper (not closed here)
  int64_t uid = -1, gid = -1;     // -1: keep the caller's (not root)
  Limits limits;
};

struct Result {
  std::string what;
  int exit_code = -1;
  int term_signal = 0;
  bool timed_out = false;
  bool out_truncated = false;
  std::string out, err;

  bool ok() const { return exit_code == 0 && !timed_out && !out_truncated; }
  // "qemu-img exited with status 1: <stderr tail>", "... was killed at its
  // 600 s deadline", "... was killed by signal 9 (over its memory or CPU
  // limit, or crashed)".
  std::string describe() const;
  // Throws Error(unavailable, describe()) unless ok().
  const Result& check() const;
};

// The helper binary: $AIRLOCK_CONFINE, else airlock-confine beside this
// executable or in its sibling bin/. Error(unavailable) if there is none.
std::filesystem::path helper_binary();

// Starts the helper on `spec` and waits (at most spec.limits.timeout).
// Throws only if it cannot be started at all.
Result run(const Spec& spec);

// A working directory for one confined job, owned by a leased unprivileged
// uid (as root; otherwise by the caller), and the descriptors handed to it.
class Scratch {
 public:
  explicit Scratch(const std::filesystem::path& parent);
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  const std::filesystem::path& dir() const { return dir_; }
  int64_t uid() const { return uid_; }

  // Opens `file` (read-only, O_NOFOLLOW; write too if `writable`), makes it
  // readable (writable) by the uid if it is not (an ACL entry, undone in
  // ~Scratch) and returns the name the helper sees it by.
  std::string give(const std::filesystem::path& file, bool writable = false);
  // An already-open descriptor (dup'ed): its /proc/self/fd name.
  std::string give_fd(int fd);
  // A qemu-img "json:{...}" spec (storage::image_opts) with every file it
  // names given (give) and renamed to its descriptor.
  std::string give_image_opts(const std::string& spec);
  // The scratch directory itself: "/proc/self/fd/N".
  std::string give_dir();

  // Closes the descriptors given so far (the next tool gets only its own;
  // the grants stay until ~Scratch). The next give() is /proc/self/fd/3.
  void forget();
  // An exec Spec with the descriptors given so far (3, 4, ...) and the uid.
  Spec exec(std::vector<std::string> argv, std::string what, Limits limits = {}) const;

  // Back to root: the directory and what the helper left in it (after the
  // helper is gone, so nothing of the uid can swap a name afterwards).
  void reclaim();

 private:
  struct Grant {
    UniqueFd fd;
    dev_t dev;
    ino_t ino;
  };
  std::filesystem::path dir_;
  int64_t uid_ = -1;
  std::vector<UniqueFd> fds_;
  std::vector<Grant> grants_;
};

}  // namespace airlock::engine::confine

// Small /proc helpers for processes airlock starts detached (QEMU, the
// network helper): they are not the daemon's children, so liveness and
// identity are read from /proc, never assumed from a pid alone.
//
//   if (proc_state(pid) != 0 && cmdline_has_arg(pid, run_dir / "qemu.pid")) ... // ours
//   ::kill(pid, SIGKILL); wait_gone(pid, 5s);
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace airlock {

// The absolute path of `binary` in PATH (as given if it has a '/'; PATH
// unset: /usr/local/bin:/usr/bin:/bin), nullopt if no executable is found.
// Resolved before a fork: execvp's own search allocates, which is not safe
// in the child of a threaded process.
std::optional<std::string> find_in_path(const std::string& binary);

// Up to `cap` bytes of a file; "" if it cannot be read. Never follows a
// symlink at the last component and reads only regular files (no FIFO can
// block it): run directories are writable by the jail, which may plant a
// link to a host file or a FIFO under any name there.
std::string read_file_capped(const std::filesystem::path& path, size_t cap);

// Opens `path` for reading like read_file_capped does (O_NOFOLLOW, regular
// files only, no blocking open); -1 with errno otherwise (ELOOP for a link,
// EINVAL for anything but a regular file).
int open_regular_nofollow(const std::filesystem::path& path);

// Creates `path` afresh for writing (O_WRONLY, plus `extra_flags` such as
// O_APPEND), replacing whatever had that name without following it:
// unlink, then O_CREAT|O_EXCL|O_NOFOLLOW. -1 with errno on failure.
int create_file_nofollow(const std::filesystem::path& path, mode_t mode, int extra_flags = 0);

// State letter from /proc/<pid>/stat ('R', 'S', 'Z' zombie, ...); 0 if gone.
char proc_state(pid_t pid);

// The process's argv from /proc/<pid>/cmdline (empty if gone).
std::vector<std::string> proc_cmdline(pid_t pid);

// True if `pid` is alive (not a zombie) and one of its arguments equals
// `arg` exactly: the pid-reuse guard for processes we started.
bool alive_with_arg(pid_t pid, const std::string& arg);

// Live (not zombie) processes whose command line contains every one of
// `needles` as a substring; for tests and leftover checks.
std::vector<pid_t> find_processes(const std::vector<std::string>& needles);

// Waits until `pid` has exited. A detached process is not our child unless
// this process is a child subreaper (then we must reap it); otherwise init
// reaps it, and someone else's zombie counts as gone once no thread of it is
// left but its leader (until then its files, and their locks, are held).
// Returns false if it is still running after `timeout`.
bool wait_gone(pid_t pid, std::chrono::milliseconds timeout);

}  // namespace airlock

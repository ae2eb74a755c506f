// What airlock-confine gives up before it touches a guest-written byte
// (confine.h has the whole picture; docs/design.md why each limit).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>

namespace airlock::engine::confine {

// rlimits from the Spec's "limits" (AS, CPU, FSIZE, NOFILE, NPROC; CORE 0).
void set_limits(const nlohmann::json& limits);

// Every capability (bounding set included) gone, the supplementary groups
// gone, then uid/gid `uid` (if >= 0: needs root), then no_new_privs.
void drop_identity(int64_t uid, int64_t gid);

// The walker's filter: an allowlist of reading, writing to its pipe,
// memory and exiting. Nothing that opens a file or a socket, executes,
// traces or signals another process.
void seal_walker();

// The tool runner's filter: everything but the listed families (sockets,
// ptrace and other processes' memory, mount and namespaces, modules, bpf,
// keyrings, new sessions/process groups, io_uring, ...), and execve only
// of `path` (this very pointer, the one exec about to happen).
void seal_tool(const char* path);

// The importer's filter: the tool runner's, and no execve at all.
void seal_importer();

// Landlock: from now on this process reaches by name only what is below
// `dir` (no exec, no device nodes or sockets made there) and, read-only,
// the file `file` (if >= 0). Descriptors already open stay usable. False
// when the kernel has no Landlock (the uid and seccomp still hold).
bool restrict_paths(int dir, int file);

}  // namespace airlock::engine::confine

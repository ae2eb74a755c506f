// Filesystem diff of two disk layer chains, read on the host with libext2fs
// (never by asking the guest what it changed).
//
// A LayerChain is a qcow2 chain, given to qemu-img file by file (the caller
// checked it: storage/disk_chain.h), or a raw ext4 image. Each chain is made
// readable by libext2fs by `qemu-img convert -O raw` into a sparse temporary
// file (a raw image is opened as is), then both trees are walked and
// compared: paths added, deleted, and modified (type, size, mode, owner,
// symlink target, or content, compared byte for byte).
//
//   auto r = fsdiff::diff({sandbox_base, "raw"}, {disk_qcow2, "qcow2"}, tmp_dir, {.content =
//   true});
//   // {"changes": [{"path": "/root/a", "change": "added", "type": "file", "size": 3,
//   //               "mode": "0644", "diff": "--- /dev/null\n+++ b/root/a\n..."}], ...}
//
// The filesystem is hostile input (the guest wrote every byte of it): the
// work is bounded (Limits), symlinks are data (never followed, never
// resolved on the host), names with '/' or NUL are skipped and counted, and
// qemu-img, the walk and each content diff run in airlock-confine
// (engine/confine/confine.h: a fresh process under an unprivileged uid,
// seccomp, memory/CPU limits and a deadline), so a corrupt filesystem that
// trips libext2fs costs an error, never the daemon.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

namespace airlock::engine::fsdiff {

struct LayerChain {
  std::filesystem::path top;
  std::string format;  // "raw" or "qcow2"
  // qcow2: what qemu-img opens, a spec naming every file of the chain
  // (storage::image_opts), so no backing name in a header is followed.
  std::string qemu_source;
};

struct Limits {
  uint64_t max_entries = 1'000'000;  // inodes walked per filesystem
  int max_depth = 256;
  uint64_t max_changes = 100'000;              // reported; beyond: truncated
  uint64_t max_content_bytes = 256 * 1024;     // a file larger is not diffed
  uint64_t max_diff_bytes = 64 * 1024;         // one file's diff text
  uint64_t max_total_diff_bytes = 4ull << 20;  // all diffs together
  uint64_t child_memory_bytes = 2ull << 30;    // RLIMIT_AS of the walker
  int child_cpu_seconds = 300;
};

struct Options {
  bool content = false;  // unified diffs of text files
  Limits limits;
};

// The changes from `before` to `after`: {"changes": [...], "truncated",
// "summary": {"added","modified","deleted"}, "skipped_names", "timing_ms":
// {"materialize","walk"}}. Each change: path, change
// (added|modified|deleted), type (file|dir|symlink|other), size, mode
// ("0644"), uid, gid, target (symlinks); modified ones also "before" {type,
// size, mode, uid, gid, target} and "what" (["content","mode",...]); with
// content, text files get "diff" (unified), binary ones "binary": true, and
// larger ones "diff_skipped": "too large". Temporary raw files go in
// `tmp_dir` (removed before returning). Error(unavailable) if a layer cannot
// be converted or read as ext4 (naming which), Error(internal) if the walker
// died.
nlohmann::json diff(const LayerChain& before, const LayerChain& after,
                    const std::filesystem::path& tmp_dir, const Options& options);

// The walker as airlock-confine runs it: two raw ext4 images open on
// `before_fd`/`after_fd` (nothing is opened by name); text changes carry
// their two sides hex-encoded in "_old"/"_new" for diff() to diff.
nlohmann::json walk_fds(int before_fd, int after_fd, const Options& options);

// Options as diff() sends them to the walker ({"content", "limits": {...}}).
Options options_from_json(const nlohmann::json& args);

}  // namespace airlock::engine::fsdiff

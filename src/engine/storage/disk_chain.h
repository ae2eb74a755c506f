// The backing chain of a qcow2 disk, read by airlock itself from the qcow2
// headers, before any qemu-img or QEMU opens the file.
//
// A sandbox's overlay is writable by its jailed QEMU, so its header is not
// the host's word: a QEMU that escaped the guest can rewrite the backing
// name to /etc/shadow or to another sandbox's disk, and every host tool that
// opens the chain by its headers (qemu-img info/convert, QEMU at the next
// boot) would then read that file. So every host reader first takes the
// chain from here, which refuses a link outside `roots` (the image,
// template and snapshot directories), a symlink, a loop, an external data
// file, an unknown format or a chain deeper than 16, and then hands the
// chain to qemu-img explicitly (image_opts), so qemu-img never resolves a
// backing name itself.
//
//   auto chain = disk_chain(run_dir / "disk.qcow2", {image_dir, snap_root}, "sandbox sb-1's disk");
//   run_command({"qemu-img", "convert", "--image-opts", image_opts(chain), "-O", "raw", out});
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace airlock::storage {

struct ChainLink {
  std::filesystem::path path;  // absolute, normalised
  std::string format;          // "qcow2" or "raw"
  uint64_t virtual_size = 0;   // qcow2: from its header; raw: the file's size
};

// `top` first, then each backing file. `top` may be anywhere (the caller
// chose it); each backing file must be a regular file (not a symlink, no
// symlink in its resolved path leading out) under one of `roots`. Throws
// Error(unavailable) naming `what` and the offending backing name.
std::vector<ChainLink> disk_chain(const std::filesystem::path& top,
                                  const std::vector<std::filesystem::path>& roots,
                                  const std::string& what);

// A qemu-img --image-opts string that opens `chain` exactly (every link's
// driver and file named, the last link's backing set to none), so no
// header's backing name is followed. force_share: open a disk a running
// QEMU holds locked (read only).
std::string image_opts(const std::vector<ChainLink>& chain, bool force_share = false);

// True if `p` (absolute, normalised, symlinks resolved where they exist) is
// inside `dir`.
bool path_inside(const std::filesystem::path& p, const std::filesystem::path& dir);

}  // namespace airlock::storage

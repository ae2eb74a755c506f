// The boot header of a Linux bzImage, for QEMUs that restore a saved guest
// instead of booting one.
//
// QEMU's `-kernel` copies the whole kernel payload (and `-initrd` the whole
// initrd) into fw_cfg buffers at start-up and keeps them for the life of the
// process: 13.5 MiB plus 5.3 MiB of private memory per QEMU with Debian's
// cloud kernel. A restored guest never reads them again (a reboot ends
// QEMU: -no-reboot), but `-kernel` must still be given, because it adds the
// linuxboot option ROM, a RAM block the saved state names. The header alone
// gives the same ROM and machine; the payload is cut to a page.
//
//   fs::path k = write_kernel_head(img.kernel, run_dir / "kernel.head");
//   if (k.empty()) k = img.kernel;  // not a bzImage: pass it whole
#pragma once

#include <filesystem>
#include <string>

namespace airlock::vmm {

// Bytes of the payload kept after the setup sectors: QEMU copies a payload
// of any length; one page keeps it a plausible kernel.
inline constexpr size_t kKernelHeadPayload = 4096;

// The first (setup sectors + kKernelHeadPayload) bytes of `bzimage`, or ""
// if it is not a bzImage (no "HdrS" boot header) or cannot be read.
std::string kernel_head(const std::filesystem::path& bzimage);

// kernel_head(bzimage) written to `dest`, created afresh without following
// a link (dest is in a run directory the jail can write). Returns dest, or
// an empty path if `bzimage` has no boot header; throws Error if `dest`
// cannot be written.
std::filesystem::path write_kernel_head(const std::filesystem::path& bzimage,
                                        const std::filesystem::path& dest);

}  // namespace airlock::vmm

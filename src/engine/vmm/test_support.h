// Helpers for the VMM tests: a real guest kernel and tiny busybox initramfs
// images built at run time, so the tests boot real QEMU without the project's
// image pipeline.
//
//   fs::path k = test_kernel();                       // env or download cache
//   fs::path i = test_initramfs("echo MARK; poweroff -f");
#pragma once

#include <filesystem>
#include <string>

namespace airlock::vmm::testing {

// AIRLOCK_TEST_KERNEL if set, else a Debian cloud kernel downloaded once into
// the build tree (testdata/fetch_kernel.sh). Throws Error if unavailable.
std::filesystem::path test_kernel();

// A gzip'd newc cpio with busybox-static and an /init running `script` under
// busybox sh (with /proc mounted). Cached by content in the temp dir.
std::filesystem::path test_initramfs(const std::string& script);

// A fresh empty qcow2 file (the VM needs a disk; the test guests ignore it).
std::filesystem::path test_disk(const std::filesystem::path& dir);

// A fresh private directory under /tmp (short: unix socket paths are limited).
std::filesystem::path make_temp_dir(const std::string& prefix);

}  // namespace airlock::vmm::testing

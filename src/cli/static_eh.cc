// Linked into the `airlock` CLI only when it is fully static (-static; see
// src/cli/CMakeLists.txt), with -Wl,--wrap for the two functions below and
// -Wl,--eh-frame-hdr.
//
// Why: for a -static link GCC uses crtbeginT.o, which registers the
// program's .eh_frame with libgcc's unwinder (__register_frame_info). The
// first exception thrown then makes libgcc count and sort every FDE of the
// 40 MB binary: 8 ms and ~100 page faults on `airlock --version` or any
// usage or daemon error (CLI11 reports --help/--version by throwing). With
// the registration skipped, the unwinder finds FDEs as in a dynamic program:
// dl_iterate_phdr (static glibc reports the executable) and the binary
// search table of PT_GNU_EH_FRAME, which --eh-frame-hdr makes the linker
// emit for a static link too. tests/integration/test_cli*.py throw through
// this path on every usage error.
extern "C" {
void __wrap___register_frame_info(const void*, void*) {}
void* __wrap___deregister_frame_info(const void*) { return nullptr; }
}

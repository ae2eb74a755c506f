# OpenSSL and libarchive, shared by default and static for the targets that
# set the AIRLOCK_STATIC_DEPS property (the `airlock` CLI); and whether glibc
# itself can be linked statically (AIRLOCK_HAVE_STATIC_LIBC, at the end).
#
# Why: the CLI is started once per agent call, and its start-up was mostly
# the dynamic loader mapping and relocating libcrypto, libssl, libarchive,
# libxml2 and ICU (20 shared objects; `airlock --version` 13 ms of CPU over
# `true`'s). Linked statically and without PIE it is ~3 ms (bench/start.py,
# "cli overhead"), and with glibc static too ~1.7 ms. Everything else (airlockd, the tests) keeps the shared
# libraries: one copy of each on disk, and faster links.
#
# Link against airlock_dep_crypto / airlock_dep_ssl / airlock_dep_archive
# instead of OpenSSL::Crypto / OpenSSL::SSL / LibArchive::LibArchive. The
# choice is made per final executable: $<TARGET_PROPERTY:...> in an
# INTERFACE_LINK_LIBRARIES is evaluated on the target being linked. If a
# static archive is missing, the shared libraries are used.
find_package(OpenSSL REQUIRED)
find_package(LibArchive REQUIRED)

define_property(TARGET PROPERTY AIRLOCK_STATIC_DEPS
                BRIEF_DOCS "Link OpenSSL and libarchive statically"
                FULL_DOCS "See cmake/static_deps.cmake")

# libarchive.a's own dependencies, as Debian builds it (its format table
# pulls in the xar writer, hence libxml2 and ICU).
set(_airlock_static_names ssl crypto archive xml2 icuuc icudata nettle lzma bz2 z)
set(AIRLOCK_HAVE_STATIC_DEPS ON)
foreach(_n IN LISTS _airlock_static_names)
  find_library(AIRLOCK_STATIC_${_n} NAMES lib${_n}.a)
  if(NOT AIRLOCK_STATIC_${_n})
    set(AIRLOCK_HAVE_STATIC_DEPS OFF)
  endif()
endforeach()
if(NOT AIRLOCK_HAVE_STATIC_DEPS)
  message(STATUS "static OpenSSL/libarchive archives missing: the CLI links them shared")
endif()

set(_static "$<AND:$<BOOL:${AIRLOCK_HAVE_STATIC_DEPS}>,$<BOOL:$<TARGET_PROPERTY:AIRLOCK_STATIC_DEPS>>>")

add_library(airlock_dep_crypto INTERFACE)
target_link_libraries(airlock_dep_crypto INTERFACE
  "$<IF:${_static},${AIRLOCK_STATIC_crypto};Threads::Threads;${CMAKE_DL_LIBS},OpenSSL::Crypto>")
add_library(airlock_dep_ssl INTERFACE)
target_link_libraries(airlock_dep_ssl INTERFACE
  "$<IF:${_static},${AIRLOCK_STATIC_ssl},OpenSSL::SSL>" airlock_dep_crypto)
add_library(airlock_dep_archive INTERFACE)
target_link_libraries(airlock_dep_archive INTERFACE
  "$<IF:${_static},${AIRLOCK_STATIC_archive};${AIRLOCK_STATIC_xml2};${AIRLOCK_STATIC_icuuc};${AIRLOCK_STATIC_icudata};${AIRLOCK_STATIC_nettle};${AIRLOCK_STATIC_lzma};${AIRLOCK_STATIC_bz2};${AIRLOCK_STATIC_z},LibArchive::LibArchive>")

# A fully static CLI (glibc too: no dynamic loader, no libc.so/libm.so to map
# and bind) if glibc's static archives link here; otherwise all but libc.
# Measured on the development machine (a VM where a page fault costs
# ~10-15 us of CPU): `airlock ls` 133 -> 99 page faults, 5.5 -> 3.7 ms of
# CPU (perf stat). glibc warns at link time that getpwuid (daemon paths,
# with no $HOME), getaddrinfo (AIRLOCK_URL) and OpenSSL's dlopen need its
# shared NSS modules of the same version at run time: the "files" and
# "dns" sources are built into static glibc, so /etc/passwd, /etc/hosts and
# DNS work without them.
include(CheckCXXSourceCompiles)
set(CMAKE_REQUIRED_LINK_OPTIONS -static)
check_cxx_source_compiles("int main() { return 0; }" AIRLOCK_HAVE_STATIC_LIBC)
unset(CMAKE_REQUIRED_LINK_OPTIONS)


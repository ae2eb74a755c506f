// One QEMU process per sandbox.
//
// QEMU is started detached (own session, not a child that dies with the
// daemon) with no default devices and no display:
//   - virtio-blk root from the sandbox's qcow2 overlay
//   - a virtio-serial port named "airlock.0" whose host end is the unix
//     socket agent_socket(): the guest agent's channel
//   - virtio-rng
//   - the serial console on a unix socket, copied by a thread of this object
//     into console.log, capped at console_cap_bytes (older half dropped)
//   - QMP on a unix socket (qmp.sock) for control
// QEMU starts paused (-S) and is resumed once the console is attached, so
// no boot output is lost. Everything of the VM lives in run_dir:
//   agent.sock, console.sock, qmp.sock   QEMU's sockets (servers, one client each)
//   qemu.pid                             -pidfile; also how adopt() recognises
//                                        its QEMU (/proc/<pid>/cmdline names it)
//   console.log, console.log.old         the console, together <= console_cap_bytes
//   qemu.log                             QEMU's stdout/stderr (diagnostics)
// Machine `pc`: measured under TCG it boots as fast as `microvm` (median to
// init 2.2 s vs 2.1 s) and never hung, where microvm hung in 4 of 10 boots
// (and was slower, 2.5 s, with tsc_early_khz= which avoids the hang).
// QEMU runs with -sandbox on (spawn=deny): it cannot exec helpers, so
// migration must target file:/fd: URIs, not exec:.
//
// A start failure (bad path, QEMU error) throws Error naming the cause,
// including QEMU's own stderr, after killing QEMU and removing every file
// start() created. Bounded waits everywhere: QMP 10 s, kill 5 s.
//
//   VmConfig cfg{.id = id, .run_dir = dir, .kernel = img.kernel, ...};
//   auto vm = Vm::start(cfg);      // throws Error on failure, nothing left behind
//   GuestChannel::connect(vm->agent_socket(), ...);
//   vm->kill();                    // SIGKILL, reap, sockets removed
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/vmm/ram_split.h"

namespace airlock::vmm {

enum class Accel { kvm, tcg };
const char* to_string(Accel accel);

// Default TCG translation-cache cap (MiB); bench/tcg_cache.py measures the trade-off.
inline constexpr int kDefaultTcgTbSizeMb = 128;

struct VmConfig {
  std::string id;
  std::filesystem::path run_dir;  // exists; sockets, logs, pid file go here
  std::filesystem::path kernel;
  std::filesystem::path initrd;
  std::filesystem::path disk;  // qcow2 overlay
  // Where the disk's backing files may be (storage/disk_chain.h): a chain
  // leaving them is refused before QEMU starts. Empty = anywhere (the
  // VMM's own tests); the engine always sets it.
  std::vector<std::filesystem::path> disk_roots;
  std::string extra_kernel_args;
  int cpus = 1;
  int memory_mb = 256;
  Accel accel = Accel::tcg;
  // TCG only: the translation cache in MiB (`-accel tcg,tb-size=N`). QEMU
  // 7.2's default is 1 GiB and it fills with the code the guest runs, so an
  // uncapped apt or python run takes QEMU far past guest RAM. The
  // jail's memory limit counts it. 0 = QEMU's default (uncapped, for benches).
  int tcg_tb_size_mb = kDefaultTcgTbSizeMb;
  // The jail cgroup's cpu weight from the start (CgroupLimits::cpu_weight;
  // 0 = the default): a warm-pool member's is low until Vm::set_cpu_weight.
  int cpu_weight = 0;
  size_t console_cap_bytes = 1 << 20;  // >= 4096
  std::string qemu_binary = "qemu-system-x86_64";
  // Network (optional): when net_socket is set, the VM gets one virtio-net
  // NIC whose backend is a `-netdev stream` client of this unix socket (the
  // airlock-net helper listens there; QEMU connects once at start and does
  // not reconnect). Empty = no NIC at all. net_mac "52:54:00:xx:xx:xx"
  // (default: QEMU's own).
  std::filesystem::path net_socket;
  std::string net_mac;
  // Templates (docs/design.md, "Templates and clones"). When memory_file is
  // set, guest RAM is a memory-backend-file on it (it belongs on tmpfs so
  // its pages are page-cache pages every mapper can share). memory_shared:
  // MAP_SHARED, the file IS the RAM (a template being made); otherwise
  // MAP_PRIVATE: a clone reads the template's pages and copies only the ones
  // it writes.
  std::filesystem::path memory_file;
  bool memory_shared = false;
  // Clones (memory_shared false): the template's RAM as a write-sealed memfd
  // (sealed_ram.h), required. QEMU maps it privately through
  // /proc/self/fd/<jail's kInheritedFd>; memory_file only names the
  // template and is never given to QEMU, so a clone cannot write it.
  int memory_fd = -1;
  // Clones: QEMU starts with `-incoming defer` and start() loads this device
  // state (written by save_state) before resuming. The argv must describe
  // the same machine as the template's (cpus, memory, devices).
  std::filesystem::path incoming_state;
  // Pause/resume, memory snapshots and forks (docs/design.md, "Snapshots,
  // fork, pause"): incoming_state is a FULL state written by save_memory()
  // (RAM included), loaded into this VM's own anonymous RAM; no
  // memory_file. ram_block names the source's RAM block so the stream
  // matches: "" = plain `-m` (a cold-booted source), "ram0" = a
  // memory-backend (a source that was a template clone).
  // Forks (a split state, ram_split.h): incoming_full with memory_fd set and
  // no memory_file: the main RAM block is that sealed memfd mapped
  // privately under the source's block id (ram_block_id(ram_block)), and
  // incoming_state is the stream without its pages.
  bool incoming_full = false;
  std::string ram_block;
  // The jail (jail.h): QEMU gets its own uid, namespaces, root, cgroup and
  // rlimits, as far as this host allows (all of it as root). Its root holds
  // QEMU's own files, kernel, initrd, the disk's backing chain, run_dir,
  // net_socket, memory_file (read-write only if memory_shared) and these.
  bool jail = true;
  std::vector<std::filesystem::path> extra_ro;
  std::vector<std::filesystem::path> extra_rw;
};

// A gid reserved just below the jail's uid range (checked with it against
// /etc/subgid and group at start); template RAM files are no longer shared
// through it (clones map a sealed memfd), the reservation stays.
// Just below the jail's default id range (jail_ids.h), checked with it
// against /etc/subgid and group at start.
inline constexpr gid_t kTemplateRamGid = 2099999999;

class Vm {
 public:
  // Starts QEMU; returns once it runs (resumed) with console capture attached.
  static std::unique_ptr<Vm> start(const VmConfig& config);
  // Re-attaches to a QEMU started earlier (e.g. by a previous daemon) if the
  // pid still belongs to this VM; returns nullptr if it is gone. Console
  // capture resumes (appending); if the console socket cannot be reattached
  // within 2 s the VM is adopted anyway, without capture.
  static std::unique_ptr<Vm> adopt(const VmConfig& config, pid_t pid);

  ~Vm();  // stops console capture; does NOT kill QEMU
  Vm(const Vm&) = delete;
  Vm& operator=(const Vm&) = delete;

  pid_t pid() const;
  // Running, not a zombie, and still this run_dir's QEMU (pid-reuse safe).
  bool alive() const;
  std::filesystem::path agent_socket() const;
  std::filesystem::path console_log() const;
  // The last `lines` lines of the console (for error messages): reads at
  // most ~64 KiB of console.log(.old), strips control characters, never
  // throws, works after kill() and whether or not capture is attached.
  std::string console_tail(size_t lines = 20) const;
  // The full QEMU command line used (for diagnostics and tests).
  const std::vector<std::string>& argv() const;

  // Templates: pauses the guest and writes its device state to `path`
  // (migration with x-ignore-shared: RAM is memory_file, which must be
  // shared, and is not copied; what is written is device state and ROMs,
  // well under 1 MB). The VM stays paused; kill() it afterwards. Returns the
  // bytes written. Error(timeout/internal) on failure, the partial file
  // removed.
  uint64_t save_state(const std::filesystem::path& path,
                      std::chrono::milliseconds timeout = std::chrono::seconds(30));

  // Pause, memory snapshots, fork: stops the guest's CPUs and writes its
  // whole state, RAM included (zero pages cost a flag each), to `path`
  // (created, must not exist; fsynced). The VM stays stopped: resume_cpus()
  // continues it, kill() ends it. Returns the bytes written. Error(timeout/
  // internal) with the partial file removed; the VM is then still stopped.
  uint64_t save_memory(const std::filesystem::path& path,
                       std::chrono::milliseconds timeout = std::chrono::seconds(120));
  // Fork: as save_memory, but the stream (in an unnamed temporary file
  // beside device_path) is then split by split_migration_stream
  // (ram_split.h): the main RAM block comes back as a sealed memfd, the rest
  // is written to `device_path` (created, 0600, not fsynced: it is only used
  // while the memfd lives). `saved`, if set, runs once the stream is
  // complete and before the split (the VM still stopped; it may resume it,
  // so the source's pause does not include the split); what it throws
  // propagates. An error before `saved`: as save_memory (the VM still
  // stopped; the caller may then save_memory). A stream that does not split
  // (not the expected layout): with `whole_fallback` set, the whole stream is
  // kept as that file (fsynced) and the result has no `ram`; else Error.
  SplitStream save_memory_split(const std::filesystem::path& device_path,
                                std::chrono::milliseconds timeout = std::chrono::seconds(120),
                                const std::function<void()>& saved = {},
                                const std::filesystem::path& whole_fallback = {});
  // Stops the guest's CPUs (QMP stop: also drains and flushes its disk, so
  // the overlay file is consistent for a copy) / continues them.
  void stop_cpus();
  void resume_cpus();
  // Maps guest RAM into QEMU's page tables while the guest runs, once per
  // QEMU (ram_prefault.h), so that a first save stops the guest for tens of
  // milliseconds instead of the ~0.7 s its page faults take. Best effort:
  // the bytes read, 0 if done before or not possible.
  uint64_t prefault_ram();
  // "ram0" if guest RAM is a memory-backend object (template clones), else
  // "" (see VmConfig::ram_block).
  std::string ram_block() const;

  // The jail cgroup's cpu weight (CgroupLimits::cpu_weight's scale); false
  // if there is none to set (no jail, or no cpu controller of ours).
  // Error(unavailable) if the cgroup cannot be written.
  bool set_cpu_weight(int weight);

  // SIGKILL QEMU, wait until it is gone, remove its sockets and pid file,
  // its jail's cgroup and uid lease (jail.h).
  // Idempotent. Keeps console.log (for post-mortems; run_dir's owner removes
  // it). Reaps QEMU if this process is a child subreaper and so its parent.
  // Throws Error(internal) if QEMU survives SIGKILL for 5 s.
  void kill();

 private:
  struct Impl;
  explicit Vm(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The QEMU argv for `config` (pure; unit-tested).
std::vector<std::string> qemu_argv(const VmConfig& config);

}  // namespace airlock::vmm

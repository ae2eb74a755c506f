#include "engine/vmm/vm.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include "common/error.h"
#include "common/phases.h"
#include "common/process.h"
#include "common/spawn.h"
#include "common/unique_fd.h"
#include "engine/storage/disk_chain.h"
#include "engine/vmm/cgroup.h"
#include "engine/vmm/console.h"
#include "engine/vmm/jail.h"
#include "engine/vmm/kernel_head.h"
#include "engine/vmm/qmp.h"
#include "engine/vmm/ram_prefault.h"
#include "engine/vmm/sealed_ram.h"

namespace airlock::vmm {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

const char* to_string(Accel accel) { return accel == Accel::kvm ? "kvm" : "tcg"; }

namespace {

constexpr auto kQmpTimeout = std::chrono::seconds(10);
constexpr auto kKillTimeout = std::chrono::seconds(5);
constexpr size_t kQemuLogCap = 64 * 1024;

fs::path pid_file(const fs::path& run_dir) { return run_dir / "qemu.pid"; }
fs::path qemu_log(const fs::path& run_dir) { return run_dir / "qemu.log"; }

// QEMU's option parser splits on ','; a literal comma is written ",,".
std::string opt_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    out += c;
    if (c == ',') out += ',';
  }
  return out;
}

// QEMU's stderr, trimmed to something fit for an error message.
std::string qemu_stderr(const fs::path& run_dir) {
  std::string s = read_file_capped(qemu_log(run_dir), 4096);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  std::string out;
  for (char c : s) out += c == '\n' ? std::string("; ") : std::string(1, c);
  return out;
}

// True if `pid` is a live (not zombie) QEMU whose command line names this
// run_dir's pid file: guards against pid reuse by an unrelated process.
bool is_our_qemu(pid_t pid, const fs::path& run_dir) {
  return alive_with_arg(pid, pid_file(run_dir).string());
}

void remove_runtime_files(const fs::path& run_dir) {
  std::error_code ec;
  for (const char* name : {"agent.sock", "console.sock", "qmp.sock", "qemu.pid", "kernel.head"})
    fs::remove(run_dir / name, ec);
}

// Absolute path of `binary` searched in PATH (common/process.h: before fork).
std::string resolve_binary(const std::string& binary) {
  if (auto found = find_in_path(binary)) return *found;
  throw Error(Errc::unavailable, "QEMU binary not found in PATH: " + binary, "qemu_binary");
}

void require_file(const fs::path& p, const char* field) {
  std::error_code ec;
  if (!fs::is_regular_file(p, ec))
    throw Error(Errc::not_found, std::string(field) + " not found: " + p.string(), field);
}

void validate(const VmConfig& c) {
  if (c.id.empty()) throw Error(Errc::invalid_argument, "VM id is empty", "id");
  std::error_code ec;
  if (!fs::is_directory(c.run_dir, ec))
    throw Error(Errc::not_found, "run_dir is not a directory: " + c.run_dir.string(), "run_dir");
  require_file(c.kernel, "kernel");
  if (!c.initrd.empty()) require_file(c.initrd, "initrd");
  require_file(c.disk, "disk");
  if (c.cpus < 1 || c.cpus > 64)
    throw Error(Errc::invalid_argument, "cpus must be 1..64, got " + std::to_string(c.cpus),
                "cpus");
  if (c.memory_mb < 64 || c.memory_mb > 1024 * 1024)
    throw Error(Errc::invalid_argument,
                "memory_mb must be at least 64, got " + std::to_string(c.memory_mb), "memory_mb");
  if (c.console_cap_bytes < 4096)
    throw Error(Errc::invalid_argument, "console_cap_bytes must be at least 4096",
                "console_cap_bytes");
  if (!c.net_mac.empty()) {
    bool ok = c.net_mac.size() == 17;
    for (size_t i = 0; ok && i < c.net_mac.size(); ++i)
      ok = i % 3 == 2 ? c.net_mac[i] == ':'
                      : std::isxdigit(static_cast<unsigned char>(c.net_mac[i]));
    if (!ok)
      throw Error(Errc::invalid_argument, "net_mac must look like 52:54:00:12:34:56", "net_mac");
  }
  if (!c.memory_file.empty()) {
    if (c.memory_file.string().find(',') != std::string::npos)
      throw Error(Errc::invalid_argument, "memory_file must not contain ','", "memory_file");
    // A clone maps an existing template; a template creates its own file.
    if (!c.memory_shared) {
      require_file(c.memory_file, "memory_file");
      if (c.memory_fd < 0 || !is_write_sealed(c.memory_fd))
        throw Error(Errc::invalid_argument,
                    "a clone needs its template's RAM as a write-sealed memfd (memory_fd)",
                    "memory_fd");
    }
  }
  if (!c.ram_block.empty() && c.ram_block != "ram0")
    throw Error(Errc::invalid_argument, "ram_block must be \"\" or \"ram0\"", "ram_block");
  if (c.memory_file.empty() && c.memory_fd >= 0) {
    if (!c.incoming_full || !is_write_sealed(c.memory_fd))
      throw Error(Errc::invalid_argument,
                  "memory_fd without memory_file is a fork's sealed RAM and needs incoming_full",
                  "memory_fd");
  }
  if (c.incoming_full && (c.incoming_state.empty() || !c.memory_file.empty()))
    throw Error(Errc::invalid_argument,
                "incoming_full needs incoming_state and no memory_file (RAM comes from the state)",
                "incoming_full");
  if (!c.incoming_state.empty()) {
    require_file(c.incoming_state, "incoming_state");
    if (!c.incoming_full && (c.memory_file.empty() || c.memory_shared))
      throw Error(Errc::invalid_argument,
                  "incoming_state needs the template's memory_file mapped privately",
                  "incoming_state");
  }
  if (!c.net_socket.empty() && c.net_socket.string().size() > 107)
    throw Error(Errc::invalid_argument, "net_socket path too long for a unix socket", "net_socket");
  // sun_path is 108 bytes; fail now rather than with an obscure QEMU error.
  if ((c.run_dir / "console.sock").string().size() > 107)
    throw Error(Errc::invalid_argument, "run_dir path too long for unix sockets", "run_dir");
}

// Starts QEMU detached (common/spawn.h), so it is re-parented to init (or the
// nearest subreaper) and survives the daemon. Returns its pid. `inherit_fd`
// (if >= 0) becomes fd kInheritedFd of QEMU, like in the jail.
pid_t start_qemu_detached(const std::vector<std::string>& argv, const fs::path& run_dir,
                          int inherit_fd) {
  std::vector<std::string> args = argv;
  args[0] = resolve_binary(argv[0]);
  UniqueFd log(create_file_nofollow(qemu_log(run_dir), 0640));
  if (log.fd < 0) throw_errno("open " + qemu_log(run_dir).string());
  Detached d{.argv = args, .fds = {{1, log.fd}, {2, log.fd}}};
  if (inherit_fd >= 0) d.fds.emplace_back(kInheritedFd, inherit_fd);
  try {
    return spawn_detached(d);
  } catch (const Error& e) {
    if (e.code() == Errc::unavailable) throw Error(Errc::unavailable, e.what(), "qemu_binary");
    throw;
  }
}

constexpr auto kMigrationPoll = std::chrono::milliseconds(2);

// Waits for an outgoing migration (a save into a file) to complete; past
// the deadline it is cancelled. `what` names what is saved, for errors.
void await_migration(QmpClient& qmp, Clock::time_point deadline, std::chrono::milliseconds timeout,
                     const std::string& what) {
  bool completed = false;
  for (;;) {
    if (completed) {
      // QEMU reports "completed" before its migration thread moves the VM
      // to "postmigrate"; a `cont` in between is undone by that move and
      // leaves the VM stopped for good. So the caller gets it only then.
      if (qmp.execute("query-status").value("status", "") == "postmigrate") return;
    } else {
      nlohmann::json st = qmp.execute("query-migrate");
      std::string status = st.value("status", "");
      completed = status == "completed";
      if (completed) continue;
      if (status == "failed" || status == "cancelled")
        throw Error(Errc::internal,
                    "saving " + what + " failed: " + st.value("error-desc", status));
    }
    if (Clock::now() > deadline) {
      try {
        qmp.execute("migrate_cancel");
      } catch (const std::exception&) {
      }
      throw Error(Errc::timeout, "saving " + what + " took longer than " +
                                     std::to_string(timeout.count()) + " ms");
    }
    std::this_thread::sleep_for(kMigrationPoll);
  }
}

void set_ignore_shared(QmpClient& qmp) {
  qmp.execute("migrate-set-capabilities",
              {{"capabilities", {{{"capability", "x-ignore-shared"}, {"state", true}}}}});
}

// Loads a template's device state into a QEMU started with -incoming defer
// and waits until it is in (paused, -S). A state QEMU cannot load makes it
// exit: the caller's cleanup then reports QEMU's own message.
void restore_state(QmpClient& qmp, const fs::path& state, bool full) {
  int fd = ::open(state.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) throw_errno("open " + state.string());
  try {
    if (!full) set_ignore_shared(qmp);
    qmp.send_fd("incoming", fd);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  qmp.execute("migrate-incoming", {{"uri", "fd:incoming"}});
  auto deadline = Clock::now() + std::chrono::seconds(full ? 120 : 30);
  for (;;) {
    std::string status = qmp.execute("query-status").value("status", "");
    if (status != "inmigrate") break;
    if (Clock::now() > deadline)
      throw Error(Errc::timeout, "loading the saved VM state took over 120 s");
    std::this_thread::sleep_for(kMigrationPoll);
  }
}

bool under(const fs::path& p, const fs::path& dir) {
  auto rel =
      fs::absolute(p).lexically_normal().lexically_relative(fs::absolute(dir).lexically_normal());
  return !rel.empty() && *rel.begin() != "..";
}

// The jail for `c`'s QEMU (jail.h): exactly the files it opens.
JailSpec jail_spec(const VmConfig& c, const std::string& exe) {
  JailSpec s;
  s.id = c.id;
  s.run_dir = c.run_dir;
  s.exe = exe;
  s.ro = qemu_runtime_paths(exe);
  if (!under(c.kernel, c.run_dir)) s.ro.push_back(c.kernel);  // not a restore's kernel.head
  if (!c.initrd.empty()) s.ro.push_back(c.initrd);
  uint64_t disk_size = 0;
  auto chain = qcow2_chain(c.disk, &disk_size);
  s.ro.insert(s.ro.end(), chain.begin() + 1, chain.end());  // backing files: read-only
  s.chown.push_back(c.disk);
  if (!under(c.disk, c.run_dir)) s.rw.push_back(c.disk);
  if (!c.net_socket.empty()) {
    s.chown.push_back(c.net_socket);  // QEMU's uid must be able to connect
    if (!under(c.net_socket, c.run_dir)) s.rw.push_back(c.net_socket);
  }
  if (!c.memory_file.empty()) {
    if (c.memory_shared) {
      // A template's RAM: QEMU sizes and writes it; it must exist to be bound.
      // Owner only: clones never open it (they get a sealed copy, above).
      int fd = ::open(c.memory_file.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
      if (fd < 0) throw_errno("create " + c.memory_file.string());
      ::fchmod(fd, 0600);
      ::close(fd);
      s.chown.push_back(c.memory_file);
      s.rw.push_back(c.memory_file);
    } else {
      // A clone maps the sealed memfd (fd kInheritedFd, /proc/self/fd/N):
      // the template's RAM file is not in its root at all.
      s.inherit_fd = c.memory_fd;
    }
  }
  if (c.memory_file.empty() && c.memory_fd >= 0) s.inherit_fd = c.memory_fd;  // a fork's RAM
  s.ro.insert(s.ro.end(), c.extra_ro.begin(), c.extra_ro.end());
  s.rw.insert(s.rw.end(), c.extra_rw.begin(), c.extra_rw.end());
  s.kvm = c.accel == Accel::kvm;
  const uint64_t mib = 1024 * 1024;
  uint64_t ram = static_cast<uint64_t>(c.memory_mb) * mib;
  // Guest RAM + QEMU's own (TCG translation cache, device state, threads):
  // the cache's cap (QEMU's 1 GiB default when uncapped) + 256 MiB + 25%.
  const uint64_t tb = c.accel == Accel::kvm  ? 0
                      : c.tcg_tb_size_mb > 0 ? static_cast<uint64_t>(c.tcg_tb_size_mb) * mib
                                             : 1024 * mib;
  s.limits.memory_bytes = ram + tb + 256 * mib + ram / 4;
  s.limits.pids = 1024;
  s.limits.cpus = c.cpus;
  s.limits.cpu_weight = c.cpu_weight;
  // The largest file QEMU writes: the overlay (disk size + qcow2 metadata),
  // or a template's RAM file.
  s.fsize_bytes = std::max(disk_size + disk_size / 8, ram) + 64 * mib;
  s.pid_file = pid_file(c.run_dir);
  return s;
}

// Starts QEMU detached, in the jail unless config.jail is off.
pid_t spawn_qemu(const VmConfig& c, const std::vector<std::string>& argv) {
  // QEMU opens the chain its headers name, and the disk was writable by a
  // QEMU before (a resumed, restored or forked sandbox's): refuse a chain
  // that leaves airlock's directories before anything opens it.
  if (!c.disk_roots.empty())
    storage::disk_chain(c.disk, c.disk_roots, "the disk " + c.disk.string());
  if (!c.jail) return start_qemu_detached(argv, c.run_dir, c.memory_shared ? -1 : c.memory_fd);
  std::string exe = resolve_binary(argv[0]);
  Jail jail = Jail::prepare(jail_spec(c, exe));
  int log = create_file_nofollow(qemu_log(c.run_dir), 0640);
  if (log < 0) {
    release_jail(c.run_dir);
    throw_errno("open " + qemu_log(c.run_dir).string());
  }
  try {
    pid_t pid = jail.spawn(argv, log);
    ::close(log);
    return pid;
  } catch (...) {
    ::close(log);
    release_jail(c.run_dir);
    remove_runtime_files(c.run_dir);
    std::error_code ec;
    fs::remove(qemu_log(c.run_dir), ec);
    throw;
  }
}

}  // namespace

std::vector<std::string> qemu_argv(const VmConfig& c) {
  const fs::path& d = c.run_dir;
  auto sock = [&](const char* id, const char* file) {
    return std::string("socket,id=") + id + ",path=" + opt_escape((d / file).string()) +
           ",server=on,wait=off";
  };
  std::string append = "console=ttyS0 panic=-1 reboot=t quiet";
  if (!c.extra_kernel_args.empty()) append += " " + c.extra_kernel_args;
  std::vector<std::string> a = {
      c.qemu_binary,
      "-name",
      "airlock-" + opt_escape(c.id),
      // `pc`, not `microvm`: under TCG microvm hung in some boots (TSC
      // calibration against the PIT) and gained little (see vm_test / report).
      "-machine",
      "pc",
      "-accel",
      c.accel == Accel::kvm  ? "kvm"
      : c.tcg_tb_size_mb > 0 ? "tcg,tb-size=" + std::to_string(c.tcg_tb_size_mb)
                             : "tcg",
      "-cpu",
      c.accel == Accel::kvm ? "host" : "max",
      "-smp",
      std::to_string(c.cpus),
      "-m",
      std::to_string(c.memory_mb),
      "-nodefaults",
      "-no-user-config",
      "-display",
      "none",
      "-S",          // paused until the console is attached: no output lost
      "-no-reboot",  // guest reboot/panic (panic=-1) ends QEMU instead of looping
      "-kernel",
      c.kernel.string(),
  };
  if (!c.initrd.empty()) a.insert(a.end(), {"-initrd", c.initrd.string()});
  if (!c.memory_file.empty()) {
    a.insert(a.end(),
             {"-object",
              "memory-backend-file,id=ram0,size=" + std::to_string(c.memory_mb) + "M,mem-path=" +
                  (c.memory_shared ? c.memory_file.string()
                                   : "/proc/self/fd/" + std::to_string(kInheritedFd)) +
                  (c.memory_shared ? ",share=on" : ",share=off"),
              "-machine", "memory-backend=ram0"});
  } else if (c.memory_fd >= 0) {
    // A fork: the source's RAM, split out of its stream, mapped
    // copy-on-write under the source's block id so the stream matches.
    const std::string id = ram_block_id(c.ram_block);
    a.insert(a.end(),
             {"-object",
              "memory-backend-file,id=" + id + ",size=" + std::to_string(c.memory_mb) +
                  "M,mem-path=/proc/self/fd/" + std::to_string(kInheritedFd) + ",share=off",
              "-machine", "memory-backend=" + id});
  } else if (c.ram_block == "ram0") {
    // A full restore of a clone's state: same RAM block name, own RAM.
    a.insert(a.end(),
             {"-object", "memory-backend-ram,id=ram0,size=" + std::to_string(c.memory_mb) + "M",
              "-machine", "memory-backend=ram0"});
  }
  if (!c.incoming_state.empty()) a.insert(a.end(), {"-incoming", "defer"});
  a.insert(a.end(), {
                        "-append",
                        append,
                        // cache=unsafe: the overlay is disposable; flushes would only cost time.
                        "-drive",
                        "if=none,id=root,file=" + opt_escape(c.disk.string()) +
                            ",format=qcow2,cache=unsafe,discard=unmap",
                        "-device",
                        "virtio-blk-pci,drive=root",
                        "-device",
                        "virtio-serial-pci,id=vser",
                        "-chardev",
                        sock("agent", "agent.sock"),
                        "-device",
                        "virtserialport,bus=vser.0,chardev=agent,name=airlock.0",
                        "-object",
                        "rng-random,id=rng0,filename=/dev/urandom",
                        "-device",
                        "virtio-rng-pci,rng=rng0",
                        "-chardev",
                        sock("console", "console.sock"),
                        "-serial",
                        "chardev:console",
                        "-chardev",
                        sock("qmp", "qmp.sock"),
                        "-mon",
                        "chardev=qmp,mode=control",
                    });
  if (!c.net_socket.empty()) {
    // A plain unix-socket client: allowed under -sandbox (no spawn, no
    // privileges needed), unlike -netdev user helpers or TAP scripts.
    std::string dev = "virtio-net-pci,netdev=net0";
    if (!c.net_mac.empty()) dev += ",mac=" + opt_escape(c.net_mac);
    a.insert(a.end(), {"-netdev",
                       "stream,id=net0,server=off,addr.type=unix,addr.path=" +
                           opt_escape(c.net_socket.string()),
                       "-device", dev});
  }
  a.insert(a.end(), {
                        "-pidfile",
                        pid_file(d).string(),
                        // QEMU's own seccomp filter: one layer of the jail, cheap to have.
                        "-sandbox",
                        "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
                    });
  return a;
}

struct Vm::Impl {
  VmConfig config;
  std::vector<std::string> argv;
  pid_t pid = -1;
  std::unique_ptr<ConsoleCapture> console;
  bool prefaulted = false;  // prefault_ram() has run for this QEMU
};

Vm::Vm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Vm::~Vm() {
  if (impl_ && impl_->console) impl_->console->stop();
}

std::unique_ptr<Vm> Vm::start(const VmConfig& config) {
  validate(config);
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  const fs::path& dir = config.run_dir;
  remove_runtime_files(dir);  // stale sockets of an earlier run would confuse connect
  // A restore never boots: the kernel's header stands in for the kernel and
  // no initrd is loaded, which keeps ~19 MiB of fw_cfg copies out of every
  // clone's QEMU (kernel_head.h).
  VmConfig launch = config;
  if (!config.incoming_state.empty()) {
    fs::path head = write_kernel_head(config.kernel, dir / "kernel.head");
    if (!head.empty()) {
      launch.kernel = head;
      launch.initrd.clear();
    }
  }
  impl->argv = qemu_argv(launch);

  Phases ph("vm " + config.id);
  pid_t pid = spawn_qemu(launch, impl->argv);
  impl->pid = pid;
  ph.mark("spawn");
  auto cleanup = [&](const std::string& why) -> Error {
    if (impl->console) impl->console->stop();
    impl->console.reset();
    // If QEMU itself gave up (its sockets closing is then only a symptom),
    // say so: its stderr below is the real cause.
    bool exited = wait_gone(pid, std::chrono::milliseconds(500));
    ::kill(pid, SIGKILL);
    wait_gone(pid, kKillTimeout);
    std::string err = qemu_stderr(dir);
    release_jail(dir);
    remove_runtime_files(dir);
    std::error_code ec;
    for (const char* f : {"qemu.log", "console.log", "console.log.old"}) fs::remove(dir / f, ec);
    std::string msg = exited ? "QEMU exited during start-up" : "QEMU failed to start: " + why;
    return Error(Errc::internal, msg + (err.empty() ? std::string() : " (QEMU: " + err + ")"));
  };
  try {
    // A QEMU that exits during start-up (bad option, unreadable kernel) is
    // noticed at once instead of after the whole deadline.
    auto exited = [&]() -> std::string {
      if (::kill(pid, 0) != 0 || proc_state(pid) == 'Z') return "QEMU exited during start-up";
      return {};
    };
    QmpClient qmp = QmpClient::connect(dir / "qmp.sock", kQmpTimeout, exited);
    impl->console = std::make_unique<ConsoleCapture>(dir / "console.sock", dir / "console.log",
                                                     config.console_cap_bytes, true,
                                                     Clock::now() + std::chrono::seconds(5));
    ph.mark("qmp+console");
    if (!config.incoming_state.empty())
      restore_state(qmp, config.incoming_state, config.incoming_full);
    ph.mark("load state");
    qmp.execute("cont");
  } catch (const Error& e) {
    throw cleanup(e.what());
  } catch (const std::exception& e) {
    throw cleanup(e.what());
  }
  // qemu.log stays (bounded below) for diagnostics of later QEMU errors.
  // Through an fd opened without following links: the jail can plant one.
  int log = ::open(qemu_log(dir).c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (log >= 0) {
    struct stat st {};
    if (::fstat(log, &st) == 0 && S_ISREG(st.st_mode) &&
        static_cast<size_t>(st.st_size) > kQemuLogCap)
      (void)::ftruncate(log, 0);
    ::close(log);
  }
  return std::unique_ptr<Vm>(new Vm(std::move(impl)));
}

std::unique_ptr<Vm> Vm::adopt(const VmConfig& config, pid_t pid) {
  if (!is_our_qemu(pid, config.run_dir)) return nullptr;
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->pid = pid;
  impl->argv = proc_cmdline(pid);
  try {
    impl->console = std::make_unique<ConsoleCapture>(
        config.run_dir / "console.sock", config.run_dir / "console.log", config.console_cap_bytes,
        false, Clock::now() + std::chrono::seconds(2));
  } catch (const Error&) {
    // The VM is alive and usable; losing console capture is the lesser evil
    // than abandoning a running sandbox. console_tail still shows older output.
  }
  return std::unique_ptr<Vm>(new Vm(std::move(impl)));
}

pid_t Vm::pid() const { return impl_->pid; }

bool Vm::alive() const { return is_our_qemu(impl_->pid, impl_->config.run_dir); }

fs::path Vm::agent_socket() const { return impl_->config.run_dir / "agent.sock"; }

fs::path Vm::console_log() const { return impl_->config.run_dir / "console.log"; }

std::string Vm::console_tail(size_t lines) const { return vmm::console_tail(console_log(), lines); }

const std::vector<std::string>& Vm::argv() const { return impl_->argv; }

uint64_t Vm::save_state(const fs::path& path, std::chrono::milliseconds timeout) {
  if (impl_->config.memory_file.empty() || !impl_->config.memory_shared)
    throw Error(Errc::invalid_argument,
                "save_state needs a VM whose RAM is a shared memory_file (a template)",
                "memory_file");
  auto deadline = Clock::now() + timeout;
  const fs::path& dir = impl_->config.run_dir;
  QmpClient qmp = QmpClient::connect(dir / "qmp.sock", kQmpTimeout);
  int fd = create_file_nofollow(path, 0640);  // may be in a dir the jail writes
  if (fd < 0) throw_errno("create " + path.string());
  std::error_code ec;
  try {
    qmp.execute("stop");  // also drains and flushes the disk
    set_ignore_shared(qmp);
    qmp.send_fd("template", fd);
    qmp.execute("migrate", {{"uri", "fd:template"}});
    await_migration(qmp, deadline, timeout, "the VM state");
    if (::fsync(fd) != 0) throw_errno("fsync " + path.string());
  } catch (...) {
    ::close(fd);
    fs::remove(path, ec);
    throw;
  }
  ::close(fd);
  return fs::file_size(path, ec);
}

namespace {

// Stops the guest and migrates its whole state (RAM included) into `fd`,
// which QEMU takes over; returns when QEMU reports the migration complete.
void migrate_full(QmpClient& qmp, int fd, Clock::time_point deadline,
                  std::chrono::milliseconds timeout) {
  qmp.execute("stop");  // also drains and flushes the disk
  // Full stream: a clone's RAM is a private mapping, never skipped.
  qmp.execute("migrate-set-capabilities",
              {{"capabilities", {{{"capability", "x-ignore-shared"}, {"state", false}}}}});
  // QEMU 7.2 throttles migration to 32 MiB/s by default; to a local file
  // with the guest stopped there is nothing to protect.
  qmp.execute("migrate-set-parameters", {{"max-bandwidth", int64_t{1} << 40}});
  qmp.send_fd("memsave", fd);
  qmp.execute("migrate", {{"uri", "fd:memsave"}});
  await_migration(qmp, deadline, timeout, "the VM's memory");
}

}  // namespace

uint64_t Vm::save_memory(const fs::path& path, std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  const fs::path& dir = impl_->config.run_dir;
  QmpClient qmp = QmpClient::connect(dir / "qmp.sock", kQmpTimeout);
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) throw_errno("create " + path.string());
  std::error_code ec;
  try {
    migrate_full(qmp, fd, deadline, timeout);
    if (::fsync(fd) != 0) throw_errno("fsync " + path.string());
  } catch (...) {
    ::close(fd);
    fs::remove(path, ec);
    throw;
  }
  ::close(fd);
  return fs::file_size(path, ec);
}

SplitStream Vm::save_memory_split(const fs::path& device_path, std::chrono::milliseconds timeout,
                                  const std::function<void()>& saved,
                                  const fs::path& whole_fallback) {
  auto deadline = Clock::now() + timeout;
  const fs::path& dir = impl_->config.run_dir;
  const std::string block = ram_block_id(ram_block());
  // The whole stream first goes to an unnamed file beside `device_path`
  // (gone when closed, even after a crash), then is split. Measured: QEMU
  // writing into a pipe read by a parser thread took 2-4x longer under TCG
  // on 2 busy cores than writing a file and parsing it afterwards; and with
  // the file, the VM can continue (`saved`) before the split.
  UniqueFd whole{::open(device_path.parent_path().c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600)};
  if (whole.fd < 0) throw_errno("create a temporary file in " + device_path.parent_path().string());
  UniqueFd dev{
      ::open(device_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600)};
  if (dev.fd < 0) throw_errno("create " + device_path.string());
  Phases ph("split save " + impl_->config.id);
  std::error_code ec;
  try {
    {
      // Closed before `saved`: QEMU's monitor takes one client at a time.
      QmpClient qmp = QmpClient::connect(dir / "qmp.sock", kQmpTimeout);
      migrate_full(qmp, whole.fd, deadline, timeout);
    }
    ph.mark("migrate");
    if (saved) saved();  // may resume the VM: the stream is complete
    ph.mark("saved callback");
  } catch (...) {
    dev.reset();
    fs::remove(device_path, ec);
    throw;
  }
  try {
    if (::lseek(whole.fd, 0, SEEK_SET) != 0) throw_errno("seek saved state");
    // No fsync: a split state is only used while its memfd lives, i.e.
    // never after a crash of this process.
    SplitStream out = split_migration_stream(whole.fd, dev.fd, block);
    ph.mark("split");
    return out;
  } catch (const Error& e) {
    dev.reset();
    fs::remove(device_path, ec);
    if (whole_fallback.empty()) throw;
    // The stream is the whole state already: keep it under a name instead
    // of saving again (the VM may have moved on since `saved`).
    std::string proc = "/proc/self/fd/" + std::to_string(whole.fd);
    if (::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, whole_fallback.c_str(), AT_SYMLINK_FOLLOW) != 0)
      throw_errno("keep the saved state as " + whole_fallback.string());
    if (::fsync(whole.fd) != 0) throw_errno("fsync " + whole_fallback.string());
    SplitStream kept;
    kept.error = e.what();
    return kept;
  }
}

bool Vm::set_cpu_weight(int weight) {
  // Only the full jail (root) makes the sandbox's cgroup (jail.cc).
  if (!impl_->config.jail || jail_mode() != JailMode::full) return false;
  return set_sandbox_cpu_weight(impl_->config.id, weight);
}

void Vm::stop_cpus() {
  QmpClient qmp = QmpClient::connect(impl_->config.run_dir / "qmp.sock", kQmpTimeout);
  qmp.execute("stop");
}

void Vm::resume_cpus() {
  QmpClient qmp = QmpClient::connect(impl_->config.run_dir / "qmp.sock", kQmpTimeout);
  qmp.execute("cont");
}

uint64_t Vm::prefault_ram() {
  if (impl_->prefaulted || !is_our_qemu(impl_->pid, impl_->config.run_dir)) return 0;
  impl_->prefaulted = true;
  return prefault_guest_ram(impl_->pid, static_cast<uint64_t>(impl_->config.memory_mb) << 20);
}

std::string Vm::ram_block() const {
  for (const auto& a : impl_->argv)
    if (a == "memory-backend=ram0") return "ram0";
  return {};
}

void Vm::kill() {
  pid_t pid = impl_->pid;
  if (pid > 0) {
    // Only signal the pid while it is still provably ours (pid reuse).
    if (is_our_qemu(pid, impl_->config.run_dir)) ::kill(pid, SIGKILL);
    if (!wait_gone(pid, kKillTimeout))
      throw Error(Errc::internal,
                  "QEMU (pid " + std::to_string(pid) + ") did not exit within 5 s of SIGKILL");
    impl_->pid = -1;
  }
  if (impl_->console) impl_->console->stop();
  remove_runtime_files(impl_->config.run_dir);
  // The jail's cgroup and uid lease (also of a QEMU adopted from an earlier
  // daemon: found by run_dir).
  release_jail(impl_->config.run_dir);
}

}  // namespace airlock::vmm

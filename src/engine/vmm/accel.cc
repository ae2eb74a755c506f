#include "engine/vmm/accel.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "common/error.h"
#include "engine/vmm/qmp.h"
#include "protocol/frame.h"

namespace airlock::vmm {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

json cache_key(const ProbeConfig& c) {
  utsname u{};
  ::uname(&u);
  struct stat st {};
  if (::stat(c.kernel.c_str(), &st) != 0)
    throw Error(Errc::not_found, "kernel not found: " + c.kernel.string(), "kernel");
  return {{"host_kernel", u.release},
          {"guest_kernel", c.kernel.string()},
          {"guest_kernel_size", static_cast<int64_t>(st.st_size)},
          {"guest_kernel_mtime", static_cast<int64_t>(st.st_mtime)},
          {"qemu", qemu_version(c.qemu_binary)}};
}

// The probe boot itself: start with KVM, wait for the agent's hello.
AccelVerdict probe_boot(const ProbeConfig& c) {
  fs::create_directories(c.work_dir);
  std::string tmpl = (c.work_dir / "probe-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) throw_errno("mkdtemp " + tmpl);
  fs::path run_dir = tmpl;
  auto secs = std::to_string(c.deadline.count() / 1000);
  AccelVerdict v{Accel::tcg, {}, false};
  std::unique_ptr<Vm> vm;
  try {
    VmConfig cfg;
    cfg.id = "accel-probe";
    cfg.run_dir = run_dir;
    cfg.kernel = c.kernel;
    cfg.initrd = c.initrd;
    cfg.disk = c.disk;
    cfg.memory_mb = 256;
    cfg.accel = Accel::kvm;
    cfg.console_cap_bytes = 256 * 1024;
    cfg.qemu_binary = c.qemu_binary;
    auto deadline = Clock::now() + c.deadline;
    vm = Vm::start(cfg);
    agent_hello(vm->agent_socket(), deadline);
    v = {Accel::kvm, "a KVM probe boot reached the guest agent", false};
  } catch (const Error& e) {
    std::string tail = vm ? vm->console_tail(1) : std::string();
    v.reason = "KVM present but a probe boot did not reach the agent within " + secs + " s (" +
               e.what() + "; console: " + (tail.empty() ? "<nothing>" : tail) + ")";
  }
  if (vm) {
    try {
      vm->kill();
    } catch (const Error&) {
    }
  }
  std::error_code ec;
  fs::remove_all(run_dir, ec);
  return v;
}

}  // namespace

std::string qemu_version(const std::string& binary) {
  std::string cmd = "'" + binary + "' --version 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return "unknown";
  std::array<char, 256> line{};
  std::string first = std::fgets(line.data(), line.size(), p) ? line.data() : "unknown";
  ::pclose(p);
  while (!first.empty() && (first.back() == '\n' || first.back() == '\r')) first.pop_back();
  return first;
}

std::string agent_hello(const fs::path& agent_socket, Clock::time_point deadline) {
  int fd = connect_unix(agent_socket, deadline);
  std::string result;
  try {
    protocol::Frame hello;
    hello.type = protocol::Type::hello;
    hello.stream = 0;
    hello.payload = json{{"version", protocol::kVersion}}.dump();
    std::string out = protocol::encode(hello);
    size_t off = 0;
    while (off < out.size()) {
      ssize_t n = ::send(fd, out.data() + off, out.size() - off, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw_errno("send hello to " + agent_socket.string());
      off += static_cast<size_t>(n);
    }
    protocol::Decoder dec;
    for (;;) {
      if (auto f = dec.next()) {
        if (f->type == protocol::Type::hello) {
          result = f->payload;
          break;
        }
        continue;  // anything else before hello is ignored by the probe
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0)
        throw Error(Errc::timeout, "no hello from the guest agent before the deadline");
      pollfd pfd{fd, POLLIN, 0};
      int r = ::poll(&pfd, 1, static_cast<int>(left.count()));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) continue;  // the deadline check above ends it
      char buf[4096];
      ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw Error(Errc::guest_error, "guest agent channel closed before hello");
      dec.feed(buf, static_cast<size_t>(n));
    }
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return result;
}

AccelVerdict probe_accel(const ProbeConfig& c) {
  int kvm = ::open(c.kvm_device.c_str(), O_RDWR | O_CLOEXEC);
  if (kvm < 0)
    return {Accel::tcg,
            "cannot open " + c.kvm_device.string() + " (" + std::strerror(errno) + "): using TCG",
            false};
  ::close(kvm);

  json key = cache_key(c);
  {
    std::ifstream in(c.cache_file);
    if (in) {
      try {
        json cached = json::parse(in);
        if (cached.at("key") == key)
          return {cached.at("accel") == "kvm" ? Accel::kvm : Accel::tcg,
                  cached.at("reason").get<std::string>(), true};
      } catch (const json::exception&) {
        // A corrupt cache is only a missed shortcut: probe again.
      }
    }
  }
  AccelVerdict v = probe_boot(c);
  json entry = {{"key", key}, {"accel", to_string(v.accel)}, {"reason", v.reason}};
  // Write-then-rename so a concurrent reader never sees half a file.
  fs::path tmp = c.cache_file.string() + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp);
    out << entry.dump(2) << "\n";
    if (!out) throw Error(Errc::internal, "cannot write accel cache " + tmp.string());
  }
  fs::rename(tmp, c.cache_file);
  return v;
}

}  // namespace airlock::vmm

#include "engine/fake_launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/process.h"
#include "common/spawn.h"
#include "common/unique_fd.h"
#include "engine/vmm/cgroup.h"
#include "engine/vmm/console.h"

namespace airlock::engine {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

// pid -> parent pid of every process, from /proc.
std::vector<std::pair<pid_t, pid_t>> process_parents() {
  std::vector<std::pair<pid_t, pid_t>> out;
  std::error_code ec;
  for (auto it = fs::directory_iterator("/proc", ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    std::string name = it->path().filename();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream st(it->path() / "stat");
    std::string line;
    std::getline(st, line);
    auto close = line.rfind(')');
    if (close == std::string::npos || close + 4 > line.size()) continue;
    char state;
    pid_t ppid = 0;
    if (std::sscanf(line.c_str() + close + 2, "%c %d", &state, &ppid) != 2) continue;
    out.emplace_back(std::stoi(name), ppid);
  }
  return out;
}

class FakeVm final : public VmHandle {
 public:
  FakeVm(const vmm::VmConfig& c, pid_t pid, FakeLauncher& l)
      : run_dir_(c.run_dir), pid_(pid), launcher_(l) {}
  pid_t pid() const override { return pid_; }
  bool alive() const override {
    if (int d = launcher_.alive_delay_ms.load(); d > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(d));
    return !killed_ && alive_with_arg(pid_, run_dir_.string());
  }
  fs::path agent_socket() const override { return run_dir_ / "agent.sock"; }
  std::string console_tail(size_t lines) const override {
    return vmm::console_tail(run_dir_ / "console.log", lines);
  }
  uint64_t save_state(const fs::path&, std::chrono::milliseconds) override {
    throw Error(Errc::unavailable, "the fake launcher cannot save a VM's state");
  }
  // The fake cannot copy processes: a "saved" fake VM is a marker file, and
  // a restore starts a fresh agent (fake tests check the state machine, not
  // that processes survive; the integration suite does that with QEMU).
  uint64_t save_memory(const fs::path& path, std::chrono::milliseconds) override {
    if (launcher_.before_save) launcher_.before_save(path);
    std::ofstream out(path, std::ios::binary);
    out << "fake vm state of " << run_dir_.string() << "\n";
    out.close();
    if (!out) throw Error(Errc::internal, "cannot write " + path.string());
    ::kill(pid_, SIGSTOP);
    std::error_code ec;
    return fs::file_size(path, ec);
  }
  void set_cpu_weight(int weight) override { launcher_.set_weight(run_dir_, weight); }
  void stop_cpus() override { ::kill(pid_, SIGSTOP); }
  void resume_cpus() override { ::kill(pid_, SIGCONT); }
  std::string ram_block() const override { return {}; }
  void kill() override {
    if (killed_) return;
    if (alive_with_arg(pid_, run_dir_.string())) kill_process_tree(pid_);
    killed_ = true;
    std::error_code ec;
    for (const char* f : {"agent.sock", "fake.pid"}) fs::remove(run_dir_ / f, ec);
  }

 private:
  fs::path run_dir_;
  pid_t pid_;
  FakeLauncher& launcher_;
  bool killed_ = false;
};

}  // namespace

void kill_process_tree(pid_t root) {
  // Stop the root first so it forks nothing new and its orphans stay below
  // it (it is a child subreaper), then kill everything found beneath it.
  ::kill(root, SIGSTOP);
  std::vector<pid_t> tree{root};
  auto parents = process_parents();
  for (size_t i = 0; i < tree.size(); ++i)
    for (auto [pid, ppid] : parents)
      if (ppid == tree[i]) tree.push_back(pid);
  for (size_t i = tree.size(); i-- > 0;) ::kill(tree[i], SIGKILL);
  for (pid_t p : tree) {
    ::waitpid(p, nullptr, WNOHANG);  // ours if the test process spawned it
    wait_gone(p, 5s);
  }
}

FakeLauncher::FakeLauncher(fs::path fake_vm_binary, fs::path agent_binary)
    : fake_vm_(std::move(fake_vm_binary)), agent_(std::move(agent_binary)) {}

void FakeLauncher::set_weight(const fs::path& run_dir, int weight) {
  std::lock_guard lock(mu_);
  weights_[run_dir.filename().string()] = weight;
}

int FakeLauncher::cpu_weight(const std::string& id) const {
  std::lock_guard lock(mu_);
  auto it = weights_.find(id);
  return it == weights_.end() ? -1 : it->second;
}

std::unique_ptr<VmHandle> FakeLauncher::start(const vmm::VmConfig& config) {
  if (before_start) before_start(config);
  ++starts;
  set_weight(config.run_dir, config.cpu_weight ? config.cpu_weight : vmm::kDefaultCpuWeight);
  std::error_code ec;
  fs::remove(config.run_dir / "fake.pid", ec);
  std::string exe = fake_vm_.string(), dir = config.run_dir.string(), agent = agent_.string();
  // Its output (and its agent's) goes to a file of its run dir, not to the
  // test's stdout: an orphan left by a crashed test would otherwise hold
  // ctest's output pipe open and make it wait out the test's timeout.
  UniqueFd out(::open((config.run_dir / "fake-vm.out").c_str(),
                      O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
  if (out.fd < 0) throw_errno("open " + (config.run_dir / "fake-vm.out").string());
  // Detached like QEMU (common/spawn.h): it must outlive an engine restart.
  spawn_detached(
      {.argv = {exe, "--run-dir", dir, "--agent", agent}, .fds = {{1, out.fd}, {2, out.fd}}});
  auto deadline = std::chrono::steady_clock::now() + 5s;
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream in(config.run_dir / "fake.pid");
    pid_t pid = 0;
    if (in >> pid && pid > 0) return std::make_unique<FakeVm>(config, pid, *this);
    std::this_thread::sleep_for(5ms);
  }
  throw Error(Errc::internal, "the fake VM did not start within 5 s (" + exe + ")");
}

std::unique_ptr<VmHandle> FakeLauncher::adopt(const vmm::VmConfig& config, pid_t pid) {
  if (!alive_with_arg(pid, config.run_dir.string())) return nullptr;
  return std::make_unique<FakeVm>(config, pid, *this);
}

}  // namespace airlock::engine

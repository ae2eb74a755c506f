// The QEMU launcher: vmm::Vm behind the VmHandle interface.
#include "engine/launcher.h"

namespace airlock::engine {

namespace {

class QemuVm final : public VmHandle {
 public:
  explicit QemuVm(std::unique_ptr<vmm::Vm> vm) : vm_(std::move(vm)) {}
  pid_t pid() const override { return vm_->pid(); }
  bool alive() const override { return vm_->alive(); }
  std::filesystem::path agent_socket() const override { return vm_->agent_socket(); }
  std::string console_tail(size_t lines) const override { return vm_->console_tail(lines); }
  uint64_t save_state(const std::filesystem::path& path,
                      std::chrono::milliseconds timeout) override {
    return vm_->save_state(path, timeout);
  }
  uint64_t save_memory(const std::filesystem::path& path,
                       std::chrono::milliseconds timeout) override {
    return vm_->save_memory(path, timeout);
  }
  vmm::SplitStream save_memory_split(const std::filesystem::path& path,
                                     std::chrono::milliseconds timeout,
                                     const std::function<void()>& saved,
                                     const std::filesystem::path& whole_fallback) override {
    return vm_->save_memory_split(path, timeout, saved, whole_fallback);
  }
  void set_cpu_weight(int weight) override { vm_->set_cpu_weight(weight); }
  void stop_cpus() override { vm_->stop_cpus(); }
  void resume_cpus() override { vm_->resume_cpus(); }
  uint64_t prefault_ram() override { return vm_->prefault_ram(); }
  std::string ram_block() const override { return vm_->ram_block(); }
  void kill() override { vm_->kill(); }

 private:
  std::unique_ptr<vmm::Vm> vm_;
};

class QemuLauncher final : public Launcher {
 public:
  std::unique_ptr<VmHandle> start(const vmm::VmConfig& config) override {
    return std::make_unique<QemuVm>(vmm::Vm::start(config));
  }
  std::unique_ptr<VmHandle> adopt(const vmm::VmConfig& config, pid_t pid) override {
    auto vm = vmm::Vm::adopt(config, pid);
    if (!vm) return nullptr;
    return std::make_unique<QemuVm>(std::move(vm));
  }
  std::string name() const override { return "qemu"; }
};

}  // namespace

std::shared_ptr<Launcher> qemu_launcher() { return std::make_shared<QemuLauncher>(); }

}  // namespace airlock::engine

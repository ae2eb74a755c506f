// Fixture for engine tests on the fake launcher (fake_launcher.h): the real
// engine and the real airlock-guest, no QEMU. Needs the `minimal` image in
// $AIRLOCK_IMAGE_DIR (its files back the overlay; nothing boots it).
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "common/error.h"
#include "common/process.h"
#include "engine/destroy_wait_test_support.h"
#include "engine/engine.h"
#include "engine/fake_launcher.h"

namespace airlock::engine::testing {

class FakeVmTest : public ::testing::Test {
 protected:
  void SetUp() override {
#if !defined(AIRLOCK_GUEST_BIN) || !defined(AIRLOCK_FAKE_VM_BIN)
    GTEST_SKIP() << "airlock-guest or airlock-fake-vm not built";
#else
    const char* images = std::getenv("AIRLOCK_IMAGE_DIR");
    if (!images || !*images) GTEST_SKIP() << "AIRLOCK_IMAGE_DIR not set (run `make image`)";
    std::string tmpl = (std::filesystem::temp_directory_path() / "airlock-fake-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    data_ = tmpl;
    fake_ = std::make_shared<FakeLauncher>(AIRLOCK_FAKE_VM_BIN, AIRLOCK_GUEST_BIN);
    cfg_ = Config{.data_dir = data_, .image_dir = images, .accel = "tcg"};
    cfg_.templates = false;  // the fake cannot save a VM's state
    cfg_.template_ram_dir = data_ / "template-ram";
    cfg_.launcher = fake_;
    if (!std::filesystem::exists(std::filesystem::path(images) / "minimal"))
      GTEST_SKIP() << "no minimal image in " << images << " (run `make image`)";
#endif
  }
  void TearDown() override {
    if (data_.empty()) return;
    for (pid_t pid : find_processes({"airlock-fake-vm", data_.string()})) kill_process_tree(pid);
    for (pid_t pid : find_processes({"airlock-net", data_.string()})) ::kill(pid, SIGKILL);
    std::filesystem::remove_all(data_);
  }
  size_t fake_vms() { return find_processes({"airlock-fake-vm", data_.string()}).size(); }
  size_t net_helpers() { return find_processes({"airlock-net", data_.string()}).size(); }
  size_t run_dirs() {
    std::error_code ec;
    size_t n = 0;
    for (auto it = std::filesystem::directory_iterator(data_ / "sandboxes", ec);
         !ec && it != std::filesystem::directory_iterator(); ++it)
      ++n;
    return n;
  }
  // Polls `pred` every 20 ms for up to `timeout`.
  template <typename F>
  bool eventually(F pred, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      if (pred()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return pred();
  }
  std::string sh(Engine& e, const std::string& id, const std::string& cmd) {
    std::string out;
    e.exec(id, {.cmd = cmd}, {.on_output = [&](int, std::string_view b) {
             out += b;
             return true;
           }});
    return out;
  }

  std::filesystem::path data_;
  std::shared_ptr<FakeLauncher> fake_;
  Config cfg_;
};

}  // namespace airlock::engine::testing

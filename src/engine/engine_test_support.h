// Shared fixture for engine tests that boot REAL VMs: a private data dir,
// the `minimal` image from $AIRLOCK_IMAGE_DIR (built if missing), and a
// tear-down that kills whatever a failed test left.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <filesystem>
#include <string>

#include "common/process.h"
#include "engine/destroy_wait_test_support.h"
#include "engine/engine.h"

namespace airlock::engine::testing {

class RealVmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "airlock-engine-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    data_ = tmpl;
    const char* images = std::getenv("AIRLOCK_IMAGE_DIR");
    if (!images || !*images) GTEST_SKIP() << "AIRLOCK_IMAGE_DIR not set (run `make image`)";
    cfg_ = Config{.data_dir = data_, .image_dir = images, .accel = "tcg"};
    cfg_.template_ram_dir = data_ / "template-ram";  // removed with data_
    // `make image` has normally built it; if not, build it here (a no-op
    // when current, seconds when the kernel package is cached).
    Engine probe(cfg_);
    if (!probe.images().find("minimal")) probe.images().build("minimal");
  }
  void TearDown() override {
    if (data_.empty()) return;
    // Whatever a failed test left: kill it, so nothing outlives the test.
    for (const char* what : {"qemu", "airlock-net"})
      for (pid_t pid : find_processes({what, data_.string()})) ::kill(pid, SIGKILL);
    std::filesystem::remove_all(data_);
  }
  // Runs a shell command in sandbox `id`; returns its stdout.
  std::string sh(Engine& e, const std::string& id, const std::string& cmd, int* code = nullptr) {
    std::string out;
    ExecResult r = e.exec(id, {.cmd = cmd}, {.on_output = [&](int, std::string_view b) {
                            out += b;
                            return true;
                          }});
    if (code) *code = r.exit_code.value_or(-1);
    return out;
  }

  std::filesystem::path data_;
  Config cfg_;
};

}  // namespace airlock::engine::testing

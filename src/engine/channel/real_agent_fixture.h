// The RealAgent fixture: GuestChannel against the real airlock-guest binary
// in its host-test mode (--listen-fd), shared by the channel's test files.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "engine/channel/guest_channel.h"

namespace airlock::channel::test_support {

using namespace std::chrono_literals;

inline Deadline in(std::chrono::milliseconds d) { return Clock::now() + d; }

#ifdef AIRLOCK_GUEST_BIN
class RealAgent : public ::testing::Test {
 protected:
  void SetUp() override {
    if (access(AIRLOCK_GUEST_BIN, X_OK) != 0) GTEST_SKIP() << "no " AIRLOCK_GUEST_BIN;
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    pid_ = fork();
    ASSERT_GE(pid_, 0);
    if (pid_ == 0) {
      int fd = dup(sv[1]);  // without CLOEXEC
      std::string n = std::to_string(fd);
      execl(AIRLOCK_GUEST_BIN, AIRLOCK_GUEST_BIN, "--listen-fd", n.c_str(), (char*)nullptr);
      _exit(127);
    }
    ::close(sv[1]);
    ch_ = GuestChannel::from_fd(sv[0]);
    hello_ = ch_->hello({.hostname = "sb-test"}, in(10s));
    char tmpl[] = "/tmp/airlock-chan-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    ch_.reset();
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  nlohmann::json run(std::vector<std::string> argv, std::string* out = nullptr,
                     std::string* err = nullptr, ChunkSource in_src = nullptr,
                     nlohmann::json extra = nlohmann::json::object()) {
    extra["argv"] = argv;
    return ch_->exec(ch_->open_stream(), extra, in_src,
                     {.on_output =
                          [&](int c, std::string_view b) {
                            std::string* dst = c == 1 ? out : err;
                            if (dst) *dst += b;
                            return true;
                          }},
                     in(60s));
  }
  pid_t pid_ = -1;
  std::unique_ptr<GuestChannel> ch_;
  nlohmann::json hello_;
  std::string dir_;
};
#endif

}  // namespace airlock::channel::test_support

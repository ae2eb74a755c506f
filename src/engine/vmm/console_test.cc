// The console log lives in run_dir, where the jailed QEMU can create names:
// the daemon must never write or read through a link planted there.
#include "engine/vmm/console.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "common/process.h"

namespace airlock::vmm {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

class ConsoleLinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/alconXXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    run_ = dir_ / "run";
    fs::create_directory(run_);
    secret_ = dir_ / "host-secret";
    std::ofstream(secret_) << "SECRET\n";
    // A console socket the capture connects to (QEMU's side, played here).
    listen_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::string path = (run_ / "console.sock").string();
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
    ASSERT_EQ(::bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    ASSERT_EQ(::listen(listen_, 1), 0);
  }
  void TearDown() override {
    if (peer_ >= 0) ::close(peer_);
    ::close(listen_);
    fs::remove_all(dir_);
  }
  void accept_peer() {
    peer_ = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
    ASSERT_GE(peer_, 0);
  }
  void send(const std::string& s) {
    ASSERT_EQ(::write(peer_, s.data(), s.size()), static_cast<ssize_t>(s.size()));
  }
  fs::path dir_, run_, secret_;
  int listen_ = -1, peer_ = -1;
};

TEST_F(ConsoleLinkTest, PlantedLinksAreNeitherTruncatedNorRead) {
  fs::create_symlink(secret_, run_ / "console.log");
  fs::create_symlink(secret_, run_ / "console.log.old");
  {
    // Re-adoption appends: a link at console.log must not be opened.
    ConsoleCapture cap(run_ / "console.sock", run_ / "console.log", 8192, /*truncate=*/false,
                       std::chrono::steady_clock::now() + 5s);
    accept_peer();
    EXPECT_EQ(console_tail(run_ / "console.log", 5), "");  // .old is a link: not read
    // Past half the cap: rotation (rename, then a fresh log) happens too.
    for (int i = 0; i < 20; ++i) send(std::string(999, 'x') + "\n");
    send("last line\n");
    for (int i = 0; i < 200 && console_tail(run_ / "console.log", 1) != "last line"; ++i)
      std::this_thread::sleep_for(10ms);
    EXPECT_EQ(console_tail(run_ / "console.log", 1), "last line");
  }
  EXPECT_EQ(slurp(secret_), "SECRET\n");
  EXPECT_FALSE(fs::is_symlink(run_ / "console.log"));
}

TEST(NofollowFiles, ReadFileCappedRefusesLinksAndFifos) {
  char tmpl[] = "/tmp/alnofXXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  fs::path d = tmpl;
  std::ofstream(d / "real") << "data";
  fs::create_symlink(d / "real", d / "link");
  ASSERT_EQ(::mkfifo((d / "fifo").c_str(), 0600), 0);
  EXPECT_EQ(read_file_capped(d / "real", 100), "data");
  EXPECT_EQ(read_file_capped(d / "link", 100), "");
  EXPECT_EQ(read_file_capped(d / "fifo", 100), "");  // and it did not block
  int fd = create_file_nofollow(d / "link", 0600);
  ASSERT_GE(fd, 0);
  ::close(fd);
  EXPECT_FALSE(fs::is_symlink(d / "link"));
  EXPECT_EQ(read_file_capped(d / "real", 100), "data");  // the target was not truncated
  fs::remove_all(d);
}

}  // namespace
}  // namespace airlock::vmm

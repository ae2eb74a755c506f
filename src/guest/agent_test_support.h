// The test driver of the real airlock-guest binary (agent_test.cc,
// agent_attach_test.cc): an Agent on a socketpair speaking the protocol.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "protocol/frame.h"
#include "protocol/messages.h"

namespace airlock::guest {
namespace {

using nlohmann::json;
using protocol::Frame;
using protocol::Type;
namespace fs = std::filesystem;

struct StreamResult {
  std::string out, err;
  std::vector<json> events;
  json response;
  bool done = false;
  bool eof[3] = {false, false, false};
  uint64_t in_credit = protocol::kInitialCredit;
};

// A writable cgroup2 directory for exec cgroups, or "" (then tree-kill
// falls back to process groups and the setsid case is not asserted).
std::string test_cgroup_root() {
  for (const char* m : {"/sys/fs/cgroup/unified", "/sys/fs/cgroup"}) {
    struct statfs f {};
    if (statfs(m, &f) != 0 || f.f_type != 0x63677270) continue;
    std::string dir = std::string(m) + "/airlock-test-" + std::to_string(getpid());
    if (mkdir(dir.c_str(), 0755) == 0 || errno == EEXIST) return dir;
  }
  return "";
}

// In a child process: a private mount namespace (and, unless root, a user
// namespace mapping us to root) with a 4 MiB tmpfs at `dir`, a disk the test
// can fill without touching the host's. False if the host allows neither.
bool enter_small_fs(const std::string& dir) {
  const uid_t uid = geteuid();
  const gid_t gid = getegid();
  if (unshare(uid == 0 ? CLONE_NEWNS : CLONE_NEWNS | CLONE_NEWUSER) != 0) return false;
  if (uid != 0) {
    auto put = [](const char* file, const std::string& text) {
      std::ofstream f(file);
      f << text;
      return static_cast<bool>(f.flush());
    };
    if (!put("/proc/self/setgroups", "deny") ||
        !put("/proc/self/uid_map", "0 " + std::to_string(uid) + " 1") ||
        !put("/proc/self/gid_map", "0 " + std::to_string(gid) + " 1"))
      return false;
  }
  return mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0 &&
         mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=4m,mode=0777") == 0;
}

bool can_make_small_fs(const std::string& dir) {
  pid_t p = fork();
  if (p == 0) _exit(enter_small_fs(dir) ? 0 : 1);
  int st = 0;
  waitpid(p, &st, 0);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

class Agent {
 public:
  // `small_fs`: a directory where the agent (alone) sees a 4 MiB tmpfs.
  explicit Agent(std::string cgroup_root = "", std::string small_fs = "")
      : cgroup_root_(std::move(cgroup_root)) {
    int sv[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    pid_ = fork();
    if (pid_ == 0) {
      if (!small_fs.empty() && !enter_small_fs(small_fs)) _exit(126);
      dup2(sv[1], 3);
      std::vector<const char*> args = {AIRLOCK_GUEST_BIN, "--listen-fd", "3"};
      if (!cgroup_root_.empty()) {
        args.push_back("--cgroup-root");
        args.push_back(cgroup_root_.c_str());
      }
      args.push_back(nullptr);
      execv(args[0], const_cast<char**>(args.data()));
      _exit(127);
    }
    close(sv[1]);
    fd_ = sv[0];
  }
  ~Agent() {
    close(fd_);
    int status = 0;
    for (int i = 0; i < 100 && waitpid(pid_, &status, WNOHANG) == 0; ++i) usleep(20000);
    if (waitpid(pid_, &status, WNOHANG) == 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      ADD_FAILURE() << "agent did not exit after the socket closed";
    }
  }

  void raw(const std::string& bytes) {
    size_t off = 0;
    while (off < bytes.size()) {
      ssize_t n = write(fd_, bytes.data() + off, bytes.size() - off);
      if (n < 0 && errno == EINTR) continue;
      ASSERT_GT(n, 0);
      off += n;
    }
  }
  void send(const Frame& f) { raw(protocol::encode(f)); }
  void send_json(Type t, uint32_t stream, const json& j) {
    send(protocol::json_frame(t, stream, j));
  }
  void send_eof(uint32_t stream) {
    Frame f;
    f.type = Type::eof;
    f.stream = stream;
    send(f);
  }

  // Reads one frame (or nullopt after timeout_ms).
  std::optional<Frame> recv(int timeout_ms = 20000) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      if (auto f = dec_.next()) return f;
      int left = std::chrono::duration_cast<std::chrono::milliseconds>(
                     deadline - std::chrono::steady_clock::now())
                     .count();
      if (left <= 0) return std::nullopt;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, left) <= 0) continue;
      char buf[65536];
      ssize_t n = read(fd_, buf, sizeof buf);
      if (n <= 0) return std::nullopt;
      dec_.feed(buf, n);
    }
  }

  json hello() {
    send_json(Type::hello, 0, {{"version", 1}, {"hostname", "sb-test"}});
    for (;;) {
      auto f = recv();
      if (!f) return json();
      if (f->type == Type::hello) return protocol::parse_json(*f);
    }
  }

  // Routes one received frame to its stream; grants credit as data is
  // "consumed" unless hold_credit.
  void dispatch(const Frame& f) {
    StreamResult& r = streams_[f.stream];
    switch (f.type) {
      case Type::data:
        (f.channel == 2 ? r.err : r.out) += f.payload;
        if (!hold_credit) send(protocol::make_credit(f.stream, f.channel, f.payload.size()));
        break;
      case Type::eof:
        r.eof[f.channel] = true;
        break;
      case Type::event:
        r.events.push_back(protocol::parse_json(f));
        break;
      case Type::credit:
        r.in_credit += protocol::parse_credit(f);
        break;
      case Type::response:
        r.response = protocol::parse_json(f);
        r.done = true;
        break;
      default:
        ADD_FAILURE() << "unexpected frame type " << int(f.type);
    }
  }

  StreamResult& wait(uint32_t stream, int timeout_ms = 30000) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (!streams_[stream].done && std::chrono::steady_clock::now() < deadline) {
      auto f = recv(200);
      if (f) dispatch(*f);
    }
    EXPECT_TRUE(streams_[stream].done) << "stream " << stream << " got no response";
    return streams_[stream];
  }

  // Sends `data` on channel 0 obeying the guest's credit, then eof.
  void send_input(uint32_t stream, const std::string& data) {
    size_t off = 0;
    while (off < data.size()) {
      StreamResult& r = streams_[stream];
      if (r.done) return;
      if (r.in_credit == 0) {
        if (auto f = recv(1000)) dispatch(*f);
        continue;
      }
      size_t n = std::min<size_t>({data.size() - off, protocol::kMaxPayload, r.in_credit});
      Frame f;
      f.type = Type::data;
      f.stream = stream;
      f.payload = data.substr(off, n);
      send(f);
      r.in_credit -= n;
      off += n;
    }
    send_eof(stream);
  }

  StreamResult& exec(json req, const std::string* input = nullptr) {
    uint32_t id = next_id_++;
    req["op"] = "exec";
    if (input) req["stdin"] = true;
    send_json(Type::request, id, req);
    if (input) send_input(id, *input);
    return wait(id);
  }

  json call(json req) {
    uint32_t id = next_id_++;
    send_json(Type::request, id, req);
    return wait(id).response;
  }

  uint32_t next_id_ = 1;
  bool hold_credit = false;
  std::map<uint32_t, StreamResult> streams_;

 private:
  std::string cgroup_root_;
  pid_t pid_ = -1;
  int fd_ = -1;
  protocol::Decoder dec_;
};

// The test's scratch directory, removed when the test process exits (each
// ctest case is a process of its own); a forked child exiting leaves it.
fs::path temp_dir() {
  struct Scratch {
    pid_t owner = getpid();
    fs::path path = fs::temp_directory_path() / ("airlock-guest-test-" + std::to_string(owner));
    ~Scratch() {
      std::error_code ec;
      if (getpid() == owner) fs::remove_all(path, ec);
    }
  };
  static Scratch scratch;
  fs::create_directories(scratch.path);
  return scratch.path;
}

}  // namespace
}  // namespace airlock::guest

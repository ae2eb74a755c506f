// FakeSandboxService (fake_service_test_support.h): sandboxes and files in
// memory. Commands understood by exec (argv[0]):
//   echo ARGS...   stdout = ARGS joined by spaces
//   bytes          stdout = all 256 byte values, stderr = "err"
//   cat            stdout = stdin (with stdin_stream: each write_stdin
//                  chunk as it comes, until eof)
//   exit N         exit code N          kill9          ends by signal 9
//   slow N         timed out after N chunks    fail-late  error after start
//   hang           runs until kill_exec
//   drip           stdout "a\n", then (after kill_exec) "b\n" and exit 0
//   tick MS N      N lines "tick\n", MS milliseconds apart
//   flood N        N chunks of 64 KiB (stops when the client is gone)
//   start-twice    calls on_start twice (a forged second `started`)
//   pty            (request.pty) echoes pty_input back; a resize writes
//                  "size COLSxROWS\r\n"; byte 4 (Ctrl-D) exits 0, kill_exec
//                  ends it by that signal; argv empty = the same
//   connect IP PORT  a TCP flow decided by the sandbox's policy: records
//                  net_flow (and net_flow_end with 10/20 bytes if allowed)
#include "daemon/fake_service_test_support.h"

#include <poll.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

#include "common/error.h"
#include "common/metrics/metrics.h"
#include "engine/net/policy.h"

namespace airlock::daemon {
// The fake speaks the engine's types throughout.
using namespace airlock::engine;

struct FakeSandboxService::Impl {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, SandboxInfo> boxes;
  std::map<std::string, std::string> files;  // id + path -> content
  std::map<std::string, std::vector<nlohmann::json>> audit;
  std::set<std::string> killed;               // exec ids
  std::map<std::string, std::string> pty_in;  // exec id -> input not yet echoed
  std::set<std::string> pty_live;             // pty execs running
  std::map<std::string, int> pty_signal;      // exec id -> signal from kill_exec
  int next = 1;
  // Streamed stdin of running `cat` execs: exec id -> chunks, "" = eof.
  std::map<std::string, std::deque<std::string>> stdin_queues;
  std::set<std::string> stdin_closed;  // eof sent or exec ended

  using Out = std::function<bool(int, std::string_view)>;
  // A terminal that echoes its input until ^D (exit 0) or a kill_exec.
  void run_pty(ExecResult& r, const ExecRequest::Pty& pty, const Out& out) {
    out(1, "size " + std::to_string(pty.cols) + "x" + std::to_string(pty.rows) + "\r\n");
    std::unique_lock lock(mu);
    for (;;) {
      cv.wait(lock, [&] { return !pty_in[r.exec_id].empty() || pty_signal.count(r.exec_id); });
      if (pty_signal.count(r.exec_id)) {
        r.signal = pty_signal[r.exec_id];
        r.reason = "killed";
        break;
      }
      std::string in = std::move(pty_in[r.exec_id]);
      pty_in[r.exec_id].clear();
      size_t eot = in.find('\x04');
      lock.unlock();
      bool alive = out(1, in.substr(0, eot));
      lock.lock();
      if (!alive) {
        r.signal = 9;
        r.reason = "killed";
        break;
      }
      if (eot != std::string::npos) {
        r.exit_code = 0;
        r.reason = "exited";
        break;
      }
    }
    pty_live.erase(r.exec_id);
  }
  // `cat` on streamed stdin: echoes each chunk until eof or a kill.
  void run_cat_stream(ExecResult& r, const Out& out) {
    for (;;) {
      std::string chunk;
      {
        std::unique_lock lock(mu);
        auto& q = stdin_queues[r.exec_id];
        cv.wait(lock, [&] { return !q.empty() || killed.count(r.exec_id); });
        if (q.empty() || q.front().empty()) break;
        chunk = std::move(q.front());
        q.pop_front();
      }
      r.stdin_bytes += chunk.size();
      out(1, chunk);
    }
    std::lock_guard lock(mu);
    stdin_queues.erase(r.exec_id);
    stdin_closed.insert(r.exec_id);
  }
  // `connect IP PORT`: the policy's decision journaled as the helper would
  // (a flow, and its end when allowed); true if allowed.
  bool connect(const std::string& id, const nlohmann::json& network,
               const std::vector<std::string>& argv) {
    auto policy = net::NetworkPolicy::parse(network);
    auto ip = net::IpAddr::parse(argv.at(1));
    if (!ip) throw Error(Errc::invalid_argument, "bad address", "argv");
    uint16_t port = uint16_t(std::stoi(argv.at(2)));
    net::Decision d = policy.decide(*ip, port, net::Proto::tcp);
    nlohmann::json flow = {{"ts", "2026-12-02T11:00:00.000Z"},
                           {"sandbox", id},
                           {"event", "net_flow"},
                           {"proto", "tcp"},
                           {"dst", ip->to_string()},
                           {"port", port},
                           {"name", ""},
                           {"rule", d.rule},
                           {"allowed", d.allowed}};
    std::lock_guard lock(mu);
    audit[id].push_back(flow);
    if (d.allowed) {
      flow["event"] = "net_flow_end";
      flow["bytes_out"] = 10;
      flow["bytes_in"] = 20;
      flow["duration_ms"] = 5;
      flow["reason"] = "fin";
      audit[id].push_back(flow);
    }
    return d.allowed;
  }
};

FakeSandboxService::FakeSandboxService() : impl_(std::make_unique<Impl>()) {}
FakeSandboxService::~FakeSandboxService() = default;

SandboxInfo FakeSandboxService::create(const SandboxSpec& spec) {
  if (spec.image != "minimal")
    throw Error(Errc::not_found, "no image named '" + spec.image + "'", "image");
  std::lock_guard lock(impl_->mu);
  SandboxInfo info;
  char id[32];
  std::snprintf(id, sizeof id, "sb-%012d", impl_->next++);
  info.id = id;
  info.spec = spec;
  info.state = State::running;
  info.accel = "tcg";
  info.start = "boot";
  impl_->boxes[info.id] = info;
  impl_->audit[info.id].push_back({{"ts", "t0"}, {"sandbox", info.id}, {"event", "created"}});
  return info;
}

std::vector<SandboxInfo> FakeSandboxService::list(const std::map<std::string, std::string>& filter,
                                                  bool all) {
  std::lock_guard lock(impl_->mu);
  std::vector<SandboxInfo> out;
  for (auto& [id, sb] : impl_->boxes) {
    if (!all && sb.state != State::running) continue;
    bool match = true;
    for (auto& [k, v] : filter) {
      auto it = sb.spec.metadata.find(k);
      match = match && it != sb.spec.metadata.end() && it->second == v;
    }
    if (match) out.push_back(sb);
  }
  return out;
}

SandboxInfo FakeSandboxService::get(const std::string& id) {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->boxes.find(id);
  if (it == impl_->boxes.end()) throw Error(Errc::not_found, "no sandbox " + id, "id");
  return it->second;
}

void FakeSandboxService::destroy(const std::string& id) {
  get(id);
  std::lock_guard lock(impl_->mu);
  if (impl_->boxes[id].state == State::deleted)
    throw Error(Errc::not_found, "sandbox " + id + " is already deleted", "id");
  impl_->boxes[id].state = State::deleted;
  impl_->audit[id].push_back({{"ts", "t1"}, {"sandbox", id}, {"event", "deleted"}});
}

// The fake has no teardown to wait for.
void FakeSandboxService::destroy_and_wait(const std::string& id) { destroy(id); }

SandboxInfo FakeSandboxService::set_timeout(const std::string& id, int seconds) {
  if (get(id).state != State::running) throw Error(Errc::conflict, "sandbox is not running");
  std::lock_guard lock(impl_->mu);
  auto& box = impl_->boxes[id];
  box.spec.timeout_s = seconds;
  box.expires_at_ms = box.created_at_ms + int64_t{seconds} * 1000;
  return box;
}

ExecResult FakeSandboxService::exec(const std::string& id, const ExecRequest& req,
                                    const ExecCallbacks& cb) {
  if (get(id).state != State::running) throw Error(Errc::conflict, "sandbox is not running");
  std::vector<std::string> argv = req.argv;
  if (argv.empty() && req.pty) argv = {"pty"};
  if (argv.empty()) argv = {"sh", "-c", req.cmd};
  ExecResult r;
  r.exec_id = "ex-" + std::to_string(impl_->next++);
  if (argv[0] == "fail-early") throw Error(Errc::invalid_argument, "no such program", "argv");
  if (req.stdin_stream) {
    std::lock_guard lock(impl_->mu);
    impl_->stdin_queues[r.exec_id];  // open before the client can know the id
  }
  if (req.pty && argv[0] == "pty") {
    std::lock_guard lock(impl_->mu);
    impl_->pty_live.insert(r.exec_id);  // before the start: input may follow at once
  }
  cb.on_start(r.exec_id, 42);
  auto out = [&](int ch, std::string_view s) {
    (ch == 1 ? r.stdout_bytes : r.stderr_bytes) += s.size();
    return cb.on_output(ch, s);
  };
  const std::string& cmd = argv[0];
  if (cmd == "pty" && req.pty) {
    impl_->run_pty(r, *req.pty, out);
    return r;
  } else if (cmd == "echo") {
    std::string s;
    for (size_t i = 1; i < argv.size(); ++i) s += (i > 1 ? " " : "") + argv[i];
    out(1, s + "\n");
  } else if (cmd == "bytes") {
    std::string all;
    for (int i = 0; i < 256; ++i) all += static_cast<char>(i);
    out(1, all);
    out(2, "err");
  } else if (cmd == "cat" && req.stdin_stream) {
    impl_->run_cat_stream(r, out);
  } else if (cmd == "cat") {
    r.stdin_bytes = req.stdin_data ? req.stdin_data->size() : 0;
    if (req.stdin_data) out(1, *req.stdin_data);
  } else if (cmd == "exit") {
    r.exit_code = std::stoi(argv.at(1));
    return r;
  } else if (cmd == "kill9") {
    r.signal = 9;
    return r;
  } else if (cmd == "slow") {
    for (int i = 0; i < std::stoi(argv.at(1)); ++i) out(1, "tick\n");
    r.timed_out = true;
    r.signal = 9;
    return r;
  } else if (cmd == "fail-late") {
    throw Error(Errc::guest_error, "guest went away");
  } else if (cmd == "connect") {
    r.exit_code = impl_->connect(id, get(id).spec.network, argv) ? 0 : 1;
    return r;
  } else if (cmd == "drip") {
    out(1, "a\n");
    {
      std::unique_lock lock(impl_->mu);
      impl_->cv.wait(lock, [&] { return impl_->killed.count(r.exec_id) > 0; });
    }
    out(1, "b\n");
  } else if (cmd == "tick") {
    for (int i = 0; i < std::stoi(argv.at(2)); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(std::stoi(argv.at(1))));
      if (!out(1, "tick\n")) break;
    }
  } else if (cmd == "flood") {
    std::string chunk(64 * 1024, 'x');
    for (int i = 0; i < std::stoi(argv.at(1)); ++i)
      if (!out(1, chunk)) break;
  } else if (cmd == "start-twice") {
    cb.on_start("ex-forged", 43);
    out(1, "after\n");
  } else if (cmd == "hang") {
    std::unique_lock lock(impl_->mu);
    impl_->cv.wait(lock, [&] { return impl_->killed.count(r.exec_id) > 0; });
    r.signal = 9;
    impl_->audit[id].push_back(
        {{"ts", "t2"}, {"sandbox", id}, {"event", "killed"}, {"exec_id", r.exec_id}});
    return r;
  }
  r.exit_code = 0;
  return r;
}

StdinWrite FakeSandboxService::write_stdin(const std::string& id, const std::string& exec_id,
                                           const ChunkSource& source, bool eof,
                                           const std::function<bool()>&) {
  get(id);
  StdinWrite w;
  {
    std::lock_guard lock(impl_->mu);
    if (impl_->stdin_closed.count(exec_id))
      throw Error(Errc::conflict, "the stdin of exec " + exec_id + " is closed", "exec_id");
    if (!impl_->stdin_queues.count(exec_id))
      throw Error(Errc::not_found, "no exec " + exec_id, "exec_id");
  }
  while (auto chunk = source()) {
    if (chunk->empty()) continue;
    w.bytes += chunk->size();
    std::lock_guard lock(impl_->mu);
    impl_->stdin_queues[exec_id].push_back(std::move(*chunk));
    impl_->cv.notify_all();
  }
  std::lock_guard lock(impl_->mu);
  if (eof) {
    impl_->stdin_queues[exec_id].push_back("");
    impl_->stdin_closed.insert(exec_id);
    impl_->cv.notify_all();
  }
  w.total = w.bytes;
  w.closed = eof;
  return w;
}

void FakeSandboxService::pty_input(const std::string&, const std::string& exec_id,
                                   std::string_view bytes) {
  std::lock_guard lock(impl_->mu);
  if (!impl_->pty_live.count(exec_id))
    throw Error(Errc::not_found, "no running exec " + exec_id, "exec_id");
  impl_->pty_in[exec_id] += bytes;
  impl_->cv.notify_all();
}

void FakeSandboxService::pty_resize(const std::string&, const std::string& exec_id, int cols,
                                    int rows) {
  std::lock_guard lock(impl_->mu);
  if (!impl_->pty_live.count(exec_id))
    throw Error(Errc::not_found, "no running exec " + exec_id, "exec_id");
  impl_->pty_in[exec_id] += "size " + std::to_string(cols) + "x" + std::to_string(rows) + "\r\n";
  impl_->cv.notify_all();
}

void FakeSandboxService::kill_exec(const std::string& id, const std::string& exec_id, int sig) {
  {
    std::lock_guard lock(impl_->mu);
    if (impl_->pty_live.count(exec_id)) {
      impl_->pty_signal[exec_id] = sig;
      impl_->cv.notify_all();
      return;
    }
  }
  get(id);
  std::lock_guard lock(impl_->mu);
  impl_->killed.insert(exec_id);
  impl_->cv.notify_all();
}

uint64_t FakeSandboxService::write_file(const std::string& id, const std::string& path, uint32_t,
                                        const ChunkSource& source) {
  get(id);
  std::string data;
  while (auto chunk = source()) data += *chunk;
  std::lock_guard lock(impl_->mu);
  impl_->files[id + path] = data;
  return data.size();
}

uint64_t FakeSandboxService::read_file(const std::string& id, const std::string& path,
                                       const ChunkSink& sink) {
  get(id);
  std::string data;
  {
    std::lock_guard lock(impl_->mu);
    auto it = impl_->files.find(id + path);
    if (it == impl_->files.end()) throw Error(Errc::not_found, "no file " + path, "path");
    data = it->second;
  }
  for (size_t i = 0; i < data.size(); i += 65536)
    if (!sink(std::string_view(data).substr(i, 65536))) break;
  return data.size();
}

nlohmann::json FakeSandboxService::list_files(const std::string& id, const std::string& path) {
  get(id);
  return nlohmann::json::array({{{"name", "a"}, {"path", path}}});
}
nlohmann::json FakeSandboxService::stat_file(const std::string& id, const std::string& path) {
  get(id);
  std::lock_guard lock(impl_->mu);
  auto it = impl_->files.find(id + path);
  if (it == impl_->files.end()) throw Error(Errc::not_found, "no file " + path, "path");
  return {{"type", "file"}, {"size", it->second.size()}};
}
void FakeSandboxService::make_dir(const std::string& id, const std::string&, bool) { get(id); }
uint64_t FakeSandboxService::write_file_as(const std::string& id, const std::string& path,
                                           uint32_t mode, const ChunkSource& source,
                                           const std::string&) {
  return write_file(id, path, mode, source);
}
nlohmann::json FakeSandboxService::list_files(const std::string& id, const std::string& path, int) {
  return list_files(id, path);
}
nlohmann::json FakeSandboxService::move_file(const std::string& id, const std::string& from,
                                             const std::string& to, const std::string&) {
  get(id);
  std::lock_guard lock(impl_->mu);
  auto it = impl_->files.find(id + from);
  if (it == impl_->files.end()) throw Error(Errc::not_found, "no file " + from, "path");
  impl_->files[id + to] = it->second;
  impl_->files.erase(id + from);
  return {{"name", to.substr(to.rfind('/') + 1)}, {"path", to}, {"type", "file"}};
}
void FakeSandboxService::make_dir_as(const std::string& id, const std::string&,
                                     const std::string&) {
  get(id);
}
void FakeSandboxService::remove_file(const std::string& id, const std::string& path, bool) {
  get(id);
  std::lock_guard lock(impl_->mu);
  if (!impl_->files.erase(id + path)) throw Error(Errc::not_found, "no file " + path, "path");
}
WatchEnd FakeSandboxService::watch_files(const std::string& id, const std::string&, bool,
                                         const WatchCallbacks&) {
  get(id);
  // File watches need a real guest (tests/integration/test_watch.py).
  throw Error(Errc::unavailable, "the fake engine has no guest to watch");
}
std::string FakeSandboxService::guest_home(const std::string& id, const std::string& user) {
  get(id);
  // The fake has no passwd: E2B templates' convention.
  return user.empty() || user == "root" || user == "0" ? "/root" : "/home/" + user;
}
nlohmann::json FakeSandboxService::guest_info(const std::string& id) {
  get(id);
  return {{"kernel", "6.1.0-fake"}};
}
std::vector<nlohmann::json> FakeSandboxService::audit(const std::string& id) {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->audit.find(id);
  if (it == impl_->audit.end()) throw Error(Errc::not_found, "no journal for " + id, "id");
  return it->second;
}
nlohmann::json FakeSandboxService::set_network(const std::string& id,
                                               const nlohmann::json& policy) {
  SandboxInfo sb = get(id);
  if (sb.state != State::running) throw Error(Errc::conflict, "sandbox " + id + " is not running");
  if (sb.spec.network.value("mode", "none") == "none")
    throw Error(Errc::conflict, "sandbox " + id + " has no network interface (mode none)",
                "network.mode");
  auto p = net::NetworkPolicy::parse(policy);
  std::lock_guard lock(impl_->mu);
  impl_->boxes[id].spec.network = p.to_json();
  // "Cut" = allowed flows (recorded by `connect`) the new policy denies.
  int cut = 0;
  for (const auto& e : impl_->audit[id])
    if (e.value("event", "") == "net_flow" && e.value("allowed", false) &&
        !p.decide(*net::IpAddr::parse(e.value("dst", "")), uint16_t(e.value("port", 0)),
                  net::Proto::tcp)
             .allowed)
      ++cut;
  impl_->audit[id].push_back({{"ts", "2026-12-02T11:00:01.000Z"},
                              {"sandbox", id},
                              {"event", "net_policy"},
                              {"policy", p.to_json()}});
  return {{"policy", p.to_json()}, {"flows_cut", cut}};
}
std::vector<nlohmann::json> FakeSandboxService::network_events(const std::string& id, size_t skip) {
  std::vector<nlohmann::json> out;
  for (auto& e : audit(id))
    if (e.value("event", "").rfind("net_", 0) == 0) out.push_back(e);
  out.erase(out.begin(), out.begin() + std::ptrdiff_t(std::min(skip, out.size())));
  return out;
}
namespace {
// Follows the in-memory journal by index; waits by polling (a fake need not
// be woken: 20 ms slices), watching the client's socket like the real one.
// `read` returns the records past `seen` and moves it on.
struct PollingFollower : RecordFollower {
  explicit PollingFollower(std::function<std::vector<nlohmann::json>(size_t& seen)> r)
      : read(std::move(r)) {}
  std::function<std::vector<nlohmann::json>(size_t& seen)> read;
  size_t seen = 0;
  std::vector<nlohmann::json> next() override { return read(seen); }
  Wake wait(std::chrono::milliseconds timeout, int hangup_fd) override {
    pollfd p{hangup_fd, 0, 0};
    int ms = static_cast<int>(std::min<int64_t>(timeout.count(), 20));
    if (::poll(&p, hangup_fd >= 0 ? 1 : 0, ms) > 0 && (p.revents & (POLLHUP | POLLERR)))
      return Wake::hangup;
    return Wake::grew;
  }
};
}  // namespace

std::unique_ptr<RecordFollower> FakeSandboxService::follow_network_events(const std::string& id) {
  audit(id);  // not_found for an unknown id
  return std::make_unique<PollingFollower>([this, id](size_t& seen) {
    auto all = network_events(id, seen);
    seen += all.size();
    return all;
  });
}
nlohmann::json FakeSandboxService::info() { return {{"version", "fake"}, {"accel", "tcg"}}; }
storage::ImageStore& FakeSandboxService::images() {
  throw Error(Errc::internal, "the fake engine has no image store");
}
// Image management is tested against the real engine (test_images.py).
std::vector<std::filesystem::path> FakeSandboxService::disk_roots() { return {}; }
nlohmann::json FakeSandboxService::list_images() { return nlohmann::json::array(); }
nlohmann::json FakeSandboxService::inspect_image(const std::string& name) {
  throw Error(Errc::not_found, "no image '" + name + "'", "name");
}
nlohmann::json FakeSandboxService::import_image(const std::string&, const std::filesystem::path&,
                                                bool) {
  throw Error(Errc::unavailable, "the fake engine cannot import images");
}
void FakeSandboxService::remove_image(const std::string& name) {
  throw Error(Errc::not_found, "no image '" + name + "'", "name");
}
nlohmann::json FakeSandboxService::disk_usage() { return {{"bytes", nlohmann::json::object()}}; }
nlohmann::json FakeSandboxService::prune(bool dry_run) {
  return {{"dry_run", dry_run}, {"freed_bytes", 0}, {"removed", nlohmann::json::array()}};
}
nlohmann::json FakeSandboxService::stats(const std::string& id) {
  auto info = get(id);
  return {{"id", id},           {"state", to_string(info.state)},
          {"cpu_seconds", 0.0}, {"memory_bytes", 0},
          {"disk_bytes", 0},    {"net_rx_bytes", 0},
          {"net_tx_bytes", 0},  {"age_s", 0}};
}

// Features the CLI's HTTP tests do not exercise: real errors, not stubs
// pretending success (their behaviour is tested against the real engine).
namespace {
[[noreturn]] void unsupported(const char* what) {
  throw Error(Errc::unavailable, std::string("the fake engine has no ") + what);
}
}  // namespace
ExecStatus FakeSandboxService::exec_background(const std::string&, const ExecRequest&) {
  unsupported("background execs");
}
std::vector<ExecStatus> FakeSandboxService::list_execs(const std::string&) {
  unsupported("background execs");
}
ExecStatus FakeSandboxService::wait_exec(const std::string&, const std::string&, double) {
  unsupported("background execs");
}
std::optional<ExecResult> FakeSandboxService::attach_exec(const std::string&, const std::string&,
                                                          uint64_t, const AttachCallbacks&) {
  unsupported("attaching to execs");
}
nlohmann::json FakeSandboxService::posture(const std::string&) { unsupported("jail"); }
nlohmann::json FakeSandboxService::add_port(const std::string&, int, int) {
  unsupported("port forwards");
}
nlohmann::json FakeSandboxService::list_ports(const std::string&) { unsupported("port forwards"); }
void FakeSandboxService::remove_port(const std::string&, int) { unsupported("port forwards"); }
nlohmann::json FakeSandboxService::set_pool(const std::string&, int, const nlohmann::json&) {
  unsupported("warm pool");
}
nlohmann::json FakeSandboxService::pool_info() { return nlohmann::json::array(); }
// Image recipes boot build sandboxes on their layers: tested against the
// real engine (tests/integration/test_recipes.py).
SandboxInfo FakeSandboxService::create_on_image(const SandboxSpec&, const storage::Image&) {
  unsupported("image recipes");
}
std::filesystem::path FakeSandboxService::disk_path(const std::string&) {
  unsupported("image recipes");
}
// Pause, resume, snapshots and fork need a VM's state: tested against the
// real engine (engine_snapshot_fake_test, tests/integration/test_snapshots.py).
SandboxInfo FakeSandboxService::pause(const std::string&) { unsupported("pause"); }
SandboxInfo FakeSandboxService::resume(const std::string&) { unsupported("resume"); }
nlohmann::json FakeSandboxService::snapshot(const std::string&, const std::string&, bool) {
  unsupported("snapshots");
}
nlohmann::json FakeSandboxService::list_snapshots() { return nlohmann::json::array(); }
nlohmann::json FakeSandboxService::get_snapshot(const std::string& name) {
  throw Error(Errc::not_found, "no snapshot " + name, "name");
}
void FakeSandboxService::delete_snapshot(const std::string& name) { get_snapshot(name); }
nlohmann::json FakeSandboxService::save_snapshot_image(const std::string& snapshot,
                                                       const std::string&) {
  return get_snapshot(snapshot);
}
std::vector<SandboxInfo> FakeSandboxService::fork(const std::string&, int) { unsupported("fork"); }

// The fake's sandboxes by state; the real families are tested against the
// real engine (tests/integration/test_metrics.py).
void FakeSandboxService::write_metrics(metrics::Writer& out) {
  std::map<metrics::Labels, double> by_state;
  std::lock_guard lock(impl_->mu);
  for (const auto& [id, sb] : impl_->boxes) by_state[{{"state", to_string(sb.state)}}] += 1;
  out.gauge("airlock_sandboxes", "Sandboxes by state", by_state);
}
nlohmann::json FakeSandboxService::readiness() {
  return {{"ready", true}, {"missing", nlohmann::json::array()}};
}

// The journal chain and the disk diff need real files: the fake has no
// chain to check and no disk layers.
nlohmann::json FakeSandboxService::verify_journal(const std::string& id) {
  audit(id);  // not_found for an unknown id
  throw Error(Errc::unavailable, "the fake engine keeps no hash chain");
}
std::unique_ptr<RecordFollower> FakeSandboxService::follow_journal(const std::string& id) {
  audit(id);
  return std::make_unique<PollingFollower>([this, id](size_t& seen) {
    auto all = audit(id);
    std::vector<nlohmann::json> out(
        all.begin() + static_cast<std::ptrdiff_t>(std::min(seen, all.size())), all.end());
    seen = all.size();
    return out;
  });
}
nlohmann::json FakeSandboxService::changes(const std::string& id, const std::string& since, bool) {
  if (since != "start") throw Error(Errc::invalid_argument, "since must be \"start\"", "since");
  get(id);
  throw Error(Errc::unavailable, "the fake engine has no disk layers");
}

}  // namespace airlock::daemon

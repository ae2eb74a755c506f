// The network helper's event path end to end, without a VM: the REAL
// airlock-net helper started the engine's way (nethost::start), this test
// as its QEMU (the -netdev stream protocol with hand-built frames), the
// engine's reader (nethost::attach_events) and a real audit journal. A fake
// helper (a script at the AIRLOCK_NET_HELPER seam) plays a helper a guest
// has taken over. No network: DNS questions for names the policy denies are
// answered by the helper itself.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/process.h"
#include "engine/audit/journal.h"
#include "engine/engine_impl.h"
#include "engine/net/intake.h"
#include "engine/net/packet.h"

namespace airlock::engine {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace std::chrono_literals;

class NetEventsTest : public testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/airlock-netev-XXXXXX";
    ASSERT_TRUE(::mkdtemp(tmpl));
    root_ = tmpl;
    run_ = root_ / "run";
    fs::create_directories(run_);
    journal_.emplace(root_ / "audit");
    ::setenv("AIRLOCK_NET_HELPER", AIRLOCK_NET_HELPER_BIN, 1);
  }
  void TearDown() override {
    reader_.reset();
    if (pid_ > 0) nethost::stop(pid_, run_);
    if (qemu_ >= 0) ::close(qemu_);
    ::unsetenv("AIRLOCK_NET_HELPER");
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  void start(const json& policy = {{"mode", "allowlist"}, {"allow", {"ok.example"}}}) {
    pid_ = nethost::start(cfg_.guest_agent, run_, nethost::normalize(policy));
    reader_ = nethost::attach_events(*journal_, id_, run_, pid_);
  }

  // Connects as QEMU would.
  void connect_qemu() {
    qemu_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::strncpy(sa.sun_path, (run_ / "net.sock").c_str(), sizeof sa.sun_path - 1);
    ASSERT_EQ(::connect(qemu_, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  }

  // `n` DNS questions for names the policy denies; returns after the
  // helper answered them all (so all were decided and reported).
  void dns_flood(int n, int first = 0) {
    net::Endpoint guest{{0x52, 0x54, 0, 0x12, 0x34, 0x56}, *net::IpAddr::parse("10.0.2.15"), 0};
    net::Endpoint dns{{0x52, 0x55, 0x0a, 0, 2, 2}, *net::IpAddr::parse("10.0.2.3"), 53};
    // Sent from a thread while this one reads the answers: the helper
    // blocks on a full QEMU socket, as it does with QEMU.
    std::thread sender([&, guest]() mutable {
      for (int i = first; i < first + n; ++i) {
        std::string label = "q" + std::to_string(i);
        std::vector<uint8_t> q = {uint8_t(i >> 8), uint8_t(i), 1, 0, 0, 1, 0, 0, 0, 0, 0, 0};
        q.push_back(static_cast<uint8_t>(label.size()));
        q.insert(q.end(), label.begin(), label.end());
        q.insert(q.end(), {4, 'd', 'e', 'n', 'y', 0, 0, 1, 0, 1});
        guest.port = static_cast<uint16_t>(10000 + i % 50000);
        auto frame = net::make_udp(guest, dns, q);
        uint8_t len[4] = {0, 0, uint8_t(frame.size() >> 8), uint8_t(frame.size())};
        frame.insert(frame.begin(), len, len + 4);
        if (::send(qemu_, frame.data(), frame.size(), MSG_NOSIGNAL) !=
            static_cast<ssize_t>(frame.size()))
          return;
      }
    });
    // Read answers: one frame per question (ARP/RA frames from slirp may mix in).
    int answers = 0;
    std::vector<uint8_t> buf;
    auto deadline = std::chrono::steady_clock::now() + 30s;
    while (answers < n && std::chrono::steady_clock::now() < deadline) {
      uint8_t chunk[65536];
      ssize_t r = ::recv(qemu_, chunk, sizeof chunk, MSG_DONTWAIT);
      if (r <= 0) {
        std::this_thread::sleep_for(1ms);
        continue;
      }
      buf.insert(buf.end(), chunk, chunk + r);
      size_t off = 0;
      while (buf.size() - off >= 4) {
        size_t l = (size_t(buf[off]) << 24) | (size_t(buf[off + 1]) << 16) |
                   (size_t(buf[off + 2]) << 8) | buf[off + 3];
        if (buf.size() - off - 4 < l) break;
        auto f = net::parse_frame(std::span(buf.data() + off + 4, l));
        if (f && f->l4 == net::kIpUDP && f->sport == 53) ++answers;
        off += 4 + l;
      }
      buf.erase(buf.begin(), buf.begin() + static_cast<long>(off));
    }
    sender.join();
    ASSERT_EQ(answers, n);
  }

  std::vector<json> records(const std::string& event) {
    std::vector<json> out;
    for (auto& r : journal_->read(id_))
      if (r["event"] == event) out.push_back(r);
    return out;
  }

  // Waits until `pred` holds for the journal (the reader is asynchronous).
  template <typename Pred>
  bool eventually(Pred pred) {
    for (int i = 0; i < 100; ++i) {
      try {
        if (pred()) return true;
      } catch (const Error&) {  // no journal yet
      }
      std::this_thread::sleep_for(50ms);
    }
    return false;
  }

  Config cfg_;
  std::string id_ = "sb-0123456789ab";
  fs::path root_, run_;
  std::optional<AuditJournal> journal_;
  pid_t pid_ = 0;
  int qemu_ = -1;
  std::shared_ptr<nethost::EventReader> reader_;
};

// Issue 9: the helper cannot reach the journal: its root is empty and it
// holds no descriptor of a file or directory of the host (before: the
// journal itself was open for append, the whole host filesystem visible).
TEST_F(NetEventsTest, HelperSeesNoFileOfTheHost) {
  start();
  connect_qemu();
  dns_flood(1);  // QEMU connected and served: the helper is fully confined
  std::error_code ec;
  auto root = fs::path("/proc") / std::to_string(pid_) / "root";
  EXPECT_EQ(std::distance(fs::directory_iterator(root, ec), fs::directory_iterator()), 0)
      << "the helper's root is not empty";
  EXPECT_FALSE(ec) << ec.message();
  for (auto& fd : fs::directory_iterator(fs::path("/proc") / std::to_string(pid_) / "fd")) {
    std::string target = fs::read_symlink(fd.path(), ec).string();
    EXPECT_TRUE(target.starts_with("socket:") || target.starts_with("pipe:") ||
                target.starts_with("anon_inode:") || target == "/dev/null" ||
                target == (run_ / "net.log").string())
        << fd.path() << " -> " << target;
    EXPECT_EQ(target.find(root_.string() + "/audit"), std::string::npos) << target;
  }
  // The journal has the helper's report, stamped by the daemon.
  ASSERT_TRUE(eventually([&] { return !records("net_dns").empty(); }));
  auto r = records("net_dns")[0];
  EXPECT_EQ(r["sandbox"], id_);
  EXPECT_EQ(r["name"], "q0.deny");
  EXPECT_EQ(r["allowed"], false);
  EXPECT_EQ(r["ts"].get<std::string>().size(), 24u);
}

// Issue 9: a guest's flood of DNS lookups gives a bounded number of records
// and an exact count of the rest (helper's and daemon's limits together).
TEST_F(NetEventsTest, DnsFloodIsBoundedAndCountedExactly) {
  start();
  connect_qemu();
  const int kFlood = 3000;
  auto t0 = std::chrono::steady_clock::now();
  dns_flood(kFlood);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // QEMU goes away: the helper ends its flows, flushes its counts and exits.
  ::close(qemu_);
  qemu_ = -1;
  EXPECT_TRUE(wait_gone(pid_, 5s));
  reader_.reset();  // the final summary
  auto dns = records("net_dns");
  uint64_t counted = 0;
  for (auto& s : records("net_suppressed")) {
    counted += s["counts"].value("net_dns_denied", 0);
    if (s.contains("helper_counts")) counted += s["helper_counts"].value("net_dns_denied", 0);
    EXPECT_EQ(s["invalid"], 0);
  }
  net::IntakeConfig limits;
  EXPECT_LE(dns.size(), limits.burst + limits.per_second * (secs + 1) + 1) << secs << " s";
  EXPECT_GE(dns.size(), limits.burst);
  EXPECT_EQ(dns.size() + counted, static_cast<size_t>(kFlood))
      << dns.size() << " recorded, " << counted << " counted";
}

// A restarted daemon re-attaches: what happened while no daemon listened was
// queued by the helper and arrives with the new reader.
TEST_F(NetEventsTest, EventsSurviveADaemonRestart) {
  start();
  connect_qemu();
  dns_flood(5);
  ASSERT_TRUE(eventually([&] { return records("net_dns").size() == 5; }));
  reader_.reset();  // the daemon is gone
  dns_flood(7, 5);
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(records("net_dns").size(), 5u);
  reader_ = nethost::attach_events(*journal_, id_, run_, pid_);  // re-adoption
  ASSERT_TRUE(eventually([&] { return records("net_dns").size() == 12; }));
  EXPECT_EQ(records("net_dns").back()["name"], "q11.deny");
}

// Issue 9: a helper a guest took over (here: a script at the helper seam)
// sends forged reports, and also tries the journal path the old interface
// handed it. None reaches the journal as such; they are counted.
TEST_F(NetEventsTest, ForgedReportsNeverReachTheJournal) {
  fs::path fake = root_ / "fake-airlock-net";
  std::ofstream(fake) << R"PY(#!/usr/bin/env python3
import json, os, socket, sys
args = sys.argv[1:]
opt = lambda k: args[args.index(k) + 1] if k in args else None
forged = [
    {"event": "exec", "argv": ["rm", "-rf", "/"], "exit_code": 0},
    {"event": "deleted", "reason": "user"},
    {"event": "net_dns", "ts": "2000-01-01T00:00:00.000Z", "name": "a", "allowed": True,
     "rule": "open", "rcode": "NOERROR"},
    {"event": "net_dns", "sandbox": "sb-ffffffffffff", "name": "a", "allowed": True,
     "rule": "open", "rcode": "NOERROR"},
    {"event": "net_flow", "proto": "tcp", "dst": "203.0.113.1", "name": "", "rule": "open",
     "allowed": "yes"},
]
lines = "".join(json.dumps(f) + "\n" for f in forged)
lines += "x" * 20000 + "\n"
lines += json.dumps({"event": "net_dns", "name": "real.example", "allowed": True,
                     "rule": "open", "rcode": "NOERROR"}) + "\n"
if opt("--events"):  # the old interface: the journal itself
    with open(opt("--events"), "a") as f:
        f.write(lines)
ev = opt("--events-socket")
srv = None
if ev:
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(ev)
    srv.listen(1)
qemu = socket.socket(socket.AF_UNIX)
qemu.bind(opt("--qemu-socket"))
qemu.listen(1)
print(json.dumps({"ready": True, "pid": os.getpid()}), flush=True)
if srv:
    c, _ = srv.accept()
    c.sendall(lines.encode())
    c.recv(1)
)PY";
  fs::permissions(fake, fs::perms::owner_all);
  ::setenv("AIRLOCK_NET_HELPER", fake.c_str(), 1);
  start({{"mode", "open"}});
  ASSERT_TRUE(eventually([&] { return records("net_dns").size() == 1; }));
  nethost::stop(pid_, run_);
  pid_ = 0;
  reader_.reset();
  auto all = journal_->read(id_);
  for (auto& r : all) {
    EXPECT_NE(r["event"], "exec") << r.dump();
    EXPECT_NE(r["event"], "deleted") << r.dump();
    EXPECT_EQ(r["sandbox"], id_) << r.dump();
    EXPECT_NE(r["ts"], "2000-01-01T00:00:00.000Z") << r.dump();
    EXPECT_NE(r.value("allowed", json()), "yes") << r.dump();
  }
  auto dns = records("net_dns");
  ASSERT_EQ(dns.size(), 1u);
  EXPECT_EQ(dns[0]["name"], "real.example");
  auto sup = records("net_suppressed");
  ASSERT_EQ(sup.size(), 1u);
  EXPECT_EQ(sup[0]["invalid"], 6);
}

}  // namespace
}  // namespace airlock::engine

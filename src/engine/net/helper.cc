#include "engine/net/helper.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <sys/capability.h>
#include <sys/eventfd.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <fstream>
#include <iostream>
#include <list>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "common/error.h"

extern "C" {
#include <libslirp.h>
}

namespace airlock::net {

// ---- StreamDecoder ----

void StreamDecoder::append(const uint8_t* data, size_t n) {
  if (pos_ > 0 && pos_ == buf_.size()) {
    buf_.clear();
    pos_ = 0;
  } else if (pos_ > (1 << 20)) {
    buf_.erase(buf_.begin(), buf_.begin() + static_cast<long>(pos_));
    pos_ = 0;
  }
  buf_.insert(buf_.end(), data, data + n);
}

std::optional<std::vector<uint8_t>> StreamDecoder::next() {
  if (buf_.size() - pos_ < 4) return std::nullopt;
  const uint8_t* p = buf_.data() + pos_;
  uint32_t len = (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3];
  if (len == 0 || len > kMaxFrame)
    throw Error(Errc::protocol_error,
                "QEMU stream frame length " + std::to_string(len) + " is out of range");
  if (buf_.size() - pos_ - 4 < len) return std::nullopt;
  std::vector<uint8_t> frame(p + 4, p + 4 + len);
  pos_ += 4 + len;
  return frame;
}

namespace {

// `private_mode`: the socket file is 0600 from its creation (umask), so
// only the daemon's uid can connect (the run dir is shared with the jail).
int listen_unix(const std::string& path, bool private_mode = false) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (path.size() >= sizeof sa.sun_path)
    throw Error(Errc::invalid_argument, "socket path too long: " + path, "socket");
  memcpy(sa.sun_path, path.c_str(), path.size() + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw_errno("socket");
  unlink(path.c_str());
  mode_t old = private_mode ? umask(0177) : 0;  // still one thread: umask is process-wide
  int rc = bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
  if (private_mode) umask(old);
  if (rc != 0) throw_errno("bind " + path);
  if (listen(fd, 8) != 0) throw_errno("listen " + path);
  return fd;
}

void write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) throw_errno("write");
    p += w;
    n -= static_cast<size_t>(w);
  }
}

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Resolver workers: each owns a HostResolver initialised before lock_down(),
// so no worker ever needs to open a file afterwards.
class ResolverPool {
 public:
  ResolverPool(int threads, const std::string& upstream) {
    efd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (efd_ < 0) throw_errno("eventfd");
    std::atomic<int> ready{0};
    for (int i = 0; i < threads; ++i) {
      threads_.emplace_back([this, upstream, &ready] {
        HostResolver resolver(upstream);
        ready.fetch_add(1);
        ready.notify_all();
        work(resolver);
      });
    }
    for (int r = ready.load(); r < threads; r = ready.load()) ready.wait(r);
  }
  ~ResolverPool() = delete;  // never destroyed, see run_helper()
  int fd() const { return efd_; }
  void submit(DnsRequest req) {
    std::lock_guard lock(mu_);
    jobs_.push_back(std::move(req));
    cv_.notify_one();
  }
  std::deque<std::pair<DnsRequest, Resolution>> take() {
    uint64_t v;
    [[maybe_unused]] auto r = read(efd_, &v, sizeof v);
    std::lock_guard lock(mu_);
    return std::exchange(results_, {});
  }

 private:
  void work(HostResolver& resolver) {
    for (;;) {
      DnsRequest req;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return !jobs_.empty(); });
        req = std::move(jobs_.front());
        jobs_.pop_front();
      }
      Resolution res = resolver.resolve(req.name, req.query.qtype);
      {
        std::lock_guard lock(mu_);
        results_.emplace_back(std::move(req), std::move(res));
      }
      uint64_t one = 1;
      [[maybe_unused]] auto w = write(efd_, &one, sizeof one);
    }
  }
  int efd_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<DnsRequest> jobs_;
  std::deque<std::pair<DnsRequest, Resolution>> results_;
  std::vector<std::thread> threads_;
};

// The helper's event reports to the daemon (docs/network.md "Event
// intake"): JSON lines on a unix socket the daemon connects to. One
// subscriber at a time (a new connection replaces the old one: a restarted
// daemon). Lines wait in a bounded queue while no daemon is connected or it
// reads slowly; beyond the bound they are dropped and counted, and the
// counts are reported (net_suppressed, per kind) once there is room.
class EventOut {
 public:
  static constexpr size_t kMaxQueued = 1 << 20;  // bytes

  void listen(const std::string& path) {
    listen_ = listen_unix(path, true);
    fcntl(listen_, F_SETFL, O_NONBLOCK);
  }
  int listen_fd() const { return listen_; }
  int subscriber() const { return sub_; }
  bool want_write() const { return sub_ >= 0 && !queue_.empty(); }

  void accept_one() {
    int c = accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) return;
    if (sub_ >= 0) close(sub_);
    sub_ = c;
    if (sent_ > 0) {  // the old subscriber got part of the first line: drop it
      drop_front();
      ++lost_["net_flow_end"];
    }
    flush();
  }

  void push(const nlohmann::json& j) {
    std::string line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    if (queued_ + line.size() > kMaxQueued) {
      std::string kind = j.value("event", "");
      if (j.contains("allowed") && j["allowed"].is_boolean() && !j["allowed"].get<bool>())
        kind += "_denied";
      if (kind != "net_suppressed") ++lost_[kind];
      return;
    }
    queued_ += line.size();
    queue_.push_back(std::move(line));
    flush();
  }

  // Sends what the socket takes now (never blocks).
  void flush() {
    while (sub_ >= 0 && !queue_.empty()) {
      const std::string& l = queue_.front();
      ssize_t w = send(sub_, l.data() + sent_, l.size() - sent_, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (w <= 0) {
        disconnect();
        return;
      }
      sent_ += static_cast<size_t>(w);
      if (sent_ == l.size()) drop_front();
    }
    if (!lost_.empty() && queued_ < kMaxQueued / 2) {
      nlohmann::json counts = nlohmann::json::object();
      for (auto& [k, n] : lost_) counts[k] = n;
      lost_.clear();
      push({{"event", "net_suppressed"}, {"counts", counts}});
    }
  }

  // The daemon sends nothing: readable means it closed (or misbehaves).
  void readable() {
    char buf[256];
    ssize_t n = recv(sub_, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) disconnect();
  }

  // At exit: up to `ms` for the daemon to take what is queued.
  void drain(int ms) {
    auto end = now_ns() + int64_t(ms) * 1000000;
    flush();
    while (want_write() && now_ns() < end) {
      pollfd p{sub_, POLLOUT, 0};
      if (poll(&p, 1, 50) < 0 && errno != EINTR) return;
      flush();
    }
  }

 private:
  void drop_front() {
    queued_ -= queue_.front().size();
    queue_.pop_front();
    sent_ = 0;
  }
  void disconnect() {
    close(sub_);
    sub_ = -1;
    // A partly sent line is resent whole to the next subscriber.
    sent_ = 0;
  }
  int listen_ = -1, sub_ = -1;
  std::deque<std::string> queue_;
  size_t queued_ = 0, sent_ = 0;
  std::map<std::string, uint64_t> lost_;
};

struct Timer {
  SlirpTimerId id;
  void* cb_opaque;
  int64_t expire_ms = -1;
};

class Helper {
 public:
  Helper(const HelperOptions& o, std::vector<Cidr> host_addrs)
      : host_addrs_(std::move(host_addrs)),
        filter_(NetworkPolicy::parse(o.policy, host_addrs_), o.filter,
                [this](nlohmann::json j) { events_.push(j); }) {}

  EventOut& events() { return events_; }

  void start_slirp() {
    SlirpConfig cfg{};
    cfg.version = 4;
    cfg.restricted = 0;
    cfg.in_enabled = true;
    inet_pton(AF_INET, "10.0.2.0", &cfg.vnetwork);
    inet_pton(AF_INET, "255.255.255.0", &cfg.vnetmask);
    inet_pton(AF_INET, "10.0.2.2", &cfg.vhost);
    inet_pton(AF_INET, "10.0.2.15", &cfg.vdhcp_start);
    inet_pton(AF_INET, "10.0.2.3", &cfg.vnameserver);
    cfg.in6_enabled = true;
    inet_pton(AF_INET6, "fec0::", &cfg.vprefix_addr6);
    cfg.vprefix_len = 64;
    inet_pton(AF_INET6, "fec0::2", &cfg.vhost6);
    inet_pton(AF_INET6, "fec0::3", &cfg.vnameserver6);
    cfg.vhostname = "sandbox";
    cfg.if_mtu = 1500;
    cfg.if_mru = 1500;
    // Defence in depth: the filter already denies 10.0.2.2 (10/8) and
    // fec0::2 (fec0::/10), and answers DNS itself.
    cfg.disable_host_loopback = true;
    cfg.disable_dns = true;
    cfg.enable_emu = false;
    static const SlirpCb cb = {
        .send_packet = &Helper::cb_send,
        .guest_error =
            [](const char* msg, void*) {
              // The guest can trigger these: a bounded number reach net.log.
              static int left = 100;
              if (left > 0 && --left == 0) {
                fprintf(stderr, "slirp: further messages suppressed\n");
              } else if (left > 0) {
                fprintf(stderr, "slirp: %s\n", msg);
              }
            },
        .clock_get_ns = [](void*) -> int64_t { return now_ns(); },
        .timer_new = nullptr,
        .timer_free =
            [](void* t, void* op) {
              static_cast<Helper*>(op)->timers_.remove_if([t](const Timer& x) { return &x == t; });
            },
        .timer_mod = [](void* t, int64_t expire_ms,
                        void*) { static_cast<Timer*>(t)->expire_ms = expire_ms; },
        .register_poll_fd = [](int, void*) {},
        .unregister_poll_fd = [](int, void*) {},
        .notify = [](void*) {},
        .init_completed = nullptr,
        .timer_new_opaque = [](SlirpTimerId id, void* cb_opaque, void* op) -> void* {
          auto* h = static_cast<Helper*>(op);
          h->timers_.push_back(Timer{id, cb_opaque});
          return &h->timers_.back();
        },
    };
    slirp_ = slirp_new(&cfg, &cb, this);
    if (!slirp_) throw Error(Errc::internal, "slirp_new failed");
  }

  void serve(int qemu_fd, int ctl_listen, ResolverPool& pool) {
    qemu_fd_ = qemu_fd;
    int64_t next_tick = now_ns() + 1000000000;
    std::vector<uint8_t> buf(1 << 16);
    for (;;) {
      pfds_.clear();
      pfds_.push_back({qemu_fd_, POLLIN, 0});
      pfds_.push_back({pool.fd(), POLLIN, 0});
      pfds_.push_back({ctl_listen, ctl_listen >= 0 ? short(POLLIN) : short(0), 0});
      pfds_.push_back(
          {events_.listen_fd(), events_.listen_fd() >= 0 ? short(POLLIN) : short(0), 0});
      pfds_.push_back(
          {events_.subscriber(),
           short(events_.subscriber() < 0 ? 0 : POLLIN | (events_.want_write() ? POLLOUT : 0)), 0});
      for (auto& c : clients_) pfds_.push_back({c.fd, POLLIN, 0});
      size_t fixed = pfds_.size();
      uint32_t timeout = 1000;
      slirp_pollfds_fill(slirp_, &timeout, &Helper::cb_add_poll, this);
      int64_t now_ms = now_ns() / 1000000;
      for (auto& t : timers_)
        if (t.expire_ms >= 0)
          timeout = std::min<uint32_t>(timeout, std::max<int64_t>(0, t.expire_ms - now_ms));
      int rc = poll(pfds_.data(), pfds_.size(), static_cast<int>(timeout));
      if (rc < 0 && errno != EINTR) throw_errno("poll");
      slirp_pollfds_poll(slirp_, rc < 0, &Helper::cb_get_revents, this);
      now_ms = now_ns() / 1000000;
      for (auto it = timers_.begin(); it != timers_.end(); ++it) {
        if (it->expire_ms >= 0 && it->expire_ms <= now_ms) {
          it->expire_ms = -1;
          slirp_handle_timer(slirp_, it->id, it->cb_opaque);
        }
      }
      if (rc > 0 && (pfds_[0].revents & (POLLIN | POLLHUP | POLLERR))) {
        ssize_t n = read(qemu_fd_, buf.data(), buf.size());
        if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) return;  // QEMU is gone
        if (n > 0) {
          decoder_.append(buf.data(), static_cast<size_t>(n));
          while (auto frame = decoder_.next()) guest_frame(*frame, pool);
        }
      }
      if (rc > 0 && (pfds_[1].revents & POLLIN)) {
        for (auto& [req, res] : pool.take()) send_to_guest(filter_.dns_resolved(req, res));
      }
      if (rc > 0 && ctl_listen >= 0 && (pfds_[2].revents & POLLIN)) {
        int c = accept4(ctl_listen, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (c >= 0) {
          if (clients_.size() >= 8) {
            close(c);
          } else {
            clients_.push_back({c, {}});
          }
        }
      }
      if (rc > 0 && (pfds_[3].revents & POLLIN)) events_.accept_one();
      if (rc > 0 && pfds_[4].fd >= 0 && pfds_[4].fd == events_.subscriber()) {
        if (pfds_[4].revents & (POLLIN | POLLHUP | POLLERR)) events_.readable();
        if (pfds_[4].revents & POLLOUT) events_.flush();
      }
      for (size_t i = 5; rc > 0 && i < fixed; ++i) {
        if (pfds_[i].revents) control_readable(pfds_[i].fd);
      }
      std::erase_if(clients_, [](const Client& c) { return c.fd < 0; });
      if (qemu_gone_) return;
      if (now_ns() >= next_tick) {
        next_tick = now_ns() + 1000000000;
        apply(filter_.tick());
      }
    }
  }

  void shutdown() {
    filter_.close_all("helper exit");
    if (slirp_) slirp_cleanup(slirp_);
    slirp_ = nullptr;
    events_.drain(1000);
  }

 private:
  struct Client {
    int fd;
    std::string buf;
  };

  void guest_frame(const std::vector<uint8_t>& frame, ResolverPool& pool) {
    auto out = filter_.from_guest(frame);
    for (auto& f : out.to_guest) send_to_guest(f);
    if (out.to_slirp) slirp_input(slirp_, frame.data(), static_cast<int>(frame.size()));
    if (out.resolve) pool.submit(std::move(*out.resolve));
  }

  void apply(const Filter::Cut& cut) {
    for (auto& f : cut.to_guest) send_to_guest(f);
    for (auto& f : cut.to_slirp) slirp_input(slirp_, f.data(), static_cast<int>(f.size()));
  }

  void send_to_guest(const std::vector<uint8_t>& frame) {
    if (frame.empty() || qemu_fd_ < 0) return;
    write_frame(frame.data(), frame.size());
  }

  void write_frame(const uint8_t* data, size_t n) {
    uint8_t len[4] = {uint8_t(n >> 24), uint8_t(n >> 16), uint8_t(n >> 8), uint8_t(n)};
    iovec iov[2] = {{len, 4}, {const_cast<uint8_t*>(data), n}};
    size_t total = 4 + n;
    if (qemu_gone_) return;
    ssize_t w = writev(qemu_fd_, iov, 2);
    if (w < 0 && (errno == EPIPE || errno == ECONNRESET)) {
      qemu_gone_ = true;  // QEMU closed: serve() returns, the helper exits
      return;
    }
    if (w < 0 && errno != EINTR && errno != EAGAIN) throw_errno("write to QEMU");
    size_t done = w > 0 ? static_cast<size_t>(w) : 0;
    // Rare partial write: finish it (QEMU reads continuously).
    std::vector<uint8_t> rest;
    if (done < total) {
      rest.insert(rest.end(), len, len + 4);
      rest.insert(rest.end(), data, data + n);
      try {
        write_all(qemu_fd_, rest.data() + done, total - done);
      } catch (const Error&) {
        qemu_gone_ = true;
      }
    }
  }

  void control_readable(int fd) {
    auto it = std::find_if(clients_.begin(), clients_.end(), [fd](auto& c) { return c.fd == fd; });
    if (it == clients_.end()) return;
    char buf[4096];
    ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) {
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
      close(fd);
      it->fd = -1;
      return;
    }
    it->buf.append(buf, static_cast<size_t>(n));
    size_t nl;
    while ((nl = it->buf.find('\n')) != std::string::npos) {
      std::string line = it->buf.substr(0, nl);
      it->buf.erase(0, nl + 1);
      std::string reply = control_request(line).dump() + "\n";
      try {
        write_all(fd, reply.data(), reply.size());
      } catch (const Error&) {
      }
    }
    if (it->buf.size() > (1 << 16)) {  // no line end in 64 KiB: not a client we serve
      close(fd);
      it->fd = -1;
    }
  }

  nlohmann::json control_request(const std::string& line) {
    try {
      auto j = nlohmann::json::parse(line);
      if (j.is_object() && j.contains("policy")) {
        NetworkPolicy p = NetworkPolicy::parse(j["policy"], host_addrs_);
        size_t before = filter_.flow_count();
        auto cut = filter_.set_policy(std::move(p));
        apply(cut);  // the daemon records the change (net_policy) from this reply
        return {{"ok", true},
                {"policy", filter_.policy().to_json()},
                {"flows_cut", before - filter_.flow_count()}};
      }
      if (j.is_object() && j.contains("stats")) return {{"ok", true}, {"stats", filter_.stats()}};
      if (j.is_object() && j.contains("port_add")) return port_add(j["port_add"]);
      if (j.is_object() && j.contains("port_remove")) return port_remove(j["port_remove"]);
      if (j.is_object() && j.contains("ports")) return {{"ok", true}, {"ports", ports_json()}};
      throw Error(Errc::invalid_argument,
                  "expected one of policy, stats, port_add, port_remove, ports");
    } catch (const Error& e) {
      return {
          {"error", {{"code", to_string(e.code())}, {"message", e.what()}, {"field", e.field()}}}};
    } catch (const nlohmann::json::exception& e) {
      return {{"error", {{"code", "invalid_argument"}, {"message", e.what()}, {"field", ""}}}};
    }
  }

  struct PortFwd {
    uint16_t guest_port, host_port;
  };

  static uint16_t port_field(const nlohmann::json& j, const char* name, bool zero_ok) {
    auto v = j.is_object() ? j.find(name) : j.end();
    if (v == j.end() && zero_ok) return 0;
    if (v == j.end() || !v->is_number_integer() || v->get<int64_t>() < (zero_ok ? 0 : 1) ||
        v->get<int64_t>() > 65535)
      throw Error(Errc::invalid_argument,
                  std::string(name) + " must be a TCP port number (1..65535)", name);
    return static_cast<uint16_t>(v->get<int64_t>());
  }

  nlohmann::json ports_json() const {
    nlohmann::json a = nlohmann::json::array();
    for (auto& p : ports_)
      a.push_back(
          {{"host", "127.0.0.1"}, {"host_port", p.host_port}, {"guest_port", p.guest_port}});
    return a;
  }

  // A free port on 127.0.0.1 chosen by the kernel (bind to port 0). slirp
  // cannot report the port it bound, so it is picked here and handed to
  // slirp_add_hostfwd; a race with another process is reported as in use.
  static uint16_t free_loopback_port() {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw_errno("socket");
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    if (bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
      int err = errno;
      close(fd);
      throw Error(Errc::unavailable, std::string("no free port on 127.0.0.1: ") + strerror(err));
    }
    close(fd);
    return ntohs(sa.sin_port);
  }

  nlohmann::json port_add(const nlohmann::json& req) {
    uint16_t guest = port_field(req, "guest_port", false);
    uint16_t host = port_field(req, "host_port", true);
    // The helper has no capabilities: privileged ports cannot be bound.
    if (host != 0 && host < 1024)
      throw Error(
          Errc::invalid_argument,
          "host_port must be 1024..65535 (or 0 for a free one), got " + std::to_string(host),
          "host_port");
    if (ports_.size() >= kMaxPorts)
      throw Error(Errc::conflict,
                  "at most " + std::to_string(kMaxPorts) + " port forwards per sandbox");
    for (auto& p : ports_) {
      if (p.guest_port == guest)
        throw Error(Errc::conflict,
                    "guest port " + std::to_string(guest) +
                        " is already forwarded from 127.0.0.1:" + std::to_string(p.host_port),
                    "guest_port");
      if (p.host_port == host)
        throw Error(Errc::conflict, "host port " + std::to_string(host) + " is already forwarded",
                    "host_port");
    }
    if (host == 0) host = free_loopback_port();
    in_addr lo{htonl(INADDR_LOOPBACK)}, guest_ip{};
    inet_pton(AF_INET, "10.0.2.15", &guest_ip);
    if (slirp_add_hostfwd(slirp_, 0, lo, host, guest_ip, guest) != 0)
      throw Error(Errc::conflict, "host port " + std::to_string(host) + " on 127.0.0.1 is in use",
                  "host_port");
    ports_.push_back({guest, host});
    filter_.add_inbound(guest, host);  // the daemon records net_port from the reply
    return {{"ok", true}, {"host", "127.0.0.1"}, {"host_port", host}, {"guest_port", guest}};
  }

  nlohmann::json port_remove(const nlohmann::json& req) {
    uint16_t host = port_field(req, "host_port", false);
    auto it = std::find_if(ports_.begin(), ports_.end(),
                           [host](const PortFwd& p) { return p.host_port == host; });
    if (it == ports_.end())
      throw Error(Errc::not_found, "no port forward from 127.0.0.1:" + std::to_string(host),
                  "host_port");
    in_addr lo{htonl(INADDR_LOOPBACK)};
    slirp_remove_hostfwd(slirp_, 0, lo, host);
    uint16_t guest = it->guest_port;
    ports_.erase(it);
    size_t before = filter_.flow_count();
    apply(filter_.remove_inbound(guest));
    size_t cut = before - filter_.flow_count();
    return {{"ok", true}, {"host_port", host}, {"guest_port", guest}, {"flows_cut", cut}};
  }

  static constexpr size_t kMaxPorts = 32;

  static ssize_t cb_send(const void* buf, size_t len, void* op) {
    auto* h = static_cast<Helper*>(op);
    auto* p = static_cast<const uint8_t*>(buf);
    if (h->filter_.from_net(std::span(p, len))) h->write_frame(p, len);
    return static_cast<ssize_t>(len);
  }
  static int cb_add_poll(int fd, int events, void* op) {
    auto* h = static_cast<Helper*>(op);
    short ev = 0;
    if (events & SLIRP_POLL_IN) ev |= POLLIN;
    if (events & SLIRP_POLL_OUT) ev |= POLLOUT;
    if (events & SLIRP_POLL_PRI) ev |= POLLPRI;
    h->pfds_.push_back({fd, ev, 0});
    return static_cast<int>(h->pfds_.size() - 1);
  }
  static int cb_get_revents(int idx, void* op) {
    auto* h = static_cast<Helper*>(op);
    if (idx < 0 || static_cast<size_t>(idx) >= h->pfds_.size()) return 0;
    short r = h->pfds_[idx].revents;
    int out = 0;
    if (r & POLLIN) out |= SLIRP_POLL_IN;
    if (r & POLLOUT) out |= SLIRP_POLL_OUT;
    if (r & POLLPRI) out |= SLIRP_POLL_PRI;
    if (r & POLLERR) out |= SLIRP_POLL_ERR;
    if (r & POLLHUP) out |= SLIRP_POLL_HUP;
    return out;
  }

  EventOut events_;  // before filter_: its sink
  std::vector<Cidr> host_addrs_;
  Filter filter_;
  Slirp* slirp_ = nullptr;
  int qemu_fd_ = -1;
  bool qemu_gone_ = false;
  StreamDecoder decoder_;
  std::vector<pollfd> pfds_;
  std::list<Timer> timers_;
  std::vector<Client> clients_;
  std::vector<PortFwd> ports_;
};

}  // namespace

int run_helper(const HelperOptions& o) {
  // A closed QEMU or control peer is an error return from write, not a signal.
  signal(SIGPIPE, SIG_IGN);
  auto host_addrs = host_addresses();
  Helper helper(o, host_addrs);  // parses the policy: fails before any socket
  int qemu_listen = listen_unix(o.qemu_socket);
  int ctl_listen = o.control_socket.empty() ? -1 : listen_unix(o.control_socket, true);
  if (ctl_listen >= 0) fcntl(ctl_listen, F_SETFL, O_NONBLOCK);
  if (!o.events_socket.empty()) helper.events().listen(o.events_socket);
  // The run dir, to remove the QEMU socket once QEMU is connected: opened
  // before confinement (it keeps the original, writable mount) and closed
  // right after, before the first guest frame is read. No other descriptor
  // of a directory outside the helper's empty root is ever kept.
  std::string qemu_name = o.qemu_socket.substr(o.qemu_socket.rfind('/') + 1);
  std::string qemu_dir_path = o.qemu_socket.find('/') == std::string::npos
                                  ? "."
                                  : o.qemu_socket.substr(0, o.qemu_socket.rfind('/') + 1);
  int qemu_dir = open(qemu_dir_path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  // After the files it creates (sockets) and before any thread:
  // unshare(CLONE_NEWUSER) refuses a multi-threaded process.
  nlohmann::json confined = o.namespaces ? enter_namespaces() : nlohmann::json{{"userns", false}};
  // Leaked on purpose: its workers may sit in res_nquery or on its condition
  // variable when the helper exits; exit() does not wait for them.
  ResolverPool& pool = *new ResolverPool(std::max(1, o.resolver_threads), o.dns_upstream);
  helper.start_slirp();
  // Everything that reads a file (the resolvers' resolv.conf) is done: from
  // here on the helper's root is an empty directory.
  confined["empty_root"] = confined.value("mountns", false) && hide_filesystem();
  std::cout << nlohmann::json{{"ready", true}, {"pid", getpid()}, {"confined", confined}}.dump()
            << std::endl;

  pollfd pfd{qemu_listen, POLLIN, 0};
  int rc = poll(&pfd, 1, o.accept_timeout_s * 1000);
  if (rc <= 0) {
    std::cerr << "airlock-net: QEMU did not connect within " << o.accept_timeout_s << " s\n";
    if (qemu_dir >= 0) unlinkat(qemu_dir, qemu_name.c_str(), 0);
    return 1;
  }
  int qemu_fd = accept4(qemu_listen, nullptr, nullptr, SOCK_CLOEXEC);
  if (qemu_fd < 0) throw_errno("accept QEMU");
  close(qemu_listen);  // one QEMU per helper: nobody else may connect
  if (qemu_dir >= 0) {
    unlinkat(qemu_dir, qemu_name.c_str(), 0);
    close(qemu_dir);
  }
  if (o.seccomp) lock_down();
  try {
    helper.serve(qemu_fd, ctl_listen, pool);
  } catch (const Error& e) {
    std::cerr << "airlock-net: " << e.what() << "\n";
    helper.shutdown();
    return 1;
  }
  // The daemon removes the control and event sockets (kill_net_helper).
  helper.shutdown();
  return 0;
}

}  // namespace airlock::net

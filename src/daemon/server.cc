#include "daemon/server.h"

#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ip/v6_only.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <thread>
#include <vector>

#include "auth/auth.h"
#include "common/error.h"
#include "daemon/exchange.h"
#include "daemon/handlers.h"
#include "daemon/listener.h"
#include "daemon/request.h"
#include "daemon/router.h"
#include "daemon/tenancy.h"

namespace airlock::daemon {

namespace net = boost::asio;
namespace beast = boost::beast;
using stream = net::local::stream_protocol;
using tcp = net::ip::tcp;

struct Server::Impl {
  std::filesystem::path socket_path;
  int lock_fd = -1;
  net::io_context io;
  std::unique_ptr<stream::acceptor> acceptor;
  std::vector<std::unique_ptr<tcp::acceptor>> tcp_acceptors;
  std::shared_ptr<net::ssl::context> tls;
  auth::Auth* auth = nullptr;
  std::unique_ptr<net::steady_timer> watchdog;
  engine::SandboxService* engine = nullptr;
  ServerCounters counters;
  std::vector<std::pair<std::string, Server::Extension>> extensions;

  std::mutex mu;
  std::condition_variable cv;
  // Open connections by fd: shut down at exit or when idle too long.
  std::map<int, std::shared_ptr<Activity>> conns;
  int threads = 0;
  int refusing = 0;  // refused connections still being answered (io thread only)
  bool stopping = false;

  void accept_next();
  void accept_tcp(tcp::acceptor& acceptor);
  // Serves an accepted socket on a thread of its own, or refuses it (503)
  // over the connection cap. io thread only.
  template <class Sock>
  void admit(Sock sock);
  template <class Sock>
  void refuse(Sock sock, const std::string& why);
  void watch_idle();
  void serve(std::unique_ptr<Stream> conn, std::shared_ptr<Activity> activity, ConnSlot slot);
  // Counts the connection against the request's tenant; false (answered
  // 503, the connection to be closed) over --max-connections-per-tenant.
  bool claim(Exchange& ex, ConnSlot& slot, const Principal& who);
  // Who is asking (principal.h). False if the request was already answered
  // (401 unauthenticated, 429 rate_limited).
  bool authenticate(Exchange& ex, const Stream& conn, bool extension, Principal& who);
  // The extension whose prefix `path` starts with (its label: prefix + "*").
  const Server::Extension* find_extension(std::string_view path, std::string& label) const;
};

const Server::Extension* Server::Impl::find_extension(std::string_view path,
                                                      std::string& label) const {
  for (const auto& [prefix, ext] : extensions) {
    if (path.substr(0, prefix.size()) == prefix) {
      label = prefix + "*";
      return &ext;
    }
  }
  return nullptr;
}

namespace {

// True if something accepts connections on `path`.
bool answers(const std::filesystem::path& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

Server::Server(std::filesystem::path socket_path, ServerLimits limits)
    : impl_(std::make_unique<Impl>()) {
  impl_->socket_path = std::move(socket_path);
  impl_->counters.limits = limits;
}

nlohmann::json Server::counters() const { return impl_->counters.to_json(); }

Server::~Server() {
  if (impl_->auth && daemon_auth() == impl_->auth) set_daemon_auth(nullptr);
  if (impl_->lock_fd >= 0) ::close(impl_->lock_fd);
}

void Server::bind() {
  auto& s = *impl_;
  if (s.socket_path.native().size() >= sizeof(sockaddr_un{}.sun_path))
    throw Error(Errc::invalid_argument,
                "socket path is longer than " + std::to_string(sizeof(sockaddr_un{}.sun_path) - 1) +
                    " bytes: " + s.socket_path.string(),
                "socket");
  auto dir = s.socket_path.parent_path();
  std::error_code ec;
  if (!dir.empty()) {
    std::filesystem::create_directories(dir, ec);
    if (ec) throw Error(Errc::internal, "cannot create " + dir.string() + ": " + ec.message());
  }
  // The socket is the operator's door: root and the `airlock` group only.
  // Its directory is made 0700 (0750 group airlock when that group exists)
  // if it is ours; a shared one (sticky, e.g. /tmp, or another owner's) is
  // left alone and the socket's own mode does the job.
  gid_t group = static_cast<gid_t>(-1);
  if (const struct group* g = ::getgrnam("airlock")) group = g->gr_gid;
  struct stat st {};
  if (!dir.empty() && ::stat(dir.c_str(), &st) == 0 && st.st_uid == ::geteuid() &&
      !(st.st_mode & S_ISVTX)) {
    if (group != static_cast<gid_t>(-1) && ::chown(dir.c_str(), -1, group) != 0)
      spdlog::warn("cannot give {} to group airlock: {}", dir.string(), std::strerror(errno));
    if (::chmod(dir.c_str(), group != static_cast<gid_t>(-1) ? 0750 : 0700) != 0)
      throw_errno("cannot chmod " + dir.string());
  }
  // The lock outlives any stale socket file: whoever holds it is the daemon.
  std::string lock_path = s.socket_path.string() + ".lock";
  s.lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (s.lock_fd < 0) throw_errno("cannot open " + lock_path);
  if (::flock(s.lock_fd, LOCK_EX | LOCK_NB) != 0)
    throw Error(Errc::conflict, "another airlockd is already running on " + s.socket_path.string() +
                                    " (" + lock_path + " is locked)");
  if (std::filesystem::exists(std::filesystem::symlink_status(s.socket_path))) {
    if (answers(s.socket_path))
      throw Error(Errc::conflict, "another airlockd already answers on " + s.socket_path.string());
    spdlog::info("removing stale socket {}", s.socket_path.string());
    std::filesystem::remove(s.socket_path, ec);
  }
  s.acceptor = std::make_unique<stream::acceptor>(s.io);
  s.acceptor->open(stream());
  // Created 0600 from the start (umask), not chmod-ed afterwards: no window
  // in which another user could connect.
  mode_t old = ::umask(0177);
  beast::error_code bec;
  s.acceptor->bind(stream::endpoint(s.socket_path.string()), bec);
  ::umask(old);
  if (bec)
    throw Error(Errc::internal, "cannot bind " + s.socket_path.string() + ": " + bec.message());
  s.acceptor->listen(net::socket_base::max_listen_connections);
  if (group != static_cast<gid_t>(-1) && ::chown(s.socket_path.c_str(), -1, group) == 0)
    ::chmod(s.socket_path.c_str(), 0660);
  else
    ::chmod(s.socket_path.c_str(), 0600);
}

void Server::Impl::accept_next() {
  acceptor->async_accept([this](beast::error_code ec, stream::socket sock) {
    if (ec) {
      if (ec != net::error::operation_aborted) spdlog::warn("accept: {}", ec.message());
      if (!acceptor->is_open()) return;
    } else {
      admit(std::move(sock));
    }
    accept_next();
  });
}

void Server::Impl::accept_tcp(tcp::acceptor& a) {
  a.async_accept([this, &a](beast::error_code ec, tcp::socket sock) {
    if (ec) {
      if (ec != net::error::operation_aborted) spdlog::warn("accept (tcp): {}", ec.message());
      if (!a.is_open()) return;
    } else {
      admit(std::move(sock));
    }
    accept_tcp(a);
  });
}

template <class Sock>
void Server::Impl::admit(Sock sock) {
  std::unique_lock lock(mu);
  if (stopping) return;
  ConnSlot slot;
  if constexpr (std::is_same_v<Sock, tcp::socket>) {
    beast::error_code ec;
    auto remote = sock.remote_endpoint(ec);
    slot.network = true;
    slot.source = auth::source_key(remote.address().to_string());
  }
  if (std::string why = counters.caps.open(counters.limits, slot); !why.empty()) {
    lock.unlock();
    refuse(std::move(sock), why);
    return;
  }
  // Counted from here: every way out below gives the slot back.
  auto give_back = [&] { counters.caps.close(slot); };
  std::unique_ptr<Stream> conn;
  if constexpr (std::is_same_v<Sock, tcp::socket>) {
    beast::error_code ec;
    auto remote = sock.remote_endpoint(ec);
    // The API's answers are small and latency-bound.
    sock.set_option(tcp::no_delay(true), ec);
    try {
      if (tls)
        conn = std::make_unique<TlsStream>(std::move(sock), *tls);
      else
        conn = std::make_unique<SocketStream<tcp::socket>>(std::move(sock));
    } catch (const std::exception& e) {
      // A peer already gone (its fd unusable): nothing to serve.
      spdlog::debug("dropping a TCP connection: {}", e.what());
      give_back();
      return;
    }
    conn->network = true;
    conn->peer = remote.address().to_string();
  } else {
    conn = std::make_unique<SocketStream<Sock>>(std::move(sock));
  }
  ++threads;
  counters.open = threads;
  auto activity = std::make_shared<Activity>();
  // The first request's head (and a TLS handshake) is due from now.
  activity->awaiting_head = true;
  activity->head_since_ms = steady_ms();
  conns[conn->native_handle()] = activity;
  std::thread([this, c = std::move(conn), activity, slot = std::move(slot)]() mutable {
    serve(std::move(c), std::move(activity), std::move(slot));
  }).detach();
}

// Over the connection cap: answer 503 at once (no thread), then give the
// client a moment to send its request and read the answer before closing,
// so it sees the error rather than a reset. All on the io thread; at most
// 64 such sockets linger at a time, the rest are closed at once.
template <class Sock>
void Server::Impl::refuse(Sock sock, const std::string& why) {
  ++counters.refused;
  spdlog::warn("refusing a connection ({} open): {}", counters.open.load(), why);
  const std::string answer = [&why] {
    std::string body = error_body("unavailable", why).dump() + "\n";
    return "HTTP/1.1 503 Service Unavailable\r\nServer: airlockd/" AIRLOCK_VERSION
           "\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n\r\n" + body;
  }();
  // A TLS client would not understand a plain answer: it is just closed.
  if constexpr (std::is_same_v<Sock, tcp::socket>)
    if (tls) return;
  // A fresh socket's buffer takes a few hundred bytes without blocking.
  ::send(sock.native_handle(), answer.data(), answer.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  beast::error_code ignored;
  sock.shutdown(Sock::shutdown_send, ignored);
  if (refusing >= 64) return;  // closed by the destructor
  ++refusing;
  struct Lingering {
    Sock sock;
    net::steady_timer timer;
    char buf[4096];
  };
  auto l = std::make_shared<Lingering>(Lingering{std::move(sock), net::steady_timer(io), {}});
  l->timer.expires_after(std::chrono::seconds(2));
  l->timer.async_wait([l](beast::error_code) {
    beast::error_code e;
    l->sock.close(e);
  });
  auto drain = std::make_shared<std::function<void()>>();
  *drain = [this, l, drain] {
    l->sock.async_read_some(net::buffer(l->buf), [this, l, drain](beast::error_code ec, size_t) {
      if (!ec) return (*drain)();
      l->timer.cancel();
      --refusing;
      *drain = nullptr;  // breaks the self-reference
    });
  };
  (*drain)();
}

// Every quarter of the idle timeout (at most 1 s), cut the connections whose
// pending read or write has made no progress for the whole timeout. A read
// gets SHUT_RD (the thread can still answer 408), a write SHUT_RDWR.
void Server::Impl::watch_idle() {
  auto idle = counters.limits.idle_timeout;
  auto period = std::clamp(std::min(idle, counters.limits.header_timeout) / 4,
                           std::chrono::milliseconds(20), std::chrono::milliseconds(1000));
  watchdog->expires_after(period);
  watchdog->async_wait([this, idle](beast::error_code ec) {
    if (ec) return;
    int64_t now = steady_ms();
    {
      std::lock_guard lock(mu);
      int64_t head_ms = counters.limits.header_timeout.count();
      for (auto& [fd, a] : conns) {
        int64_t head = a->head_since_ms;
        if (head != 0 && !a->timed_out && now - head >= head_ms) {
          // However it trickles in, the head as a whole is late.
          a->timed_out = true;
          a->head_timed_out = true;
          ++counters.header_timeouts;
          spdlog::info(
              "closing connection {}: request headers not complete after {} ms "
              "(--header-timeout)",
              fd, now - head);
          ::shutdown(fd, SHUT_RD);
          continue;
        }
        int64_t since = a->op_since_ms;
        if (since == 0 || a->timed_out || now - since < idle.count()) continue;
        a->timed_out = true;
        ++counters.idle_closed;
        bool reading = a->reading;
        spdlog::info("closing connection {}: no {} for {} ms (--idle-timeout)", fd,
                     reading ? "request data" : "reader progress", now - since);
        ::shutdown(fd, reading ? SHUT_RD : SHUT_RDWR);
      }
    }
    watch_idle();
  });
}

// A streamed stdin (POST .../exec/{exec_id}/stdin) takes a body of any size:
// it is forwarded with bounded memory, never collected. Every other route's
// body is capped (read_body() and the upload check Content-Length too).
static bool unlimited_body(const http::request<http::buffer_body>& req) {
  if (req.method() != http::verb::post) return false;
  auto t = req.target();
  std::string_view target(t.data(), t.size());
  target = target.substr(0, target.find('?'));
  RouteMatch m = match_route("POST", target);
  return m.status == RouteStatus::ok && m.spec->handler == &serve::exec_stdin;
}

void Server::Impl::serve(std::unique_ptr<Stream> conn, std::shared_ptr<Activity> activity,
                         ConnSlot slot) {
  int fd = conn->native_handle();
  WatchedSocket wsock(*conn, *activity);
  beast::flat_buffer buffer;
  bool ready = true;
  if (auto* t = dynamic_cast<TlsStream*>(conn.get())) ready = t->handshake(*activity);
  while (ready) {
    RequestParser parser;
    parser.header_limit(64 * 1024);
    // No limit while the head is parsed (Beast checks a Content-Length
    // against it there); set per route below.
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    beast::error_code ec;
    // The header deadline runs from the head's first byte (pipelined bytes
    // already buffered count as that); a connection's first head from accept.
    activity->awaiting_head = true;
    if (buffer.size() > 0 && activity->head_since_ms == 0) activity->head_since_ms = steady_ms();
    http::read_header(wsock, buffer, parser, ec);
    activity->awaiting_head = false;
    activity->head_since_ms = 0;
    if (!ec && !unlimited_body(parser.get())) parser.body_limit(kMaxUploadBody);
    if (ec) {
      bool quiet = ec == http::error::end_of_stream || ec == net::error::eof ||
                   ec == net::error::connection_reset || ec == net::error::bad_descriptor;
      if (activity->timed_out && !quiet) {
        // Stopped mid-request: say why before hanging up.
        http::response<http::string_body> res{http::status::request_timeout, 11};
        res.set(http::field::content_type, "application/json");
        res.body() =
            error_body("timeout", activity->head_timed_out
                                      ? "the request headers did not arrive within " +
                                            std::to_string(counters.limits.header_timeout.count()) +
                                            " ms (--header-timeout)"
                                      : std::string("the request stalled past the idle timeout"))
                .dump() +
            "\n";
        res.keep_alive(false);
        res.prepare_payload();
        beast::error_code ignored;
        http::write(wsock, res, ignored);
      } else if (ec == http::error::body_limit) {
        // A declared Content-Length over the upload limit is refused by the
        // parser from the head alone; it is a 413 like every body over a
        // limit, not a malformed request.
        http::response<http::string_body> res{http::status::payload_too_large, 11};
        res.set(http::field::content_type, "application/json");
        res.body() = error_body("payload_too_large",
                                "request body is over the limit of " +
                                    std::to_string(kMaxUploadBody) + " bytes",
                                "body")
                         .dump() +
                     "\n";
        res.keep_alive(false);
        res.prepare_payload();
        beast::error_code ignored;
        http::write(wsock, res, ignored);
      } else if (!quiet) {
        // Malformed request head: answer once, then hang up (we cannot find
        // the start of the next request).
        http::response<http::string_body> res{http::status::bad_request, 11};
        res.set(http::field::content_type, "application/json");
        res.body() =
            error_body("invalid_argument", "malformed HTTP request: " + ec.message()).dump() + "\n";
        res.keep_alive(false);
        res.prepare_payload();
        beast::error_code ignored;
        http::write(wsock, res, ignored);
      }
      break;
    }
    auto start = std::chrono::steady_clock::now();
    Exchange ex(wsock, buffer, parser);
    std::string route_label;
    const Server::Extension* ext = find_extension(ex.path(), route_label);
    if (!ext) route_label = route_template(ex.method(), ex.path());
    Principal principal;  // the unix socket: the operator
    bool over_cap = false;
    if (!authenticate(ex, *conn, ext != nullptr, principal)) {
      // answered 401/429
    } else if (conn->network && !claim(ex, slot, principal)) {
      over_cap = true;  // answered 503
    } else if (ext) {
      answer_errors(ex, [&] {
        (*ext)(*engine, ex, principal);
        if (!ex.responded()) throw Error(Errc::internal, "the handler sent no answer");
      });
    } else {
      handle(*engine, ex, Caller{counters, principal, auth, conn->peer});
    }
    auto elapsed = std::chrono::steady_clock::now() - start;
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count();
    {
      // By route template, never the raw path: ids would make the label
      // set grow without bound.
      const std::string& route = route_label;
      counters.http_requests.inc({{"route", route}, {"status", std::to_string(ex.status())}});
      counters.http_seconds.observe({{"route", route}},
                                    std::chrono::duration<double>(elapsed).count());
    }
    spdlog::info("{} {} {} {}ms", ex.method(), std::string(parser.get().target()), ex.status(), ms);
    if (over_cap || !ex.keep_alive() || activity->timed_out) break;
  }
  conn->finish();
  {
    // Closed under the lock: the watchdog must never shut down a reused fd.
    std::lock_guard lock(mu);
    counters.caps.close(slot);
    conns.erase(fd);
    conn.reset();
    --threads;
    counters.open = threads;
  }
  cv.notify_all();
}

bool Server::run(engine::SandboxService& engine) {
  auto& s = *impl_;
  s.engine = &engine;
  ::signal(SIGPIPE, SIG_IGN);  // a vanished client is a write error, not death
  net::signal_set signals(s.io, SIGINT, SIGTERM);
  signals.async_wait([this](beast::error_code ec, int sig) {
    if (!ec) spdlog::info("signal {}: shutting down (sandboxes keep running)", sig);
    stop();
  });
  s.accept_next();
  for (auto& a : s.tcp_acceptors) s.accept_tcp(*a);
  s.watchdog = std::make_unique<net::steady_timer>(s.io);
  s.watch_idle();
  spdlog::info("airlockd {} listening on {}", AIRLOCK_VERSION, s.socket_path.string());
  s.io.run();

  // Stop accepting, then end open connections: blocked reads fail at once,
  // running execs see their client gone and are killed.
  std::unique_lock lock(s.mu);
  s.stopping = true;
  for (auto& [fd, a] : s.conns) ::shutdown(fd, SHUT_RDWR);
  bool done = s.cv.wait_for(lock, std::chrono::seconds(10), [&] { return s.threads == 0; });
  if (!done) spdlog::warn("{} connection(s) still inside the engine at exit", s.threads);
  return done;
}

// The credential of a TCP request: `Authorization: Bearer T` or
// `X-API-KEY: T`. Another Authorization scheme (E2B's envd sends Basic for
// its run-as user) is not a credential at all.
static std::string credential(const http::request<http::buffer_body>& req) {
  auto it = req.find(http::field::authorization);
  if (it != req.end()) {
    std::string_view v(it->value().data(), it->value().size());
    if (v.size() > 7 && beast::iequals(beast::string_view(v.data(), 7), "Bearer ")) {
      v.remove_prefix(7);
      while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
      while (!v.empty() && v.back() == ' ') v.remove_suffix(1);
      return std::string(v);
    }
  }
  auto key = req.find("X-API-KEY");
  if (key != req.end()) return std::string(key->value());
  return {};
}

bool Server::Impl::claim(Exchange& ex, ConnSlot& slot, const Principal& who) {
  std::string tenant = who.kind == Principal::Kind::tenant ? who.tenant : std::string();
  std::string why = counters.caps.claim(counters.limits, slot, tenant);
  if (why.empty()) return true;
  ++counters.refused;
  spdlog::warn("refusing a request on connection {}: {}", ex.native_handle(), why);
  ex.send_error(Error(Errc::unavailable, why));
  return false;
}

// Probes answer without a credential over TCP: a load balancer has none.
// What they say to such a caller discloses nothing (handlers.cc, readyz).
// The route table says which (Access::anyone).
static bool probe(const Exchange& ex) {
  RouteMatch m = match_route(ex.method(), ex.path());
  return m.status == RouteStatus::ok && m.spec->access == Access::anyone;
}

bool Server::Impl::authenticate(Exchange& ex, const Stream& conn, bool extension, Principal& who) {
  if (!conn.network) return true;  // the socket file: the operator
  // Route templates only (and an extension's path without its query): never
  // a secret, never an unbounded id list.
  auto record = [&](const char* outcome, int status) {
    nlohmann::json r = {
        {"source", conn.peer},
        {"method", ex.method()},
        {"route", extension ? std::string(ex.path()) : route_template(ex.method(), ex.path())},
        {"outcome", outcome}};
    if (status) r["status"] = status;
    auth->audit().append(std::move(r));
  };
  auto limited = [&] {
    record("rate_limited", 429);
    ex.send_error(Error(Errc::rate_limited,
                        "too many failed authentications from this address; try again later"));
    return false;
  };
  std::string cred = credential(ex.request());
  if (cred.empty() && probe(ex)) {
    who.kind = Principal::Kind::anonymous;  // a probe: answered without a token
    return true;
  }
  // A valid token is served even from a limited source (auth.h): many
  // clients may share one address, e.g. behind a TLS proxy on the host.
  auth::Verdict v = auth->authenticate(cred, conn.peer);
  switch (v.outcome) {
    case auth::Verdict::ok:
      who.kind = Principal::Kind::tenant;
      who.tenant = v.token.tenant;
      who.token_id = v.token.id;
      return true;
    case auth::Verdict::limited:
      return limited();
    case auth::Verdict::missing:
    case auth::Verdict::invalid:
      if (extension) {
        // The extension decides (E2B's envd authenticates by a sandbox's
        // own access token, and counts a wrong one with
        // Auth::note_auth_failure); a wrong credential here counted already.
        if (v.outcome == auth::Verdict::invalid) record("unauthenticated", 0);
        who.kind = Principal::Kind::anonymous;
        return true;
      }
      if (v.outcome == auth::Verdict::missing && auth->note_auth_failure(conn.peer))
        return limited();
      record("unauthenticated", 401);
      ex.send_error(Error(Errc::unauthenticated, "authentication required"));
      return false;
  }
  return false;
}

void Server::listen(const ListenSpec& spec, std::shared_ptr<net::ssl::context> tls) {
  auto& s = *impl_;
  if (!s.auth) throw Error(Errc::internal, "Server::listen without set_auth");
  check_listen(spec, tls != nullptr);
  s.tls = std::move(tls);
  for (const auto& ep : spec.endpoints) {
    auto a = std::make_unique<tcp::acceptor>(s.io);
    beast::error_code ec;
    a->open(ep.protocol(), ec);
    if (!ec) a->set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec && ep.address().is_v6()) a->set_option(net::ip::v6_only(true), ec);
    if (!ec) a->bind(ep, ec);
    if (!ec) a->listen(net::socket_base::max_listen_connections, ec);
    if (ec)
      throw Error(Errc::invalid_argument,
                  "--listen " + spec.text + ": cannot listen on " + ep.address().to_string() + ":" +
                      std::to_string(ep.port()) + ": " + ec.message(),
                  "listen");
    spdlog::info("listening on {}:{} ({})", ep.address().to_string(), a->local_endpoint().port(),
                 s.tls ? "TLS" : "plain HTTP, loopback");
    s.tcp_acceptors.push_back(std::move(a));
  }
}

void Server::set_auth(auth::Auth* auth) {
  impl_->auth = auth;
  set_daemon_auth(auth);
}

std::vector<int> Server::tcp_ports() const {
  std::vector<int> ports;
  for (const auto& a : impl_->tcp_acceptors) ports.push_back(a->local_endpoint().port());
  return ports;
}

void Server::add_extension(std::string prefix, Extension handler) {
  impl_->extensions.emplace_back(std::move(prefix), std::move(handler));
}

void Server::stop() {
  auto& s = *impl_;
  net::post(s.io, [&s] {
    beast::error_code ec;
    if (s.acceptor && s.acceptor->is_open()) {
      s.acceptor->close(ec);
      std::error_code fec;
      std::filesystem::remove(s.socket_path, fec);
    }
    for (auto& a : s.tcp_acceptors) a->close(ec);
    if (s.watchdog) s.watchdog->cancel();
    s.io.stop();
  });
}

}  // namespace airlock::daemon

#include "daemon/server.h"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/signal_set.hpp>
#include <chrono>
#include <cstring>
#include <thread>

#include "common/error.h"
#include "daemon/exchange.h"
#include "daemon/handlers.h"
#include "daemon/request.h"

namespace airlock::daemon {

namespace net = boost::asio;
namespace beast = boost::beast;
using stream = net::local::stream_protocol;

struct Server::Impl {
  std::filesystem::path socket_path;
  int lock_fd = -1;
  net::io_context io;
  std::unique_ptr<stream::acceptor> acceptor;
  engine::Engine* engine = nullptr;

  std::mutex mu;
  std::condition_variable cv;
  std::set<int> open_fds;  // connections to shut down at exit
  int threads = 0;
  bool stopping = false;

  void accept_next();
  void serve(stream::socket sock);
};

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

Server::Server(std::filesystem::path socket_path) : impl_(std::make_unique<Impl>()) {
  impl_->socket_path = std::move(socket_path);
}

Server::~Server() {
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
  ::chmod(s.socket_path.c_str(), 0600);
}

void Server::Impl::accept_next() {
  acceptor->async_accept([this](beast::error_code ec, stream::socket sock) {
    if (ec) {
      if (ec != net::error::operation_aborted) spdlog::warn("accept: {}", ec.message());
      if (!acceptor->is_open()) return;
    } else {
      std::lock_guard lock(mu);
      if (stopping) return;
      ++threads;
      open_fds.insert(sock.native_handle());
      std::thread([this, s = std::move(sock)]() mutable { serve(std::move(s)); }).detach();
    }
    accept_next();
  });
}

void Server::Impl::serve(stream::socket sock) {
  int fd = sock.native_handle();
  beast::flat_buffer buffer;
  while (true) {
    RequestParser parser;
    parser.header_limit(64 * 1024);
    parser.body_limit(kMaxUploadBody);
    beast::error_code ec;
    http::read_header(sock, buffer, parser, ec);
    if (ec) {
      if (ec != http::error::end_of_stream && ec != net::error::eof &&
          ec != net::error::connection_reset && ec != net::error::bad_descriptor) {
        // Malformed request head: answer once, then hang up (we cannot find
        // the start of the next request).
        http::response<http::string_body> res{http::status::bad_request, 11};
        res.set(http::field::content_type, "application/json");
        res.body() =
            error_body("invalid_argument", "malformed HTTP request: " + ec.message()).dump() + "\n";
        res.keep_alive(false);
        res.prepare_payload();
        beast::error_code ignored;
        http::write(sock, res, ignored);
      }
      break;
    }
    auto start = std::chrono::steady_clock::now();
    Exchange ex(sock, buffer, parser);
    handle(*engine, ex);
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                  std::chrono::steady_clock::now() - start)
                  .count();
    spdlog::info("{} {} {} {}ms", ex.method(), std::string(parser.get().target()), ex.status(), ms);
    if (!ex.keep_alive()) break;
  }
  beast::error_code ignored;
  sock.shutdown(stream::socket::shutdown_both, ignored);
  {
    std::lock_guard lock(mu);
    open_fds.erase(fd);
    sock.close(ignored);
    --threads;
  }
  cv.notify_all();
}

bool Server::run(engine::Engine& engine) {
  auto& s = *impl_;
  s.engine = &engine;
  ::signal(SIGPIPE, SIG_IGN);  // a vanished client is a write error, not death
  net::signal_set signals(s.io, SIGINT, SIGTERM);
  signals.async_wait([this](beast::error_code ec, int sig) {
    if (!ec) spdlog::info("signal {}: shutting down (sandboxes keep running)", sig);
    stop();
  });
  s.accept_next();
  spdlog::info("airlockd {} listening on {}", AIRLOCK_VERSION, s.socket_path.string());
  s.io.run();

  // Stop accepting, then end open connections: blocked reads fail at once,
  // running execs see their client gone and are killed.
  std::unique_lock lock(s.mu);
  s.stopping = true;
  for (int fd : s.open_fds) ::shutdown(fd, SHUT_RDWR);
  bool done = s.cv.wait_for(lock, std::chrono::seconds(10), [&] { return s.threads == 0; });
  if (!done) spdlog::warn("{} connection(s) still inside the engine at exit", s.threads);
  return done;
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
    s.io.stop();
  });
}

}  // namespace airlock::daemon

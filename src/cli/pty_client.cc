#include "cli/pty_client.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <deque>

#include "cli/args.h"
#include "cli/attach.h"
#include "client/client.h"
#include "common/error.h"

namespace airlock::cli {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace websocket = beast::websocket;
using nlohmann::json;
using stream = net::local::stream_protocol;

RawTerminal::RawTerminal(int fd) : fd_(fd) {
  termios t{};
  if (!::isatty(fd) || ::tcgetattr(fd, &t) != 0) return;
  saved_ = t;
  flags_ = ::fcntl(fd, F_GETFL);
  ::cfmakeraw(&t);
  // Output post-processing stays as it was: the guest's pty already turns
  // \n into \r\n, and cfmakeraw's OPOST off is what we want for that.
  ::tcsetattr(fd, TCSANOW, &t);
}

RawTerminal::~RawTerminal() {
  if (!saved_) return;
  ::tcsetattr(fd_, TCSANOW, &*saved_);
  if (flags_ >= 0) ::fcntl(fd_, F_SETFL, flags_);
}

json pty_start_message(const PtyOptions& opts, int cols, int rows, const char* term_env) {
  json j{{"cols", cols}, {"rows", rows}};
  if (!opts.argv.empty()) j["argv"] = opts.argv;
  std::map<std::string, std::string> env = parse_kvs(opts.env, "--env");
  if (!env.count("TERM") && term_env && *term_env) env["TERM"] = term_env;
  if (!env.empty()) j["env"] = env;
  if (!opts.cwd.empty()) j["cwd"] = opts.cwd;
  if (!opts.user.empty()) j["user"] = opts.user;
  return j;
}

namespace {

// The window size of the terminal on stdout, stdin or stderr (80x24 if none).
std::pair<int, int> window_size() {
  for (int fd : {1, 0, 2}) {
    winsize ws{};
    if (::ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 && ws.ws_row > 0)
      return {ws.ws_col, ws.ws_row};
  }
  return {80, 24};
}

// stdout may share its open file with stdin, which the event loop made
// non-blocking: wait for room instead of failing with EAGAIN.
void write_out(std::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t n = ::write(1, bytes.data(), bytes.size());
    if (n > 0) {
      bytes.remove_prefix(size_t(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      pollfd p{1, POLLOUT, 0};
      ::poll(&p, 1, 1000);
      continue;
    }
    throw_errno("writing stdout");
  }
}

Error error_from(const json& j) {
  const json& e = j.contains("error") && j["error"].is_object() ? j["error"] : json::object();
  return Error(static_cast<Errc>(client::errc_from_string(e.value("code", "internal"))),
               e.value("message", "error"), e.value("field", ""));
}

// What the CLI knows of its exec across sessions: its id (from the start
// event) and how many bytes of terminal output it printed (the offset a
// reattach resumes from).
struct Progress {
  std::string exec_id;
  uint64_t offset = 0;
};

// The event loop of one session: everything on one thread (Beast's
// websocket stream is not for concurrent use).
class Session {
 public:
  Session(net::io_context& io, websocket::stream<stream::socket>& ws, Progress& progress)
      : io_(io), ws_(ws), signals_(io), in_(io), progress_(progress) {
    // Handled from the start, before the terminal goes raw: no signal may
    // end the process with the terminal left raw.
    signals_.add(SIGWINCH);
    signals_.add(SIGTERM);
    signals_.add(SIGHUP);
    // In raw mode the terminal sends Ctrl-C as a byte; a SIGINT/SIGQUIT
    // that still arrives (kill, or stdin not a terminal) goes to the
    // command as a signal.
    signals_.add(SIGINT);
    signals_.add(SIGQUIT);
  }

  int run() {
    int in = ::dup(0);
    if (in >= 0) {
      try {
        in_.assign(in);
        read_stdin();
      } catch (const boost::system::system_error&) {
        // Not pollable (a regular file): no input then.
        ::close(in);
      }
    }
    wait_signal();
    read_ws();
    io_.run();
    if (error_) throw *error_;
    if (local_signal_) return 128 + local_signal_;
    if (exit_.is_null())
      throw client::ConnectionLost("the connection to airlockd was lost during the session" +
                                   (lost_why_.empty() ? std::string() : ": " + lost_why_));
    return exit_code_of(exit_);
  }

 private:
  void read_stdin() {
    in_.async_read_some(net::buffer(inbuf_), [this](beast::error_code ec, size_t n) {
      if (ec || n == 0) {
        // A pty has no EOF of its own: for input from a pipe or file, its
        // end is the terminal's end-of-input character (Ctrl-D).
        if (!::isatty(0)) send(false, "\x04");
        return;
      }
      send(false, std::string(inbuf_, n));
      // Reading stops while the socket is backed up: the guest's pace.
      if (queued_ < (1 << 20))
        read_stdin();
      else
        stdin_paused_ = true;
    });
  }

  void wait_signal() {
    signals_.async_wait([this](beast::error_code ec, int sig) {
      if (ec) return;
      if (sig == SIGWINCH) {
        auto [cols, rows] = window_size();
        send(true, json{{"resize", {{"cols", cols}, {"rows", rows}}}}.dump());
      } else if (sig == SIGINT || sig == SIGQUIT) {
        send(true, json{{"signal", sig}}.dump());
      } else {
        // SIGTERM/SIGHUP: leave. The daemon sees the connection close and
        // kills the command; the terminal is restored on the way out.
        local_signal_ = sig;
        shutdown();
        return;
      }
      wait_signal();
    });
  }

  void read_ws() {
    ws_.async_read(rbuf_, [this](beast::error_code ec, size_t) {
      if (ec) {
        if (ec != websocket::error::closed) lost_why_ = ec.message();
        shutdown();
        return;
      }
      std::string payload = beast::buffers_to_string(rbuf_.data());
      rbuf_.consume(rbuf_.size());
      if (!ws_.got_text()) {
        write_out(payload);
        progress_.offset += payload.size();
      } else {
        json j = json::parse(payload, nullptr, false);
        std::string type = j.is_object() ? j.value("type", "") : "";
        if (type == "start") progress_.exec_id = j.value("exec_id", "");
        if (type == "attach") {
          uint64_t from = j.value("offset", progress_.offset);
          if (from > progress_.offset) {
            std::fprintf(stderr,
                         "\r\nairlock: %llu bytes of terminal output were lost while no "
                         "client was attached\r\n",
                         static_cast<unsigned long long>(from - progress_.offset));
            progress_.offset = from;
          }
        }
        if (type == "exit") exit_ = j;
        if (type == "error") error_ = error_from(j);
      }
      read_ws();
    });
  }

  void send(bool text, std::string payload) {
    if (done_) return;
    queued_ += payload.size();
    outq_.emplace_back(text, std::move(payload));
    write_next();
  }

  void write_next() {
    if (writing_ || outq_.empty() || done_) return;
    writing_ = true;
    ws_.text(outq_.front().first);
    ws_.async_write(net::buffer(outq_.front().second), [this](beast::error_code ec, size_t n) {
      writing_ = false;
      queued_ -= outq_.front().second.size();
      outq_.pop_front();
      (void)n;
      if (ec) {
        lost_why_ = ec.message();
        shutdown();
        return;
      }
      if (stdin_paused_ && queued_ < (1 << 19)) {
        stdin_paused_ = false;
        read_stdin();
      }
      write_next();
    });
  }

  // Ends the loop: nothing pending may keep io_.run() going.
  void shutdown() {
    if (done_) return;
    done_ = true;
    beast::error_code ignored;
    signals_.cancel(ignored);
    in_.close(ignored);
    beast::get_lowest_layer(ws_).shutdown(stream::socket::shutdown_both, ignored);
    beast::get_lowest_layer(ws_).close(ignored);
  }

  net::io_context& io_;
  websocket::stream<stream::socket>& ws_;
  net::signal_set signals_;
  net::posix::stream_descriptor in_;
  char inbuf_[16384];
  beast::flat_buffer rbuf_;
  std::deque<std::pair<bool, std::string>> outq_;
  size_t queued_ = 0;
  bool writing_ = false, stdin_paused_ = false, done_ = false;
  json exit_;
  std::optional<Error> error_;
  std::string lost_why_;
  int local_signal_ = 0;
  Progress& progress_;
};

// Connects and upgrades to the pty route, then sends `start`. Errors the
// daemon answers are thrown as they are; airlockd not there: unavailable.
void open_session(const std::filesystem::path& socket, const std::string& id,
                  websocket::stream<stream::socket>& ws, const json& start) {
  beast::error_code ec;
  beast::get_lowest_layer(ws).connect(stream::endpoint(socket.string()), ec);
  if (ec)
    throw Error(Errc::unavailable,
                "cannot connect to airlockd at " + socket.string() + ": " + ec.message());
  ws.set_option(websocket::stream_base::decorator([](websocket::request_type& req) {
    req.set(beast::http::field::user_agent, "airlock/" AIRLOCK_VERSION);
  }));
  ws.read_message_max(1 << 20);
  const std::string target = "/v1/sandboxes/" + id + "/pty";
  ws.handshake("localhost", target, ec);
  if (ec) {
    // Refused before the upgrade (no such sandbox, not running): Beast does
    // not hand the answer back, so ask again as plain HTTP, which gets the
    // daemon's error answer (thrown by call()).
    client::Client(socket).call("GET", target);
    throw Error(Errc::unavailable, "websocket handshake with airlockd failed: " + ec.message());
  }
  ws.text(true);
  ws.write(net::buffer(start.dump()), ec);
  if (ec) throw client::ConnectionLost("sending the start message failed: " + ec.message());
}

}  // namespace

int run_pty(const std::filesystem::path& socket, const std::string& id, const PtyOptions& opts) {
  if (client::parse_remote(socket.string()))
    throw Error(Errc::invalid_argument,
                "a terminal (shell, exec -t) is not served over AIRLOCK_URL yet: use the unix "
                "socket",
                "AIRLOCK_URL");
  auto [cols, rows] = window_size();
  json start = pty_start_message(opts, cols, rows, std::getenv("TERM"));
  Progress progress;
  const auto patience = reattach_patience();
  std::optional<RawTerminal> raw;
  ::signal(SIGPIPE, SIG_IGN);  // a closed stdout is an error, not death in raw mode
  for (;;) {
    {
      net::io_context io;
      websocket::stream<stream::socket> ws(io);
      open_session(socket, id, ws, start);
      // From here until return or throw the terminal is raw; the guard's
      // destructor restores it on every path (SIGTERM/SIGHUP are handled in
      // the loop, not by dying).
      Session session(io, ws, progress);
      if (!raw) raw.emplace(0);
      try {
        return session.run();
      } catch (const client::ConnectionLost&) {
        // The daemon went away (killed, restarted): the exec runs on in the
        // guest, so wait for airlockd and attach again from what was printed.
        if (progress.exec_id.empty() || patience.count() == 0) throw;
      }
    }
    std::fprintf(stderr, "\r\nairlock: the connection to airlockd was lost; reattaching...\r\n");
    // Waiting in raw mode: SIGTERM/SIGHUP/SIGINT still end the CLI cleanly.
    net::io_context wio;
    net::signal_set sigs(wio, SIGTERM, SIGHUP, SIGINT);
    int got = 0;
    sigs.async_wait([&](const beast::error_code& ec, int s) {
      if (!ec) got = s;
    });
    auto [c, r] = window_size();
    start = {{"exec_id", progress.exec_id}, {"offset", progress.offset}, {"cols", c}, {"rows", r}};
    const auto give_up = std::chrono::steady_clock::now() + patience;
    for (int attempt = 0;; ++attempt) {
      wio.run_for(std::chrono::milliseconds(attempt < 10 ? 200 : 500));
      if (got) return 128 + got;
      // A probe: once airlockd answers, the next round attaches.
      try {
        client::Client(socket).call("GET", "/v1/sandboxes/" + id);
        break;
      } catch (const Error& e) {
        if (e.code() != Errc::unavailable) throw;
        if (std::chrono::steady_clock::now() >= give_up)
          throw client::ConnectionLost("could not reattach to exec " + progress.exec_id +
                                       " within " + std::to_string(patience.count() / 1000) +
                                       " s: " + e.what());
      }
    }
  }
}

}  // namespace airlock::cli

#include "daemon/pty.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/buffers_to_string.hpp>
#include <boost/beast/websocket.hpp>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <variant>

#include "daemon/request.h"

namespace airlock::daemon {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace websocket = beast::websocket;
using nlohmann::json;
using stream = net::local::stream_protocol;

namespace {

// Terminal output queued for the client beyond which the exec's output
// callback waits (so the guest's credit window stalls the program), and
// input queued for the guest beyond which the socket is not read.
constexpr size_t kMaxQueuedOut = 1 << 20;
constexpr size_t kMaxQueuedIn = 1 << 20;
constexpr size_t kMaxMessage = 1 << 20;
constexpr auto kFirstMessageTimeout = std::chrono::seconds(30);

[[noreturn]] void bad(const std::string& message, const std::string& field) {
  throw Error(Errc::invalid_argument, message, field);
}

int size_field(const json& j, const char* key, const std::string& prefix) {
  const std::string field = prefix + key;
  auto it = j.find(key);
  if (it == j.end()) bad(field + " is required", field);
  if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > 4096)
    bad(field + " must be an integer in 1..4096", field);
  return static_cast<int>(it->get<int64_t>());
}

json parse_text(const std::string& text) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) bad("a text frame must be a JSON object", "body");
  return j;
}

}  // namespace

engine::ExecRequest parse_pty_start(const std::string& text) {
  json j = parse_text(text);
  for (auto& [k, v] : j.items())
    if (k != "argv" && k != "cols" && k != "rows" && k != "env" && k != "cwd" && k != "user" &&
        k != "limits")
      bad("unknown field " + k + " (argv, cols, rows, env, cwd, user, limits)", k);
  int cols = size_field(j, "cols", ""), rows = size_field(j, "rows", "");
  json body = j;
  body.erase("cols");
  body.erase("rows");
  // Without argv: the user's login shell (the guest picks it); parse_exec
  // wants a command, so it checks the rest against a placeholder.
  bool shell = !j.contains("argv") || j["argv"].is_null();
  if (shell) body["argv"] = {"sh"};
  engine::ExecRequest req = parse_exec(body.dump());
  if (shell) req.argv.clear();
  req.pty = engine::ExecRequest::Pty{cols, rows};
  return req;
}

std::optional<PtyAttach> parse_pty_attach(const std::string& text) {
  json j = parse_text(text);
  if (!j.contains("exec_id")) return std::nullopt;
  PtyAttach a;
  for (auto& [k, v] : j.items())
    if (k != "exec_id" && k != "offset" && k != "cols" && k != "rows")
      bad("unknown field " + k + " of an attach message (exec_id, offset, cols, rows)", k);
  if (!j["exec_id"].is_string()) bad("exec_id must be a string", "exec_id");
  a.exec_id = j["exec_id"].get<std::string>();
  if (auto o = j.find("offset"); o != j.end()) {
    if (!o->is_number_unsigned()) bad("offset must be a byte count (an integer >= 0)", "offset");
    a.offset = o->get<uint64_t>();
  }
  if (j.contains("cols") || j.contains("rows"))
    a.size = std::make_pair(size_field(j, "cols", ""), size_field(j, "rows", ""));
  return a;
}

PtyControl parse_pty_control(const std::string& text) {
  json j = parse_text(text);
  PtyControl c;
  if (j.size() != 1 || !(j.contains("resize") || j.contains("signal")))
    bad("a control frame is {\"resize\": {\"cols\", \"rows\"}} or {\"signal\": N}", "body");
  if (j.contains("resize")) {
    const json& r = j["resize"];
    if (!r.is_object()) bad("resize must be an object {cols, rows}", "resize");
    c.resize = std::make_pair(size_field(r, "cols", "resize."), size_field(r, "rows", "resize."));
  } else {
    const json& s = j["signal"];
    if (!s.is_number_integer() || s.get<int64_t>() < 1 || s.get<int64_t>() > 64)
      bad("signal must be an integer in 1..64", "signal");
    c.signal = static_cast<int>(s.get<int64_t>());
  }
  return c;
}

namespace {

// One upgraded connection. Threads: the connection's own (runs `io`: every
// WebSocket operation), the exec thread (Engine::exec, blocking; its
// callbacks post output to `io`) and the input thread (hands terminal
// input, resizes and signals to the engine, which may block on the guest's
// credit). Either side going away ends the other: the client gone kills the
// exec, the exec ended closes the WebSocket.
class Session {
 public:
  Session(engine::SandboxService& engine, std::string id, int fd)
      : engine_(engine), id_(std::move(id)), ws_(stream::socket(io_, stream(), fd)), timer_(io_) {}

  void run(const http::request<http::buffer_body>& req);

 private:
  struct Input {
    std::variant<std::string, std::pair<int, int>, int> what;  // bytes, resize, signal
  };

  void read_first();
  void read_next();
  void on_message(bool text, std::string payload);
  void send(bool text, std::string payload);
  void write_next();
  void fail_and_close(const Error& e);
  void close();
  void client_gone(const std::string& why);
  void start_exec(engine::ExecRequest req);
  void start_attach(PtyAttach a);
  // Output of the exec or attach (exec thread): queued for the client,
  // waiting while too much is queued; false once the client is gone.
  bool forward_output(std::string_view bytes);
  // Runs the exec thread's call; its result (or its error) as the last
  // event, then finish().
  template <typename Call>
  void run_to_end(Call call);
  void finish(json last);
  void input_loop();

  engine::SandboxService& engine_;
  const std::string id_;
  net::io_context io_;
  websocket::stream<stream::socket> ws_;
  net::steady_timer timer_;
  beast::flat_buffer rbuf_;

  // io thread only
  std::deque<std::pair<bool, std::string>> outq_;
  bool writing_ = false, closing_ = false, closed_ = false, started_ = false;
  bool read_paused_ = false;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work_;

  // shared, under mu_
  std::mutex mu_;
  std::condition_variable cv_;
  size_t out_bytes_ = 0;  // output posted but not yet written
  size_t in_bytes_ = 0;   // input queued for the guest
  std::deque<Input> inq_;
  std::string exec_id_;
  bool gone_ = false;       // the client went away (or the session is over)
  bool exec_done_ = false;  // Engine::exec returned
  // An attach session: the client going away detaches (the exec runs on,
  // as for GET .../exec/{exec_id}?offset=), it does not kill.
  bool attaching_ = false;
  std::thread exec_thread_, input_thread_;
};

void Session::run(const http::request<http::buffer_body>& req) {
  ws_.set_option(websocket::stream_base::decorator([](websocket::response_type& res) {
    res.set(http::field::server, "airlockd/" AIRLOCK_VERSION);
  }));
  // No idle limit (a shell may sit for hours); the close handshake is bounded.
  websocket::stream_base::timeout t{};
  t.handshake_timeout = std::chrono::seconds(5);
  t.idle_timeout = websocket::stream_base::none();
  t.keep_alive_pings = false;
  ws_.set_option(t);
  ws_.read_message_max(kMaxMessage);
  beast::error_code ec;
  ws_.accept(req, ec);
  if (ec) {
    spdlog::info("pty {}: websocket handshake failed: {}", id_, ec.message());
    return;
  }
  read_first();
  io_.run();
  // The socket is done. Whatever still runs is stopped and joined: every
  // path out of here (exit, error, client gone, daemon stop) passes this.
  {
    std::lock_guard lock(mu_);
    gone_ = true;
  }
  cv_.notify_all();
  if (input_thread_.joinable()) input_thread_.join();
  if (exec_thread_.joinable()) exec_thread_.join();
}

void Session::read_first() {
  timer_.expires_after(kFirstMessageTimeout);
  timer_.async_wait([this](beast::error_code ec) {
    if (ec || started_) return;
    fail_and_close(Error(Errc::timeout, "no start message within 30 s", "body"));
  });
  read_next();
}

void Session::read_next() {
  ws_.async_read(rbuf_, [this](beast::error_code ec, size_t) {
    if (ec) {
      client_gone(ec.message());
      return;
    }
    std::string payload = beast::buffers_to_string(rbuf_.data());
    rbuf_.consume(rbuf_.size());
    on_message(ws_.got_text(), std::move(payload));
  });
}

void Session::on_message(bool text, std::string payload) {
  if (closing_) return read_next();  // draining until the client's close
  try {
    if (!started_) {
      if (!text) bad("the first message must be a text frame with the start request", "body");
      if (auto a = parse_pty_attach(payload)) {
        started_ = true;
        timer_.cancel();
        start_attach(std::move(*a));
        return read_next();
      }
      engine::ExecRequest req = parse_pty_start(payload);
      started_ = true;
      timer_.cancel();
      start_exec(std::move(req));
      return read_next();
    }
    Input in;
    size_t n = 0;
    if (!text) {
      n = payload.size();
      in.what = std::move(payload);
    } else {
      PtyControl c = parse_pty_control(payload);
      if (c.resize)
        in.what = *c.resize;
      else
        in.what = *c.signal;
    }
    bool pause;
    {
      std::lock_guard lock(mu_);
      inq_.push_back(std::move(in));
      in_bytes_ += n;
      pause = in_bytes_ >= kMaxQueuedIn;
    }
    cv_.notify_all();
    // Not reading makes the client's writes block: the guest's pace.
    if (pause)
      read_paused_ = true;
    else
      read_next();
  } catch (const Error& e) {
    fail_and_close(e);
  }
}

void Session::send(bool text, std::string payload) {
  if (closed_ || closing_) return;
  outq_.emplace_back(text, std::move(payload));
  write_next();
}

void Session::write_next() {
  if (writing_ || closed_) return;
  if (outq_.empty()) {
    if (closing_) close();
    return;
  }
  writing_ = true;
  ws_.text(outq_.front().first);
  ws_.async_write(net::buffer(outq_.front().second), [this](beast::error_code ec, size_t) {
    writing_ = false;
    bool text = outq_.front().first;
    size_t n = outq_.front().second.size();
    outq_.pop_front();
    if (!text) {
      {
        std::lock_guard lock(mu_);
        out_bytes_ -= n;
      }
      cv_.notify_all();
    }
    if (ec) {
      client_gone(ec.message());
      return;
    }
    write_next();
  });
}

// After the queued frames: the error frame, then the close handshake.
void Session::fail_and_close(const Error& e) {
  json j = error_body(to_string(e.code()), e.what(), e.field());
  j["type"] = "error";
  send(true, j.dump());
  closing_ = true;
  write_next();
  // A client error ends the exec too (it may not have started yet).
  client_gone(std::string("error: ") + e.what());
}

void Session::close() {
  if (closed_) return;
  closed_ = true;
  ws_.async_close(websocket::close_code::normal, [this](beast::error_code) {
    // The pending read sees the client's close (or the handshake timeout).
  });
}

// The client is gone or the session failed: stop waiting for it, and kill
// the exec (the input thread does, as soon as it knows its id).
void Session::client_gone(const std::string& why) {
  bool first;
  {
    std::lock_guard lock(mu_);
    first = !gone_;
    gone_ = true;
  }
  cv_.notify_all();
  timer_.cancel();
  if (first) spdlog::info("pty {}: session ends ({})", id_, why);
  if (!closing_) {
    // Nothing more can be written to a client that went away.
    closing_ = true;
    closed_ = true;
    // The frame being written stays until its completion handler runs.
    outq_.erase(outq_.begin() + (writing_ && !outq_.empty() ? 1 : 0), outq_.end());
    beast::error_code ignored;
    beast::get_lowest_layer(ws_).shutdown(stream::socket::shutdown_both, ignored);
  }
}

void Session::start_exec(engine::ExecRequest req) {
  work_.emplace(net::make_work_guard(io_));
  input_thread_ = std::thread([this] { input_loop(); });
  exec_thread_ = std::thread([this, req = std::move(req)] {
    engine::ExecCallbacks cb;
    cb.on_start = [this](const std::string& exec_id, int pid) {
      {
        std::lock_guard lock(mu_);
        if (!exec_id_.empty()) return;  // a repeated start from the guest
        exec_id_ = exec_id;
      }
      cv_.notify_all();
      // The guest pid, as an exec's start gives it: a client that manages
      // the process (the containerd shim's pause) names it by it.
      net::post(io_, [this, exec_id, pid] {
        send(true, json{{"type", "start"}, {"exec_id", exec_id}, {"pid", pid}}.dump());
      });
    };
    cb.on_output = [this](int, std::string_view bytes) { return forward_output(bytes); };
    run_to_end([&]() -> std::optional<engine::ExecResult> { return engine_.exec(id_, req, cb); });
  });
}

bool Session::forward_output(std::string_view bytes) {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return gone_ || out_bytes_ < kMaxQueuedOut; });
  if (gone_) return false;  // an exec's client gone kills it; an attach's detaches
  out_bytes_ += bytes.size();
  lock.unlock();
  net::post(io_, [this, b = std::string(bytes)]() mutable { send(false, std::move(b)); });
  return true;
}

template <typename Call>
void Session::run_to_end(Call call) {
  json last;  // null: nothing to say (an attach whose client detached)
  try {
    if (std::optional<engine::ExecResult> r = call()) {
      last = engine::to_json(*r);
      last["type"] = "exit";
    }
  } catch (const Error& e) {
    last = error_body(to_string(e.code()), e.what(), e.field());
    last["type"] = "error";
  } catch (const std::exception& e) {
    last = error_body("internal", e.what());
    last["type"] = "error";
  }
  finish(std::move(last));
}

// The exec thread's last word (null: nothing to say, the client is gone).
void Session::finish(json last) {
  {
    std::lock_guard lock(mu_);
    exec_done_ = true;
  }
  cv_.notify_all();
  net::post(io_, [this, last] {
    if (!last.is_null()) send(true, last.dump());
    closing_ = true;
    write_next();
    work_.reset();
  });
}

// Engine::attach_exec on the exec thread: {"type":"attach", ...} (as the
// attach stream's first event), the terminal output from the offset, then
// the exit. Input goes to the exec once attached (exec_id_ set then).
void Session::start_attach(PtyAttach a) {
  attaching_ = true;
  work_.emplace(net::make_work_guard(io_));
  if (a.size) {
    std::lock_guard lock(mu_);
    inq_.push_back(Input{*a.size});
  }
  input_thread_ = std::thread([this] { input_loop(); });
  exec_thread_ = std::thread([this, a = std::move(a)] {
    engine::AttachCallbacks cb;
    cb.on_attached = [this, &a](const json& ev) {
      json j = ev;
      j["type"] = "attach";
      j["exec_id"] = a.exec_id;
      {
        std::lock_guard lock(mu_);
        exec_id_ = a.exec_id;
      }
      cv_.notify_all();
      net::post(io_, [this, j] { send(true, j.dump()); });
    };
    cb.on_output = [this](int, std::string_view bytes) { return forward_output(bytes); };
    cb.cancelled = [this] {
      std::lock_guard lock(mu_);
      return gone_;
    };
    run_to_end([&] { return engine_.attach_exec(id_, a.exec_id, a.offset, cb); });
  });
}

void Session::input_loop() {
  // An attach session's client going away detaches (attach_exec sees gone_).
  bool killed = attaching_;
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] {
      // Once the client is gone only the kill is left to do.
      return exec_done_ || (gone_ ? !killed : !exec_id_.empty() && !inq_.empty());
    });
    if (exec_done_) return;
    const std::string exec_id = exec_id_;
    if (gone_) {
      if (exec_id.empty()) {
        // Not started yet: wait for the start (or the failure) to kill it.
        cv_.wait(lock, [&] { return exec_done_ || !exec_id_.empty(); });
        continue;
      }
      lock.unlock();
      try {
        engine_.kill_exec(id_, exec_id, 9);
      } catch (const std::exception& e) {
        spdlog::debug("pty {}: kill after the client went away: {}", id_, e.what());
      }
      killed = true;
      lock.lock();
      continue;
    }
    Input in = std::move(inq_.front());
    inq_.pop_front();
    lock.unlock();
    size_t n = 0;
    try {
      if (auto* bytes = std::get_if<std::string>(&in.what)) {
        n = bytes->size();
        engine_.pty_input(id_, exec_id, *bytes);
      } else if (auto* size = std::get_if<std::pair<int, int>>(&in.what)) {
        engine_.pty_resize(id_, exec_id, size->first, size->second);
      } else {
        engine_.kill_exec(id_, exec_id, std::get<int>(in.what));
      }
    } catch (const std::exception& e) {
      // The exec ended meanwhile: its exit message is on the way.
      spdlog::debug("pty {}: input after the exec ended: {}", id_, e.what());
    }
    lock.lock();
    in_bytes_ -= n;
    if (in_bytes_ < kMaxQueuedIn / 2)
      net::post(io_, [this] {
        if (read_paused_ && !closed_) {
          read_paused_ = false;
          read_next();
        }
      });
  }
}

}  // namespace

void handle_pty(engine::SandboxService& engine, Exchange& ex, const std::string& id) {
  const auto& req = ex.request();
  // The sandbox first: a client whose handshake was refused can ask again
  // without upgrading to read why (Beast's client does not keep the answer).
  engine::SandboxInfo info = engine.get(id);  // not_found: a plain 404
  if (info.state != engine::State::running)
    throw Error(Errc::conflict,
                "sandbox " + id + " is " + engine::to_string(info.state) + ", not running");
  if (!websocket::is_upgrade(req))
    throw Error(Errc::invalid_argument,
                "this route is a WebSocket: send Connection: Upgrade and Upgrade: websocket",
                "upgrade");
  // The session runs the WebSocket on the raw fd: not over a TLS session
  // (its records would be read as WebSocket frames).
  if (ex.stream().tls)
    throw Error(Errc::unavailable,
                "the terminal route is not served over TLS yet: use the unix socket or a "
                "loopback --listen without TLS");
  // The session owns its own copy of the connection's fd (and an io_context
  // of its own) for the asynchronous reads and writes both ways; the server
  // still holds the original, so a daemon shutdown ends the session too.
  int fd = ::dup(ex.native_handle());
  if (fd < 0) throw_errno("dup");
  ex.mark_upgraded();
  Session session(engine, id, fd);  // owns fd from here
  session.run(req);
}

}  // namespace airlock::daemon

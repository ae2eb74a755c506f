#include "mcp/session.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <thread>

#include "client/text.h"
#include "common/error.h"
#include "daemon/base64.h"
#include "mcp/schema.h"
#include "mcp/tool_defs.h"

namespace airlock::mcp {

using nlohmann::json;

namespace {

// Closes a file descriptor when it goes out of scope.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

// What a tool produced: the text the model reads and the structured twin.
json outcome(std::string text, json structured) {
  return {{"text", std::move(text)}, {"structured", std::move(structured)}};
}

std::string id_path(const std::string& id) { return "/v1/sandboxes/" + client::url_encode(id); }

bool valid_utf8(const std::string& s) {
  try {
    (void)json(s).dump();
    return true;
  } catch (const json::type_error&) {
    return false;
  }
}

// Bytes as text for JSON: invalid UTF-8 sequences become U+FFFD (a JSON
// string must be UTF-8; command output need not be).
std::string as_utf8(const std::string& bytes) {
  if (valid_utf8(bytes)) return bytes;
  std::string dumped = json(bytes).dump(-1, ' ', false, json::error_handler_t::replace);
  return json::parse(dumped).get<std::string>();
}

void write_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno("buffering the upload");
    bytes.remove_prefix(size_t(n));
  }
}

// Copies the listed keys of `args` that are present into `body`.
void copy_keys(const json& args, json& body, std::initializer_list<const char*> keys) {
  for (const char* k : keys)
    if (args.contains(k)) body[k] = args[k];
}

}  // namespace

Session::Session(client::Client client, std::string tag, Scope scope)
    : client_(std::move(client)), tag_(std::move(tag)), scope_(scope) {}

void Session::check_scope(const std::string& id) const {
  if (scope_ == Scope::all) return;
  std::lock_guard lock(mu_);
  if (created_.count(id)) return;
  throw Error(Errc::not_found,
              "no sandbox " + id +
                  " among those this MCP session created (airlock mcp --all acts on every one)",
              "sandbox_id");
}

json Session::call(const std::string& name, const json& arguments, bool structured,
                   const std::string& call_key) {
  const json* tool = find_tool(name);
  auto failure = [](const std::string& code, const std::string& message, const std::string& field) {
    json err = {{"code", code}, {"message", message}};
    if (!field.empty()) err["field"] = field;
    std::string text =
        "error " + code + ": " + message + (field.empty() ? "" : " (field " + field + ")");
    return json{{"content", {{{"type", "text"}, {"text", text}}}}, {"isError", true}};
  };
  if (!tool) return failure("invalid_argument", "no tool named " + name, "name");
  json args = arguments.is_null() ? json::object() : arguments;
  if (auto bad = check_schema((*tool)["inputSchema"], args))
    return failure("invalid_argument", bad->message, bad->field);
  json done;
  try {
    if (name == "sandbox_create")
      done = create(args);
    else if (name == "sandbox_exec")
      done = exec(args, call_key);
    else if (name == "sandbox_write_file")
      done = write_file(args);
    else if (name == "sandbox_read_file")
      done = read_file(args);
    else if (name == "sandbox_list_files")
      done = list_files(args);
    else if (name == "sandbox_set_network")
      done = set_network(args);
    else if (name == "sandbox_logs")
      done = logs(args);
    else if (name == "sandbox_destroy")
      done = destroy(args);
    else if (name == "sandbox_list")
      done = list(args);
  } catch (const Error& e) {
    return failure(std::string(to_string(e.code())), e.what(), e.field());
  } catch (const std::exception& e) {
    return failure("internal", e.what(), "");
  }
  json result = {{"content", {{{"type", "text"}, {"text", done["text"]}}}}, {"isError", false}};
  if (structured) result["structuredContent"] = std::move(done["structured"]);
  return result;
}

void Session::close() {
  std::set<std::string> victims;
  {
    std::lock_guard lock(mu_);
    closed_ = true;
    victims = owned_;
  }
  // In parallel: clients give a server a couple of seconds to exit before
  // they kill it, and each destroy waits for its VM to stop.
  std::vector<std::thread> workers;
  for (const auto& id : victims)
    workers.emplace_back([this, id] {
      try {
        client_.call("DELETE", id_path(id));
      } catch (const Error& e) {
        // Already gone (destroyed by its timeout, say) is what we wanted.
        if (e.code() != Errc::not_found) {
          std::fprintf(stderr, "airlock mcp: destroying %s failed: %s\n", id.c_str(), e.what());
          return;  // still owned: the guardian tries again
        }
      }
      disown(id);
    });
  for (auto& w : workers) w.join();
}

void Session::disown(const std::string& id) {
  std::lock_guard lock(mu_);
  if (owned_.erase(id) && observer_) observer_(id, false);
}

void Session::set_observer(std::function<void(const std::string&, bool)> observer) {
  std::lock_guard lock(mu_);
  observer_ = std::move(observer);
}

bool Session::cancel(const std::string& call_key) {
  Running target;
  {
    std::lock_guard lock(mu_);
    auto it = running_.find(call_key);
    if (it == running_.end()) return false;
    if (it->second.exec_id.empty()) {  // not started yet: exec kills it on its start event
      it->second.cancel_pending = true;
      return true;
    }
    target = it->second;
  }
  return kill(target);
}

bool Session::kill(const Running& target) {
  try {
    client_.call("DELETE",
                 id_path(target.sandbox_id) + "/exec/" + client::url_encode(target.exec_id));
  } catch (const Error&) {
    return false;  // it ended meanwhile (404), or the sandbox went away
  }
  return true;
}

std::vector<std::string> Session::owned() const {
  std::lock_guard lock(mu_);
  return {owned_.begin(), owned_.end()};
}

json Session::create(const json& args) {
  bool keep = args.value("keep", false);
  {
    std::lock_guard lock(mu_);
    if (closed_) throw Error(Errc::conflict, "the MCP session is closing");
  }
  json body = json::object();
  copy_keys(args, body,
            {"image", "cpus", "memory_mb", "disk_mb", "timeout", "idle_timeout", "env", "metadata",
             "network"});
  if (!keep && !tag_.empty()) body["metadata"][kSessionLabel] = tag_;
  json sb = client_.call("POST", "/v1/sandboxes", body);
  std::string id = sb.value("id", "");
  {
    std::lock_guard lock(mu_);
    created_.insert(id);
  }
  if (!keep) {
    std::unique_lock lock(mu_);
    if (closed_) {
      // The client went away while this sandbox booted: nobody will use it.
      lock.unlock();
      client_.call("DELETE", id_path(id));
      throw Error(Errc::conflict, "the MCP session closed while the sandbox was created");
    }
    owned_.insert(id);
    if (observer_) observer_(id, true);
  }
  sb["keep"] = keep;
  std::string text =
      "created sandbox " + id + " (image " + sb.value("image", "?") + ", " +
      std::to_string(sb.value("cpus", 0)) + " cpu, " + std::to_string(sb.value("memory_mb", 0)) +
      " MiB, network " + sb.value("network", json::object()).value("mode", "none") + "); " +
      (keep ? "it outlives this MCP session" : "it is destroyed when this MCP session ends");
  return outcome(text, sb);
}

json Session::exec(const json& args, const std::string& call_key) {
  bool has_argv = args.contains("argv"), has_cmd = args.contains("command");
  if (has_argv == has_cmd)
    throw Error(Errc::invalid_argument, "give exactly one of argv and command",
                has_argv ? "command" : "argv");
  json body = json::object();
  if (has_argv) body["argv"] = args["argv"];
  if (has_cmd) body["cmd"] = args["command"];
  copy_keys(args, body, {"cwd", "env", "user", "stdin"});
  body["timeout"] = args.value("timeout", kDefaultExecTimeoutS);
  body["output_limit_bytes"] = args.value("max_output_bytes", kDefaultMaxOutputBytes);
  std::string out, err;
  std::string sid = args["sandbox_id"];
  check_scope(sid);
  struct Forget {  // the command is no longer cancellable once exec returns
    Session* s;
    const std::string& key;
    ~Forget() {
      std::lock_guard lock(s->mu_);
      s->running_.erase(key);
    }
  } forget{this, call_key};
  if (!call_key.empty()) {
    std::lock_guard lock(mu_);
    running_[call_key] = Running{sid, "", false};
  }
  json exit = client_.exec(sid, body, [&](const json& ev) {
    std::string type = ev.value("type", "");
    if (type == "start" && !call_key.empty()) {
      Running now;
      {
        std::lock_guard lock(mu_);
        Running& r = running_[call_key];
        r.exec_id = ev.value("exec_id", "");
        now = r;
      }
      if (now.cancel_pending) kill(now);  // cancelled while it was starting
    }
    if (type != "stdout" && type != "stderr") return;
    auto bytes = daemon::base64_decode(ev.value("data", ""));
    if (!bytes) throw Error(Errc::internal, "airlockd sent invalid base64 output");
    (type == "stdout" ? out : err) += *bytes;
  });
  uint64_t out_dropped = exit.value("stdout_dropped", uint64_t{0});
  uint64_t err_dropped = exit.value("stderr_dropped", uint64_t{0});
  json s = {{"exit_code", exit.value("exit_code", json(nullptr))},
            {"signal", exit.value("signal", json(nullptr))},
            {"reason", exit.value("reason", "")},
            {"timed_out", exit.value("timed_out", false)},
            {"duration_ms", exit.value("duration_ms", int64_t{0})},
            {"stdout", as_utf8(out)},
            {"stderr", as_utf8(err)},
            {"stdout_truncated", out_dropped > 0},
            {"stderr_truncated", err_dropped > 0},
            {"stdout_dropped", out_dropped},
            {"stderr_dropped", err_dropped}};
  if (exit.contains("exec_id")) s["exec_id"] = exit["exec_id"];
  std::string text = "exit_code: " + (s["exit_code"].is_null() ? "none" : s["exit_code"].dump()) +
                     " (" + s["reason"].get<std::string>() +
                     (s["signal"].is_null() ? "" : ", signal " + s["signal"].dump()) + ", " +
                     std::to_string(s["duration_ms"].get<int64_t>()) + " ms)\n";
  text += "--- stdout" +
          (out_dropped ? " (truncated, " + std::to_string(out_dropped) + " bytes dropped)"
                       : std::string()) +
          " ---\n" + s["stdout"].get<std::string>();
  if (!out.empty() && out.back() != '\n') text += "\n";
  text += "--- stderr" +
          (err_dropped ? " (truncated, " + std::to_string(err_dropped) + " bytes dropped)"
                       : std::string()) +
          " ---\n" + s["stderr"].get<std::string>();
  return outcome(text, s);
}

json Session::write_file(const json& args) {
  std::string content = args["content"];
  if (args.value("encoding", "utf8") == "base64") {
    auto bytes = daemon::base64_decode(content);
    if (!bytes) throw Error(Errc::invalid_argument, "content is not valid base64", "content");
    content = std::move(*bytes);
  }
  uint32_t mode = uint32_t(std::stoul(args.value("mode", "0644"), nullptr, 8));
  check_scope(args["sandbox_id"]);
  // The CLI's client streams uploads from a file descriptor; an anonymous
  // memory file holds the content (never a path anyone else can reach).
  Fd fd(::memfd_create("airlock-mcp-upload", MFD_CLOEXEC));
  if (fd.get() < 0) throw_errno("memfd_create");
  write_all(fd.get(), content);
  if (::lseek(fd.get(), 0, SEEK_SET) < 0) throw_errno("lseek");
  std::string path = args["path"];
  uint64_t n = client_.upload(args["sandbox_id"], path, mode, fd.get());
  return outcome("wrote " + std::to_string(n) + " bytes to " + path,
                 {{"path", path}, {"bytes", n}});
}

json Session::read_file(const json& args) {
  std::string path = args["path"];
  size_t max = size_t(args.value("max_bytes", kDefaultMaxReadBytes));
  check_scope(args["sandbox_id"]);
  // The download goes through a pipe that is read only up to max_bytes + 1:
  // however large the guest makes the file, memory here stays bounded (the
  // download fails with EPIPE once the reader stops, which is expected).
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) throw_errno("pipe");
  Fd rd(p[0]), wr(p[1]);
  std::exception_ptr failure;
  std::thread writer([&] {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);  // EPIPE, not a fatal signal
    try {
      client_.download(args["sandbox_id"], path, wr.get());
    } catch (...) {
      failure = std::current_exception();
    }
    wr.reset();  // EOF for the reader
  });
  std::string data;
  char buf[65536];
  while (data.size() <= max) {
    ssize_t n = ::read(rd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    data.append(buf, size_t(n));
  }
  bool truncated = data.size() > max;
  rd.reset();  // a writer still sending now fails with EPIPE and returns
  writer.join();
  if (failure && !truncated) std::rethrow_exception(failure);
  if (truncated) data.resize(max);
  bool b64 = args.value("encoding", "utf8") == "base64" || !valid_utf8(data);
  json s = {{"path", path},
            {"content", b64 ? daemon::base64_encode(data) : data},
            {"encoding", b64 ? "base64" : "utf8"},
            {"bytes", data.size()},
            {"truncated", truncated}};
  std::string text = truncated ? "first " + std::to_string(max) + " bytes of " + path + ":\n"
                               : path + " (" + std::to_string(data.size()) + " bytes" +
                                     (b64 ? ", base64" : "") + "):\n";
  return outcome(text + s["content"].get<std::string>(), s);
}

json Session::list_files(const json& args) {
  std::string path = args["path"];
  check_scope(args["sandbox_id"]);
  json answer = client_.call(
      "GET", id_path(args["sandbox_id"]) + "/files/list?path=" + client::url_encode(path));
  json entries = answer.is_object() && answer.contains("entries") ? answer["entries"]
                 : answer.is_array()                              ? answer
                                                                  : json::array();
  std::string text = path + ": " + std::to_string(entries.size()) + " entries\n";
  for (const auto& e : entries) {
    text += e.value("type", "?") + " " + e.value("name", "?");
    if (e.contains("size")) text += " " + e["size"].dump();
    text += "\n";
  }
  return outcome(text, {{"path", path}, {"entries", entries}});
}

json Session::set_network(const json& args) {
  json policy = {{"mode", args["mode"]}};
  copy_keys(args, policy, {"allow", "deny"});
  check_scope(args["sandbox_id"]);
  json answer = client_.call("PATCH", id_path(args["sandbox_id"]) + "/network", policy);
  if (!answer.is_object()) answer = json::object();
  if (!answer.contains("policy")) answer["policy"] = policy;
  return outcome("network policy now " + answer["policy"].dump() +
                     "; flows cut: " + std::to_string(answer.value("flows_cut", 0)),
                 answer);
}

json Session::logs(const json& args) {
  bool net = args.value("network", false);
  check_scope(args["sandbox_id"]);
  json records =
      client_.call("GET", id_path(args["sandbox_id"]) + (net ? "/network/events" : "/logs"));
  if (!records.is_array()) records = json::array();
  size_t total = records.size();
  size_t limit = size_t(args.value("limit", kDefaultLogLimit));
  json recent = json::array();
  for (size_t i = total > limit ? total - limit : 0; i < total; ++i) recent.push_back(records[i]);
  std::string text = std::to_string(recent.size()) + " of " + std::to_string(total) + " records\n";
  for (const auto& r : recent)
    text += (net ? client::format_net_event(r) : client::format_audit_line(r)) + "\n";
  return outcome(text, {{"records", recent}, {"total", total}});
}

json Session::destroy(const json& args) {
  std::string id = args["sandbox_id"];
  check_scope(id);
  client_.call("DELETE", id_path(id));
  disown(id);
  return outcome("destroyed sandbox " + id, {{"id", id}, {"destroyed", true}});
}

json Session::list(const json& args) {
  std::string q = args.value("all", false) ? "all=true" : "";
  json metadata = args.value("metadata", json::object());
  for (const auto& [k, v] : metadata.items())
    q += (q.empty() ? "" : "&") + client::url_encode("metadata." + k) + "=" +
         client::url_encode(v.get<std::string>());
  json list = client_.call("GET", "/v1/sandboxes" + (q.empty() ? "" : "?" + q));
  if (!list.is_array()) list = json::array();
  std::set<std::string> mine, created;
  {
    std::lock_guard lock(mu_);
    mine = owned_;
    created = created_;
  }
  if (scope_ != Scope::all) {
    json only = json::array();
    for (auto& sb : list)
      if (created.count(sb.value("id", ""))) only.push_back(std::move(sb));
    list = std::move(only);
  }
  std::string text = std::to_string(list.size()) + " sandboxes\n";
  for (auto& sb : list) {
    std::string id = sb.value("id", "");
    text += id + " " + sb.value("image", "?") + " " + sb.value("state", "?") +
            (mine.count(id) ? " (destroyed when this session ends)" : "") + "\n";
  }
  return outcome(text, {{"sandboxes", list}});
}

}  // namespace airlock::mcp

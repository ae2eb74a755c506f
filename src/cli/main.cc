// airlock: docker-like verbs over airlockd (started on demand), plus image
// build/ls run directly in this process.
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <optional>
#include <thread>

#include "cli/args.h"
#include "cli/attach.h"
#include "cli/client.h"
#include "cli/image_cmd.h"
#include "cli/journal_cmd.h"
#include "cli/pool_cmd.h"
#include "cli/probe.h"
#include "cli/pty_client.h"
#include "cli/recipe_cmd.h"
#include "cli/snapshot_cmd.h"
#include "cli/spawn.h"
#include "cli/stdin_pump.h"
#include "cli/token_cmd.h"
#include "common/error.h"
#include "daemon/base64.h"
#include "daemon/paths.h"
#include "engine/storage/image_store.h"
#include "mcp/guardian.h"
#include "mcp/session.h"
#include "mcp/stdio.h"

namespace airlock::cli {
namespace {

using nlohmann::json;

struct Globals {
  std::string socket, data_dir, image_dir;
  std::string url;  // AIRLOCK_URL: a daemon's TCP listener instead of the socket
  DaemonPaths paths() const {
    DaemonPaths p;
    p.data_dir = std::filesystem::absolute(data_dir.empty() ? daemon::default_data_dir()
                                                            : std::filesystem::path(data_dir));
    p.socket = std::filesystem::absolute(socket.empty() ? daemon::default_socket(p.data_dir)
                                                        : std::filesystem::path(socket));
    if (!image_dir.empty()) p.image_dir = std::filesystem::absolute(image_dir);
    return p;
  }
};

Client connect(const Globals& g) {
  // A remote daemon is used as it is: nothing to start.
  if (!g.url.empty() && parse_remote(g.url)) return Client(g.url);
  DaemonPaths p = g.paths();
  Client c(p.socket);
  ensure_daemon(c, p);
  return c;
}

void write_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno(fd == 1 ? "writing stdout" : "writing stderr");
    bytes.remove_prefix(size_t(n));
  }
}

std::string read_all_fd(int fd) {
  std::string out;
  char buf[65536];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno("reading stdin");
    if (n == 0) return out;
    out.append(buf, size_t(n));
  }
}

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Runs an exec, writing its stdout/stderr as raw bytes as they arrive.
int run_exec(const Client& c, const std::string& id, const ExecOptions& opts,
             const std::vector<std::string>& argv, bool interactive) {
  std::optional<std::string> in;
  // A closed stdin (e.g. a CI runner without one) means no input, not an error.
  bool stdin_open = ::fcntl(0, F_GETFD) != -1;
  bool forward = stdin_open && (interactive || !::isatty(0));
  // Pipes, sockets, terminals (-i) and big files are streamed as they are
  // read (a line typed into `sh` over a pipe is answered at once; 2 GiB go
  // through in bounded memory). A small file or /dev/null goes inline.
  struct stat st {};
  bool small =
      forward && ::fstat(0, &st) == 0 &&
      ((S_ISREG(st.st_mode) && st.st_size <= (1 << 20)) || (S_ISCHR(st.st_mode) && !::isatty(0)));
  if (forward && small) in = read_all_fd(0);
  json body = exec_body(opts, argv, in);
  std::unique_ptr<StdinPump> pump;
  if (forward && !small) {
    body["stdin_stream"] = true;
    pump = std::make_unique<StdinPump>(c.socket(), id, 0, reattach_patience());
  }
  // Whatever ends the exec (exit, error, lost connection) ends the pump.
  struct PumpStop {
    std::unique_ptr<StdinPump>& p;
    ~PumpStop() {
      if (p) p->stop();
    }
  } pump_stop{pump};
  // Counted as printed: if the connection to airlockd breaks mid-exec (the
  // daemon was restarted), the rest is fetched from exactly this offset.
  AttachState resume{id, "", 0, 0};
  json exit;
  try {
    exit = c.exec(id, body, [&](const json& ev) {
      std::string type = ev.value("type", "");
      if (type == "start") {
        resume.exec_id = ev.value("exec_id", "");
        if (pump) pump->start(resume.exec_id);
      }
      if (type != "stdout" && type != "stderr") return;
      auto bytes = daemon::base64_decode(ev.value("data", ""));
      if (!bytes) throw Error(Errc::internal, "airlockd sent invalid base64 output");
      write_all(type == "stdout" ? 1 : 2, *bytes);
      resume.offset += bytes->size();
    });
  } catch (const ConnectionLost&) {
    auto patience = reattach_patience();
    if (resume.exec_id.empty() || patience.count() == 0) throw;
    // The pump resumes on its own (the guest keeps a detached exec's stdin).
    exit = reattach(c, resume, write_all, patience);
  }
  if (exit.value("timed_out", false))
    std::fprintf(stderr, "airlock: command timed out after %.3g s\n",
                 exit.value("duration_ms", 0) / 1000.0);
  std::string reason = exit.value("reason", "");
  if (reason == "pids_limit" || reason == "oom_killed" || reason == "cpu_limit" ||
      reason == "no_space" || reason == "killed")
    std::fprintf(stderr, "airlock: command ended: %s\n", reason.c_str());
  if (exit.value("truncated", false))
    std::fprintf(stderr, "airlock: output truncated (%llu stdout + %llu stderr bytes dropped)\n",
                 static_cast<unsigned long long>(exit.value("stdout_dropped", uint64_t{0})),
                 static_cast<unsigned long long>(exit.value("stderr_dropped", uint64_t{0})));
  return exit_code_of(exit);
}

// airlock attach ID EXEC_ID [--offset N]: the output of an exec whose client
// is gone, from byte N, then its exit status as exec's.
int run_attach(const Client& c, const std::string& id, const std::string& exec_id,
               uint64_t offset) {
  AttachState st{id, exec_id, offset, 0};
  json exit = reattach(c, st, write_all, reattach_patience());
  return exit_code_of(exit);
}

void add_network_flags(CLI::App* app, std::optional<std::string>& mode,
                       std::vector<std::string>& allow, std::vector<std::string>& deny) {
  app->add_option("--network", mode, "egress: none (default, no NIC), allowlist or open");
  app->add_option("--allow", allow, "allow a CIDR, host name or *.domain (repeatable)")
      ->allow_extra_args(false);
  app->add_option("--deny", deny, "deny a CIDR, host name or *.domain (repeatable)")
      ->allow_extra_args(false);
}

void add_create_flags(CLI::App* app, CreateOptions& o) {
  app->add_option("--image", o.image, "guest image (default: minimal)");
  app->add_option("--cpus", o.cpus, "virtual CPUs (1..16)");
  app->add_option("--memory", o.memory_mb, "memory in MiB (64..65536)");
  app->add_option("--disk", o.disk_mb, "disk size in MiB");
  app->add_option("--lifetime", o.timeout_s, "seconds before the sandbox is destroyed");
  app->add_option("--idle-timeout", o.idle_timeout_s,
                  "destroy (or pause, --on-idle) it after this many seconds without an exec or "
                  "call (0 = never)");
  app->add_option("--on-idle", o.on_idle, "what --idle-timeout does: destroy (default) or pause");
  add_network_flags(app, o.network, o.allow, o.deny);
}

void add_exec_flags(CLI::App* app, ExecOptions& o, bool& interactive) {
  app->add_flag("-i,--interactive", interactive, "forward stdin even if it is a terminal");
  app->add_option("--cwd", o.cwd, "working directory in the sandbox");
  app->add_option("--user", o.user, "user name or uid (default root)");
  app->add_option("--pids", o.pids, "limit: processes/threads of the command");
  app->add_option("--memory-limit", o.memory_limit_mb, "limit: MiB of memory of the command");
  app->add_option("--cpu-seconds", o.cpu_seconds, "limit: CPU seconds of the command");
  app->add_option("--output-limit", o.output_limit,
                  "bytes per stream kept (default 64 MiB); the rest is dropped");
}

void print_progress(const storage::BuildProgress& p, bool tty, std::string& last_step) {
  if (tty) {
    std::string line = "[" + p.step + "]";
    if (p.bytes) line += " " + human_bytes(p.bytes);
    std::fprintf(stdout, "\r%s\033[K", line.c_str());
    std::fflush(stdout);
  } else if (p.step != last_step) {
    std::fprintf(stdout, "[%s]\n", p.step.c_str());
    std::fflush(stdout);
  }
  last_step = p.step;
}

storage::ImageStore image_store(const Globals& g) {
  DaemonPaths p = g.paths();
  auto bin = daemon::exe_dir();
  auto dir = p.image_dir.empty() ? daemon::default_image_dir(p.data_dir) : p.image_dir;
  return storage::ImageStore(dir, bin.parent_path() / "share" / "airlock" / "images",
                             bin / "airlock-guest");
}

// The sandbox `run` must destroy, shared with the signal thread.
struct RunCleanup {
  std::mutex mu;
  std::string id;
  bool interrupted = false;
};

int main_impl(int argc, char** argv) {
  CLI::App app{"airlock: disposable microVM sandboxes"};
  app.require_subcommand(1);
  Globals g;
  app.add_option("--socket", g.socket, "airlockd's socket (default <data-dir>/airlockd.sock)")
      ->envname("AIRLOCK_SOCKET");
  app.add_option("--data-dir", g.data_dir, "data directory of the daemon")
      ->envname("AIRLOCK_DATA_DIR");
  app.add_option("--image-dir", g.image_dir, "guest image directory")->envname("AIRLOCK_IMAGE_DIR");
  app.add_option("--url", g.url,
                 "http(s)://HOST:PORT of an airlockd --listen instead of the socket (token: "
                 "$AIRLOCK_TOKEN, https CA: $AIRLOCK_CA)")
      ->envname("AIRLOCK_URL");
  app.set_version_flag("--version", AIRLOCK_VERSION);

  CreateOptions copts;
  ExecOptions eopts;
  bool json_out = false, all = false, interactive = false;
  std::vector<std::string> metas, ids, argv_rest;
  std::string id, src, dst, image_name;
  std::optional<double> exec_timeout;

  auto* create = app.add_subcommand("create", "create a sandbox and print its id");
  add_create_flags(create, copts);
  create->add_option("--timeout", copts.timeout_s, "seconds of life (same as --lifetime)");
  create->add_option("--env", copts.env, "KEY=VALUE default environment of every exec");
  create->add_option("--meta", copts.meta, "KEY=VALUE label");
  create->add_flag("--json", json_out, "print the sandbox as JSON");
  create->add_option("--from", copts.from, "start from this snapshot (airlock snapshot)");

  auto* ls = app.add_subcommand("ls", "list sandboxes");
  ls->add_flag("--json", json_out, "print JSON");
  ls->add_flag("-a,--all", all, "include deleted, failed and timed-out sandboxes");
  ls->add_option("--meta", metas, "KEY=VALUE filter");

  auto* exec = app.add_subcommand("exec", "run a command in a sandbox: exec ID -- ARGV...");
  add_exec_flags(exec, eopts, interactive);
  exec->add_option("--env", eopts.env, "KEY=VALUE");
  exec->add_option("--timeout", exec_timeout, "seconds before the command is killed");
  exec->add_flag("-d,--background", eopts.background,
                 "run detached; print its exec id (output is not kept)");
  bool tty = false;
  exec->add_flag("-t,--tty", tty, "run it on a terminal (a pty in the sandbox), like ssh -t");
  exec->add_option("id", id, "sandbox id")->required();
  exec->add_option("argv", argv_rest, "command and arguments (after --)");

  std::string attach_exec_id;
  uint64_t attach_offset = 0;
  auto* attach = app.add_subcommand(
      "attach", "the output of an exec whose client is gone (daemon restart): attach ID EXEC_ID");
  attach->add_option("--offset", attach_offset,
                     "first byte wanted (stdout and stderr counted together; default 0)");
  attach->add_option("id", id, "sandbox id")->required();
  attach->add_option("exec_id", attach_exec_id, "exec id (from exec's start event)")->required();

  PtyOptions shell_opts;
  auto* shell = app.add_subcommand("shell", "an interactive shell in a sandbox: shell ID");
  shell->add_option("--cwd", shell_opts.cwd, "working directory (default the user's home)");
  shell->add_option("--user", shell_opts.user, "user name or uid (default root)");
  shell->add_option("--env", shell_opts.env, "KEY=VALUE");
  shell->add_option("id", id, "sandbox id")->required();

  auto* run = app.add_subcommand("run", "create, exec, destroy: run [flags] -- ARGV...");
  add_create_flags(run, copts);
  add_exec_flags(run, eopts, interactive);
  run->add_option("--env", eopts.env, "KEY=VALUE");
  run->add_option("--meta", copts.meta, "KEY=VALUE label");
  run->add_option("--timeout", exec_timeout, "seconds before the command is killed");
  run->add_option("argv", argv_rest, "command and arguments (after --)");

  auto* cp = app.add_subcommand("cp", "copy a file: cp SRC DST, one side ID:/path, '-' = stdio");
  cp->add_option("src", src)->required();
  cp->add_option("dst", dst)->required();

  auto* rm = app.add_subcommand("rm", "destroy sandboxes");
  rm->add_option("ids", ids, "sandbox ids")->required();

  auto* logs = app.add_subcommand("logs", "a sandbox's audit journal");
  logs->add_option("id", id)->required();
  logs->add_flag("--json", json_out, "print JSON");
  bool net_logs = false, follow = false;
  logs->add_flag("--network", net_logs, "only network events, one line each");
  logs->add_flag("-f,--follow", follow, "keep printing new records as they are appended");
  bool verify = false;
  logs->add_flag("--verify", verify,
                 "check the journal's hash chain; exit 1 naming the first break");

  std::string watch_path;
  bool watch_recursive = false;
  auto* watch = app.add_subcommand(
      "watch", "print changes under a guest directory as they happen: watch ID PATH [-r]");
  watch->add_option("id", id)->required();
  watch->add_option("path", watch_path, "absolute guest directory")->required();
  watch->add_flag("-r,--recursive", watch_recursive, "also every directory below it");
  watch->add_flag("--json", json_out, "print the NDJSON events as they come");

  std::optional<std::string> net_mode;
  std::vector<std::string> net_allow, net_deny;
  auto* network =
      app.add_subcommand("network", "change a running sandbox's egress policy (no flags: show it)");
  network->add_option("id", id)->required();
  network->add_option("--mode", net_mode, "none, allowlist or open (--allow alone: allowlist)");
  network->add_option("--allow", net_allow, "allow a CIDR, host name or *.domain (repeatable)")
      ->allow_extra_args(false);
  network->add_option("--deny", net_deny, "deny a CIDR, host name or *.domain (repeatable)")
      ->allow_extra_args(false);
  network->add_flag("--json", json_out, "print JSON");

  std::optional<int> guest_port, host_port, remove_port;
  auto* port = app.add_subcommand(
      "port", "forward a host loopback port to a guest TCP port (no GUEST_PORT: list them)");
  port->add_option("id", id)->required();
  port->add_option("guest_port", guest_port, "the guest's TCP port")->check(CLI::Range(1, 65535));
  port->add_option("--host-port", host_port, "the 127.0.0.1 port (default: a free one)")
      ->check(CLI::Range(1024, 65535));
  port->add_option("--rm", remove_port, "stop the forward from this host port")
      ->check(CLI::Range(1, 65535));
  port->add_flag("--json", json_out, "print JSON");

  bool posture = false;
  auto* inspect = app.add_subcommand("inspect", "a sandbox's details; --posture: its QEMU jail");
  inspect->add_option("id", id)->required();
  inspect->add_flag("--posture", posture, "the jail as read back from /proc, and what is missing");
  inspect->add_flag("--json", json_out, "print JSON");

  PoolCommand pool;
  add_pool_command(app, pool);

  auto* info = app.add_subcommand("info", "daemon and host facts");
  info->add_flag("--json", json_out, "print JSON");

  ProbeOptions popts;
  auto* probe = app.add_subcommand(
      "probe", "run the containment battery against fresh sandboxes on this host");
  probe->add_option("--image", popts.image, "guest image (default: minimal)");
  probe->add_option("--network", popts.network, "policy of the ordinary task: none (default), open")
      ->check(CLI::IsMember({"none", "open"}));
  probe->add_flag("--json", popts.json, "print JSON");
  probe->add_flag("--quick", popts.quick, "fewer samples (time to a new instance over 3, not 10)");
  probe
      ->add_option("--only", popts.only,
                   "run only these sections: task, reach, leftovers, time, hostile, after "
                   "(repeatable; cleanup always runs)")
      ->delimiter(',');

  auto* mcp_cmd = app.add_subcommand(
      "mcp", "serve the Model Context Protocol on stdin/stdout (for MCP clients)");

  TokenCommands tokens;
  add_token_commands(app, tokens);
  JournalCommands journal_cmds;
  add_journal_commands(app, journal_cmds);
  SnapshotCommands snaps;
  add_snapshot_commands(app, snaps);

  auto* image = app.add_subcommand("image", "guest images");
  image->require_subcommand(1);
  auto* image_build = image->add_subcommand("build", "build an image (if its inputs changed)");
  image_build
      ->add_option("name", image_name,
                   "built-in recipe (minimal, debian), or with -f the new image's name")
      ->required();
  RecipeBuild recipe_build;
  image_build->add_option("-f,--file", recipe_build.file,
                          "build NAME from this recipe (airlock.toml) in build sandboxes");
  image_build->add_option("--arg", recipe_build.args,
                          "NAME=VALUE: a value for the recipe's [args]");
  image_build->add_flag("--json", json_out, "with -f: print the build's events as JSON lines");
  ImageCommands images;
  add_image_commands(app, *image, images);

  // Everything after the first "--" is the command of exec/run, verbatim
  // (CLI11 would otherwise read its "-c" as an option of ours).
  std::vector<std::string> command;
  int split = argc;
  for (int i = 1; i < argc; ++i)
    if (std::string_view(argv[i]) == "--") {
      split = i;
      break;
    }
  for (int i = split + 1; i < argc; ++i) command.push_back(argv[i]);
  try {
    app.parse(split, argv);
  } catch (const CLI::ParseError& e) {
    // --help/--version exit 0; every other parse error is a usage error: 2.
    int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  if (!command.empty()) argv_rest.insert(argv_rest.end(), command.begin(), command.end());
  if ((exec->parsed() || run->parsed()) && argv_rest.empty())
    throw UsageError("no command given: airlock " +
                     std::string(exec->parsed() ? "exec ID" : "run") + " -- ARGV...");

  if (mcp_cmd->parsed()) {
    DaemonPaths p = g.paths();
    Client c(g.url.empty() ? p.socket.string() : g.url);
    try {
      if (g.url.empty()) ensure_daemon(c, p);
    } catch (const Error& e) {
      // Serve anyway: every tool call then reports why the daemon is not
      // there, which an MCP client shows, where a dead server says nothing.
      std::fprintf(stderr, "airlock mcp: %s\n", e.what());
    }
    // After the daemon is started (it must not inherit the mask) and before
    // any thread (fork): the guardian destroys the session's sandboxes should
    // this process die without doing so; the session's signals go to its
    // signalfd.
    std::string tag = mcp::new_session_tag();
    mcp::Guardian guardian = mcp::Guardian::start(p.socket, tag);
    mcp::block_session_signals();
    mcp::Session session(c, tag);
    session.set_observer(
        [&guardian](const std::string& sid, bool owned) { guardian.note(sid, owned); });
    return mcp::serve(session, 0, 1);
  }
  if (run_token_command(tokens, [&] { return connect(g); })) return 0;
  if (run_image_command(images, [&] { return connect(g); })) return 0;
  if (int rc = run_journal_command(journal_cmds, [&] { return connect(g); }); rc >= 0) return rc;
  if (run_snapshot_command(snaps, [&] { return connect(g); })) return 0;
  if (create->parsed()) {
    json body = create_body(copts);  // usage errors before a daemon is started
    Client c = connect(g);
    json sb = c.call("POST", "/v1/sandboxes", body);
    std::cout << (json_out ? sb.dump(2) : sb.value("id", "")) << "\n";
    return 0;
  }
  if (ls->parsed()) {
    std::string target = "/v1/sandboxes";
    std::string q = all ? "all=true" : "";
    for (const auto& [k, v] : parse_kvs(metas, "--meta"))
      q += (q.empty() ? "" : "&") + url_encode("metadata." + k) + "=" + url_encode(v);
    if (!q.empty()) target += "?" + q;
    json list = connect(g).call("GET", target);
    std::cout << (json_out ? list.dump(2) + "\n" : format_sandbox_table(list, now_ms()));
    return 0;
  }
  if (shell->parsed()) {
    parse_kvs(shell_opts.env, "--env");  // usage errors before a daemon is started
    Client c = connect(g);
    return run_pty(c.socket(), id, shell_opts);
  }
  if (attach->parsed()) {
    Client c = connect(g);
    return run_attach(c, id, attach_exec_id, attach_offset);
  }
  if (exec->parsed() && tty) {
    if (eopts.background || exec_timeout || eopts.pids || eopts.memory_limit_mb ||
        eopts.cpu_seconds || eopts.output_limit || interactive)
      throw UsageError("--tty takes only --cwd, --user and --env");
    PtyOptions p{argv_rest, eopts.env, eopts.cwd, eopts.user};
    parse_kvs(p.env, "--env");
    Client c = connect(g);
    return run_pty(c.socket(), id, p);
  }
  if (exec->parsed()) {
    eopts.timeout_s = exec_timeout;
    if (eopts.background) {
      json body = exec_body(eopts, argv_rest, std::nullopt);
      json r = connect(g).call("POST", "/v1/sandboxes/" + id + "/exec", body);
      std::cout << r.value("exec_id", "") << "\n";
      return 0;
    }
    Client c = connect(g);
    return run_exec(c, id, eopts, argv_rest, interactive);
  }
  if (run->parsed()) {
    eopts.timeout_s = exec_timeout;
    // Validate everything before a sandbox exists.
    json create_req = create_body(copts);
    exec_body(eopts, argv_rest, std::nullopt);
    Client c = connect(g);
    // Ctrl-C / SIGTERM: a thread destroys the sandbox (which ends the exec);
    // the main thread then returns 130. Signals are blocked before any
    // thread starts so only that thread receives them.
    static RunCleanup cleanup;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    std::thread([set, &c] {
      int sig = 0;
      sigwait(&set, &sig);
      std::string victim;
      {
        std::lock_guard lock(cleanup.mu);
        cleanup.interrupted = true;
        victim = cleanup.id;
      }
      if (!victim.empty()) {
        try {
          c.call("DELETE", "/v1/sandboxes/" + victim);
        } catch (const std::exception&) {
        }
      }
    }).detach();
    json sb = c.call("POST", "/v1/sandboxes", create_req);
    std::string sid = sb.value("id", "");
    {
      std::lock_guard lock(cleanup.mu);
      cleanup.id = sid;
      if (cleanup.interrupted) {
        c.call("DELETE", "/v1/sandboxes/" + sid);
        return 130;
      }
    }
    int code = 1;
    std::exception_ptr failure;  // rethrown as is: ConnectionLost keeps its exit code
    try {
      code = run_exec(c, sid, eopts, argv_rest, interactive);
    } catch (const Error&) {
      failure = std::current_exception();
    }
    bool interrupted;
    {
      std::lock_guard lock(cleanup.mu);
      interrupted = cleanup.interrupted;
      cleanup.id.clear();
    }
    try {
      c.call("DELETE", "/v1/sandboxes/" + sid);
    } catch (const Error& e) {
      // Already gone after Ctrl-C; and a failed exec's own error (e.g. the
      // daemon died) says more than the failed clean-up after it.
      if (e.code() != Errc::not_found && !failure) throw;
    }
    if (interrupted) return 130;
    if (failure) std::rethrow_exception(failure);
    return code;
  }
  if (cp->parsed()) {
    CpPlan plan = plan_cp(src, dst);
    Client c = connect(g);
    if (plan.upload()) {
      int fd = 0;
      uint32_t mode = 0644;
      std::string guest = plan.dst.path;
      if (!plan.src.stdio) {
        fd = ::open(plan.src.path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) throw_errno("cannot open " + plan.src.path);
        struct stat st {};
        if (::fstat(fd, &st) == 0) {
          if (S_ISDIR(st.st_mode)) throw UsageError("cp: " + plan.src.path + " is a directory");
          mode = st.st_mode & 07777;
        }
        if (guest.back() == '/') guest += std::filesystem::path(plan.src.path).filename().string();
      } else if (guest.back() == '/') {
        throw UsageError("cp: name the file in the sandbox when copying from stdin");
      }
      c.upload(plan.dst.id, guest, mode, fd);
      if (fd != 0) ::close(fd);
    } else {
      if (plan.dst.stdio) {
        c.download(plan.src.id, plan.src.path, 1);
      } else {
        std::filesystem::path local = plan.dst.path;
        if (std::filesystem::is_directory(local))
          local /= std::filesystem::path(plan.src.path).filename();
        int fd = ::open(local.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) throw_errno("cannot create " + local.string());
        try {
          c.download(plan.src.id, plan.src.path, fd);
        } catch (...) {
          ::close(fd);
          std::filesystem::remove(local);  // never leave a truncated copy behind
          throw;
        }
        ::close(fd);
      }
    }
    return 0;
  }
  if (rm->parsed()) {
    Client c = connect(g);
    int rc = 0;
    for (const auto& victim : ids) {
      try {
        c.call("DELETE", "/v1/sandboxes/" + victim);
        std::cout << victim << "\n";
      } catch (const Error& e) {
        std::fprintf(stderr, "airlock: %s: %s\n", victim.c_str(), e.what());
        rc = 1;
      }
    }
    return rc;
  }
  if (logs->parsed() && net_logs) {
    std::string target = "/v1/sandboxes/" + id + "/network/events";
    Client c = connect(g);
    auto print = [&](const json& ev) {
      std::cout << (json_out ? ev.dump() : format_net_event(ev)) << std::endl;
    };
    if (follow) {
      c.stream_lines(target + "?follow=true", print);
    } else {
      for (const auto& ev : c.call("GET", target)) print(ev);
    }
    return 0;
  }
  if (watch->parsed()) {
    Client c = connect(g);
    std::string target = "/v1/sandboxes/" + id + "/files/watch?path=" + url_encode(watch_path) +
                         "&recursive=" + (watch_recursive ? "true" : "false");
    c.stream_lines(target, [&](const json& ev) {
      if (json_out) {
        std::cout << ev.dump() << std::endl;
        return;
      }
      const std::string type = ev.value("type", "");
      if (type == "watching") {
        std::fprintf(stderr, "airlock: watching %s (%s)\n", watch_path.c_str(),
                     watch_recursive ? "recursive" : "this directory only");
      } else if (type == "overflow") {
        std::cout << "overflow " << ev.value("dropped", uint64_t{0}) << " events dropped"
                  << std::endl;
      } else if (type == "end") {
        std::fprintf(stderr, "airlock: watch ended: %s%s%s\n", ev.value("reason", "").c_str(),
                     ev.contains("message") ? ": " : "", ev.value("message", "").c_str());
      } else {
        std::string p = ev.value("path", "") + (ev.value("is_dir", false) ? "/" : "");
        if (type == "renamed") p = ev.value("old_path", "") + " -> " + p;
        std::cout << type << " " << p << std::endl;
      }
    });
    return 0;
  }
  if (logs->parsed() && verify) {
    Client c = connect(g);
    return verify_journal(c, id, json_out);
  }
  if (logs->parsed() && follow) {  // every record, streamed (GET .../events?follow=true)
    connect(g).stream_lines("/v1/sandboxes/" + id + "/events?follow=true", [&](const json& r) {
      std::cout << (json_out ? r.dump() : format_audit_line(r)) << std::endl;
    });
    return 0;
  }
  if (port->parsed()) {
    if (remove_port && (guest_port || host_port))
      throw UsageError("port --rm takes no GUEST_PORT or --host-port");
    if (host_port && !guest_port) throw UsageError("--host-port needs a GUEST_PORT");
    Client c = connect(g);
    std::string target = "/v1/sandboxes/" + id + "/ports";
    if (remove_port) {
      c.call("DELETE", target + "/" + std::to_string(*remove_port));
      return 0;
    }
    auto line = [](const json& p) {
      return p.value("host", "127.0.0.1") + ":" + std::to_string(p.value("host_port", 0)) +
             " -> guest port " + std::to_string(p.value("guest_port", 0)) + "\n";
    };
    if (guest_port) {
      json body{{"guest_port", *guest_port}};
      if (host_port) body["host_port"] = *host_port;
      json answer = c.call("POST", target, body);
      std::cout << (json_out ? answer.dump(2) + "\n" : line(answer));
    } else {
      json answer = c.call("GET", target);
      if (json_out) {
        std::cout << answer.dump(2) << "\n";
      } else {
        for (const auto& p : answer) std::cout << line(p);
      }
    }
    return 0;
  }
  if (network->parsed()) {
    auto policy = network_policy(net_mode, net_allow, net_deny);
    Client c = connect(g);
    if (!policy) {
      json sb = c.call("GET", "/v1/sandboxes/" + id);
      json net = sb.value("network", json{{"mode", "none"}});
      std::cout << (json_out ? net.dump(2) : "policy: " + net.dump()) << "\n";
      return 0;
    }
    json answer = c.call("PATCH", "/v1/sandboxes/" + id + "/network", *policy);
    std::cout << (json_out ? answer.dump(2) + "\n" : format_network_change(answer));
    return 0;
  }
  if (logs->parsed()) {
    json records = connect(g).call("GET", "/v1/sandboxes/" + id + "/logs");
    if (json_out) {
      std::cout << records.dump(2) << "\n";
    } else {
      for (const auto& r : records) std::cout << format_audit_line(r) << "\n";
    }
    return 0;
  }
  if (inspect->parsed()) {
    json j = connect(g).call("GET", "/v1/sandboxes/" + id + (posture ? "/posture" : ""));
    if (json_out || !posture)
      std::cout << j.dump(2) << "\n";
    else
      std::cout << format_posture(j);
    return 0;
  }
  if (run_pool_command(pool, [&] { return connect(g); })) return 0;
  if (probe->parsed()) {
    Client c = connect(g);
    return run_probe(c, popts, g.paths());
  }
  if (info->parsed()) {
    json j = connect(g).call("GET", "/v1/info");
    if (json_out) {
      std::cout << j.dump(2) << "\n";
    } else {
      for (const auto& [k, v] : j.items())
        std::cout << k << ": " << (v.is_string() ? v.get<std::string>() : v.dump()) << "\n";
    }
    return 0;
  }
  if (image_build->parsed()) {
    if (!recipe_build.file.empty())
      return run_recipe_build(connect(g), image_name, recipe_build, json_out);
    auto store = image_store(g);
    bool tty = ::isatty(1);
    std::string last;
    auto start = std::chrono::steady_clock::now();
    storage::Image img = store.build(
        image_name, [&](const storage::BuildProgress& p) { print_progress(p, tty, last); });
    if (tty && !last.empty()) std::fprintf(stdout, "\r\033[K");
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%s %s (%s, kernel %s) in %.1f s: %s\n", img.name.c_str(), img.key.c_str(),
                human_bytes(img.rootfs_bytes).c_str(), img.kernel_release.c_str(), s,
                img.dir.c_str());
    return 0;
  }
  return 2;
}

}  // namespace
}  // namespace airlock::cli

int main(int argc, char** argv) {
  try {
    return airlock::cli::main_impl(argc, argv);
  } catch (const airlock::cli::UsageError& e) {
    std::fprintf(stderr, "airlock: %s\n", e.what());
    return 2;
  } catch (const airlock::cli::ConnectionLost& e) {
    std::fprintf(stderr, "airlock: %s\n", e.what());
    return airlock::cli::kExitConnectionLost;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "airlock: %s\n", e.what());
    return 1;
  }
}

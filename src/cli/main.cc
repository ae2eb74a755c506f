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
#include "cli/client.h"
#include "cli/exec_cmd.h"
#include "cli/image_cmd.h"
#include "cli/journal_cmd.h"
#include "cli/pool_cmd.h"
#include "cli/probe.h"
#include "cli/pty_client.h"
#include "cli/recipe_cmd.h"
#include "cli/snapshot_cmd.h"
#include "cli/spawn.h"
#include "cli/token_cmd.h"
#include "common/error.h"
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

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
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

bool parsed(const CLI::App* cmd) { return cmd && cmd->parsed(); }

int main_impl(int argc, char** argv) {
  // Everything after the first "--" is the command of exec/run, verbatim
  // (CLI11 would otherwise read its "-c" as an option of ours).
  int split = argc;
  for (int i = 1; i < argc; ++i)
    if (std::string_view(argv[i]) == "--") {
      split = i;
      break;
    }
  // The CLI starts once per agent call: for run, exec, ls, create and rm
  // CLI11 gets only the global options and that command's own (args.h,
  // hot_command); help, mistakes and every other command get the whole
  // tree, so what they print is unchanged. The commands are added in the
  // same order either way (--help lists them in this order).
  std::string_view only = hot_command(std::vector<std::string_view>(argv + 1, argv + split));
  bool full = only.empty();
  auto want = [&](std::string_view name) { return full || only == name; };

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
  bool tty = false;
  bool rm_wait = false;
  std::string attach_exec_id;
  uint64_t attach_offset = 0;
  PtyOptions shell_opts;
  CLI::App *create = nullptr, *ls = nullptr, *exec = nullptr, *attach = nullptr, *shell = nullptr,
           *run = nullptr, *cp = nullptr, *rm = nullptr;

  if (want("create")) {
    create = app.add_subcommand("create", "create a sandbox and print its id");
    add_create_flags(create, copts);
    create->add_option("--timeout", copts.timeout_s, "seconds of life (same as --lifetime)");
    create->add_option("--env", copts.env, "KEY=VALUE default environment of every exec");
    create->add_option("--meta", copts.meta, "KEY=VALUE label");
    create->add_flag("--json", json_out, "print the sandbox as JSON");
    create->add_option("--from", copts.from, "start from this snapshot (airlock snapshot)");
  }

  if (want("ls")) {
    ls = app.add_subcommand("ls", "list sandboxes");
    ls->add_flag("--json", json_out, "print JSON");
    ls->add_flag("-a,--all", all, "include deleted, failed and timed-out sandboxes");
    ls->add_option("--meta", metas, "KEY=VALUE filter");
  }

  if (want("exec")) {
    exec = app.add_subcommand("exec", "run a command in a sandbox: exec ID -- ARGV...");
    add_exec_flags(exec, eopts, interactive);
    exec->add_option("--env", eopts.env, "KEY=VALUE");
    exec->add_option("--timeout", exec_timeout, "seconds before the command is killed");
    exec->add_flag("-d,--background", eopts.background,
                   "run detached; print its exec id (output is not kept)");
    exec->add_flag("-t,--tty", tty, "run it on a terminal (a pty in the sandbox), like ssh -t");
    exec->add_option("id", id, "sandbox id")->required();
    exec->add_option("argv", argv_rest, "command and arguments (after --)");
  }

  if (full) {
    attach = app.add_subcommand(
        "attach", "the output of an exec whose client is gone (daemon restart): attach ID EXEC_ID");
    attach->add_option("--offset", attach_offset,
                       "first byte wanted (stdout and stderr counted together; default 0)");
    attach->add_option("id", id, "sandbox id")->required();
    attach->add_option("exec_id", attach_exec_id, "exec id (from exec's start event)")->required();

    shell = app.add_subcommand("shell", "an interactive shell in a sandbox: shell ID");
    shell->add_option("--cwd", shell_opts.cwd, "working directory (default the user's home)");
    shell->add_option("--user", shell_opts.user, "user name or uid (default root)");
    shell->add_option("--env", shell_opts.env, "KEY=VALUE");
    shell->add_option("id", id, "sandbox id")->required();
  }

  if (want("run")) {
    run = app.add_subcommand("run", "create, exec, destroy: run [flags] -- ARGV...");
    add_create_flags(run, copts);
    add_exec_flags(run, eopts, interactive);
    run->add_option("--env", eopts.env, "KEY=VALUE");
    run->add_option("--meta", copts.meta, "KEY=VALUE label");
    run->add_option("--timeout", exec_timeout, "seconds before the command is killed");
    run->add_option("argv", argv_rest, "command and arguments (after --)");
  }

  if (full) {
    cp = app.add_subcommand("cp", "copy a file: cp SRC DST, one side ID:/path, '-' = stdio");
    cp->add_option("src", src)->required();
    cp->add_option("dst", dst)->required();
  }

  if (want("rm")) {
    rm = app.add_subcommand("rm", "destroy sandboxes");
    rm->add_option("ids", ids, "sandbox ids")->required();
    rm->add_flag("--wait", rm_wait,
                 "return once each sandbox's VM and files are gone and its journal is complete "
                 "(default: once it is out of service; the teardown finishes in the background)");
  }

  // The other commands, in the whole tree only.
  bool net_logs = false, follow = false;
  bool verify = false;
  std::string watch_path;
  bool watch_recursive = false;
  std::optional<std::string> net_mode;
  std::vector<std::string> net_allow, net_deny;
  std::optional<int> guest_port, host_port, remove_port;
  bool posture = false;
  PoolCommand pool;
  ProbeOptions popts;
  TokenCommands tokens;
  JournalCommands journal_cmds;
  SnapshotCommands snaps;
  RecipeBuild recipe_build;
  ImageCommands images;
  CLI::App *logs = nullptr, *watch = nullptr, *network = nullptr, *port = nullptr,
           *inspect = nullptr, *info = nullptr, *probe = nullptr, *mcp_cmd = nullptr,
           *image = nullptr, *image_build = nullptr;
  if (full) {
    logs = app.add_subcommand("logs", "a sandbox's audit journal");
    logs->add_option("id", id)->required();
    logs->add_flag("--json", json_out, "print JSON");
    logs->add_flag("--network", net_logs, "only network events, one line each");
    logs->add_flag("-f,--follow", follow, "keep printing new records as they are appended");
    logs->add_flag("--verify", verify,
                   "check the journal's hash chain; exit 1 naming the first break");

    watch = app.add_subcommand(
        "watch", "print changes under a guest directory as they happen: watch ID PATH [-r]");
    watch->add_option("id", id)->required();
    watch->add_option("path", watch_path, "absolute guest directory")->required();
    watch->add_flag("-r,--recursive", watch_recursive, "also every directory below it");
    watch->add_flag("--json", json_out, "print the NDJSON events as they come");

    network = app.add_subcommand("network",
                                 "change a running sandbox's egress policy (no flags: show it)");
    network->add_option("id", id)->required();
    network->add_option("--mode", net_mode, "none, allowlist or open (--allow alone: allowlist)");
    network->add_option("--allow", net_allow, "allow a CIDR, host name or *.domain (repeatable)")
        ->allow_extra_args(false);
    network->add_option("--deny", net_deny, "deny a CIDR, host name or *.domain (repeatable)")
        ->allow_extra_args(false);
    network->add_flag("--json", json_out, "print JSON");

    port = app.add_subcommand(
        "port", "forward a host loopback port to a guest TCP port (no GUEST_PORT: list them)");
    port->add_option("id", id)->required();
    port->add_option("guest_port", guest_port, "the guest's TCP port")->check(CLI::Range(1, 65535));
    port->add_option("--host-port", host_port, "the 127.0.0.1 port (default: a free one)")
        ->check(CLI::Range(1024, 65535));
    port->add_option("--rm", remove_port, "stop the forward from this host port")
        ->check(CLI::Range(1, 65535));
    port->add_flag("--json", json_out, "print JSON");

    inspect = app.add_subcommand("inspect", "a sandbox's details; --posture: its QEMU jail");
    inspect->add_option("id", id)->required();
    inspect->add_flag("--posture", posture,
                      "the jail as read back from /proc, and what is missing");
    inspect->add_flag("--json", json_out, "print JSON");

    add_pool_command(app, pool);

    info = app.add_subcommand("info", "daemon and host facts");
    info->add_flag("--json", json_out, "print JSON");

    probe = app.add_subcommand("probe",
                               "run the containment battery against fresh sandboxes on this host");
    probe->add_option("--image", popts.image, "guest image (default: minimal)");
    probe
        ->add_option("--network", popts.network,
                     "policy of the ordinary task: none (default), open")
        ->check(CLI::IsMember({"none", "open"}));
    probe->add_flag("--json", popts.json, "print JSON");
    probe->add_flag("--quick", popts.quick,
                    "fewer samples (time to a new instance over 3, not 10)");
    probe
        ->add_option("--only", popts.only,
                     "run only these sections: task, reach, leftovers, time, hostile, after "
                     "(repeatable; cleanup always runs)")
        ->delimiter(',');

    mcp_cmd = app.add_subcommand(
        "mcp",
        "serve the Model Context Protocol on stdin/stdout (for MCP clients); its tools act only "
        "on the sandboxes this session created; with AIRLOCK_URL and AIRLOCK_TOKEN, as that "
        "token's tenant on that daemon");
    mcp_cmd->add_flag("--all", all,
                      "let the tools act on every sandbox the daemon shows this caller (on the "
                      "unix socket: every tenant's), not only those this session created");

    add_token_commands(app, tokens);
    add_journal_commands(app, journal_cmds);
    add_snapshot_commands(app, snaps);

    image = app.add_subcommand("image", "guest images");
    image->require_subcommand(1);
    image_build = image->add_subcommand("build", "build an image (if its inputs changed)");
    image_build
        ->add_option("name", image_name,
                     "built-in recipe (minimal, debian), or with -f the new image's name")
        ->required();
    image_build->add_option("-f,--file", recipe_build.file,
                            "build NAME from this recipe (airlock.toml) in build sandboxes");
    image_build->add_option("--arg", recipe_build.args,
                            "NAME=VALUE: a value for the recipe's [args]");
    image_build->add_flag("--json", json_out, "with -f: print the build's events as JSON lines");
    add_image_commands(app, *image, images);
  }

  std::vector<std::string> command;
  for (int i = split + 1; i < argc; ++i) command.push_back(argv[i]);
  try {
    app.parse(split, argv);
  } catch (const CLI::ParseError& e) {
    // --help/--version exit 0; every other parse error is a usage error: 2.
    int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  if (!command.empty()) argv_rest.insert(argv_rest.end(), command.begin(), command.end());
  if ((parsed(exec) || parsed(run)) && argv_rest.empty())
    throw UsageError("no command given: airlock " + std::string(parsed(exec) ? "exec ID" : "run") +
                     " -- ARGV...");

  if (parsed(mcp_cmd)) {
    DaemonPaths p = g.paths();
    Client c(g.url.empty() ? p.socket.string() : g.url);
    try {
      if (g.url.empty()) ensure_daemon(c, p);
    } catch (const Error& e) {
      // Serve anyway: every tool call then reports why the daemon is not
      // there, which an MCP client shows, where a dead server says nothing.
      std::fprintf(stderr, "airlock mcp: %s\n", e.what());
    }
    // The first tool call may come much later: close the connection the
    // daemon check kept (Client::listening) now, before the guardian's fork
    // would inherit it and hold it open until the daemon's idle timeout.
    c = Client(c.socket());
    // After the daemon is started (it must not inherit the mask) and before
    // any thread (fork): the guardian destroys the session's sandboxes should
    // this process die without doing so; the session's signals go to its
    // signalfd.
    std::string tag = mcp::new_session_tag();
    // The guardian cleans up through the same door: the socket, or the TCP
    // listener as the same tenant.
    mcp::Guardian guardian = mcp::Guardian::start(c.socket(), tag);
    mcp::block_session_signals();
    mcp::Session session(c, tag, all ? mcp::Session::Scope::all : mcp::Session::Scope::created);
    session.set_observer(
        [&guardian](const std::string& sid, bool owned) { guardian.note(sid, owned); });
    return mcp::serve(session, 0, 1);
  }
  if (full && run_token_command(tokens, [&] { return connect(g); })) return 0;
  if (full && run_image_command(images, [&] { return connect(g); })) return 0;
  if (full)
    if (int rc = run_journal_command(journal_cmds, [&] { return connect(g); }); rc >= 0) return rc;
  if (full && run_snapshot_command(snaps, [&] { return connect(g); })) return 0;
  if (parsed(create)) {
    json body = create_body(copts);  // usage errors before a daemon is started
    Client c = connect(g);
    json sb = c.call("POST", "/v1/sandboxes", body);
    std::cout << (json_out ? sb.dump(2) : sb.value("id", "")) << "\n";
    return 0;
  }
  if (parsed(ls)) {
    std::string target = "/v1/sandboxes";
    std::string q = all ? "all=true" : "";
    for (const auto& [k, v] : parse_kvs(metas, "--meta"))
      q += (q.empty() ? "" : "&") + url_encode("metadata." + k) + "=" + url_encode(v);
    if (!q.empty()) target += "?" + q;
    json list = connect(g).call("GET", target);
    std::cout << (json_out ? list.dump(2) + "\n" : format_sandbox_table(list, now_ms()));
    return 0;
  }
  if (parsed(shell)) {
    parse_kvs(shell_opts.env, "--env");  // usage errors before a daemon is started
    Client c = connect(g);
    return run_pty(c.socket(), id, shell_opts);
  }
  if (parsed(attach)) {
    Client c = connect(g);
    return run_attach(c, id, attach_exec_id, attach_offset);
  }
  if (parsed(exec) && tty) {
    if (eopts.background || exec_timeout || eopts.pids || eopts.memory_limit_mb ||
        eopts.cpu_seconds || eopts.output_limit || interactive)
      throw UsageError("--tty takes only --cwd, --user and --env");
    PtyOptions p{argv_rest, eopts.env, eopts.cwd, eopts.user};
    parse_kvs(p.env, "--env");
    Client c = connect(g);
    return run_pty(c.socket(), id, p);
  }
  if (parsed(exec)) {
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
  if (parsed(run)) {
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
  if (parsed(cp)) {
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
  if (parsed(rm)) {
    Client c = connect(g);
    int rc = 0;
    for (const auto& victim : ids) {
      try {
        c.call("DELETE", "/v1/sandboxes/" + victim + (rm_wait ? "?wait=true" : ""));
        std::cout << victim << "\n";
      } catch (const Error& e) {
        std::fprintf(stderr, "airlock: %s: %s\n", victim.c_str(), e.what());
        rc = 1;
      }
    }
    return rc;
  }
  if (parsed(logs) && net_logs) {
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
  if (parsed(watch)) {
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
  if (parsed(logs) && verify) {
    Client c = connect(g);
    return verify_journal(c, id, json_out);
  }
  if (parsed(logs) && follow) {  // every record, streamed (GET .../events?follow=true)
    connect(g).stream_lines("/v1/sandboxes/" + id + "/events?follow=true", [&](const json& r) {
      std::cout << (json_out ? r.dump() : format_audit_line(r)) << std::endl;
    });
    return 0;
  }
  if (parsed(port)) {
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
  if (parsed(network)) {
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
  if (parsed(logs)) {
    json records = connect(g).call("GET", "/v1/sandboxes/" + id + "/logs");
    if (json_out) {
      std::cout << records.dump(2) << "\n";
    } else {
      for (const auto& r : records) std::cout << format_audit_line(r) << "\n";
    }
    return 0;
  }
  if (parsed(inspect)) {
    json j = connect(g).call("GET", "/v1/sandboxes/" + id + (posture ? "/posture" : ""));
    if (json_out || !posture)
      std::cout << j.dump(2) << "\n";
    else
      std::cout << format_posture(j);
    return 0;
  }
  if (full && run_pool_command(pool, [&] { return connect(g); })) return 0;
  if (parsed(probe)) {
    Client c = connect(g);
    return run_probe(c, popts, g.paths());
  }
  if (parsed(info)) {
    json j = connect(g).call("GET", "/v1/info");
    if (json_out) {
      std::cout << j.dump(2) << "\n";
    } else {
      for (const auto& [k, v] : j.items())
        std::cout << k << ": " << (v.is_string() ? v.get<std::string>() : v.dump()) << "\n";
    }
    return 0;
  }
  if (parsed(image_build)) {
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

// exec, attach, shell, run: commands in a sandbox, streamed to this terminal.
#include <pthread.h>
#include <signal.h>

#include <memory>
#include <mutex>
#include <thread>

#include "cli/exec_cmd.h"
#include "cli/pty_client.h"
#include "cli/spawn.h"
#include "cli/verbs.h"
#include "common/error.h"

namespace airlock::cli {
namespace {

using nlohmann::json;

// The options exec and run share, and the command: argv given after "--"
// (Context::tail) or as positionals.
struct ExecVerbOptions {
  ExecOptions exec;
  bool interactive = false;
  std::optional<double> timeout;
  std::vector<std::string> argv;
  // The command, or a usage error naming how to give one.
  const std::vector<std::string>& command(const Context& ctx, const char* usage) {
    argv.insert(argv.end(), ctx.tail.begin(), ctx.tail.end());
    if (argv.empty()) throw UsageError(std::string("no command given: airlock ") + usage);
    exec.timeout_s = timeout;
    return argv;
  }
};

void add_exec_flags(CLI::App* app, ExecVerbOptions& o) {
  app->add_flag("-i,--interactive", o.interactive, "forward stdin even if it is a terminal");
  app->add_option("--cwd", o.exec.cwd, "working directory in the sandbox");
  app->add_option("--user", o.exec.user, "user name or uid (default root)");
  app->add_option("--pids", o.exec.pids, "limit: processes/threads of the command");
  app->add_option("--memory-limit", o.exec.memory_limit_mb, "limit: MiB of memory of the command");
  app->add_option("--cpu-seconds", o.exec.cpu_seconds, "limit: CPU seconds of the command");
  app->add_option("--output-limit", o.exec.output_limit,
                  "bytes per stream kept (default 64 MiB); the rest is dropped");
}

// The sandbox `run` must destroy, shared with the signal thread.
struct RunCleanup {
  std::mutex mu;
  std::string id;
  bool interrupted = false;
};

// Ctrl-C / SIGTERM / SIGHUP: a thread destroys the sandbox (which ends the
// exec). Signals are blocked before that thread starts so only it receives
// them; it lives as long as the process.
void destroy_on_signal(const client::Client& c, RunCleanup& cleanup) {
  sigset_t set = block_terminating_signals();
  std::thread([set, &c, &cleanup] {
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
}

// create, exec, destroy; 130 if interrupted.
int run_once(const client::Client& c, const json& create_req, const ExecVerbOptions& o) {
  static RunCleanup cleanup;
  destroy_on_signal(c, cleanup);
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
    code = run_exec(c, sid, o.exec, o.argv, o.interactive);
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

}  // namespace

Verb add_exec(CLI::App& app, const Context& ctx) {
  struct Opts : ExecVerbOptions {
    std::string id;
    bool tty = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("exec", "run a command in a sandbox: exec ID -- ARGV...");
  add_exec_flags(cmd, *o);
  cmd->add_option("--env", o->exec.env, "KEY=VALUE");
  cmd->add_option("--timeout", o->timeout, "seconds before the command is killed");
  cmd->add_flag("-d,--background", o->exec.background,
                "run detached; print its exec id (output is not kept)");
  cmd->add_flag("-t,--tty", o->tty, "run it on a terminal (a pty in the sandbox), like ssh -t");
  cmd->add_option("id", o->id, "sandbox id")->required();
  cmd->add_option("argv", o->argv, "command and arguments (after --)");
  return [cmd, o, &ctx]() -> std::optional<int> {
    if (!cmd->parsed()) return std::nullopt;
    const auto& argv = o->command(ctx, "exec ID -- ARGV...");
    const ExecOptions& e = o->exec;
    if (o->tty) {
      if (e.background || o->timeout || e.pids || e.memory_limit_mb || e.cpu_seconds ||
          e.output_limit || o->interactive)
        throw UsageError("--tty takes only --cwd, --user and --env");
      PtyOptions p{argv, e.env, e.cwd, e.user};
      parse_kvs(p.env, "--env");
      client::Client c = ctx.connect();
      return run_pty(c.socket(), o->id, p);
    }
    if (e.background) {
      json body = exec_body(e, argv, std::nullopt);
      json r = ctx.connect().call("POST", "/v1/sandboxes/" + o->id + "/exec", body);
      std::cout << r.value("exec_id", "") << "\n";
      return 0;
    }
    client::Client c = ctx.connect();
    return run_exec(c, o->id, e, argv, o->interactive);
  };
}

Verb add_attach(CLI::App& app, const Context& ctx) {
  struct Opts {
    std::string id, exec_id;
    uint64_t offset = 0;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand(
      "attach", "the output of an exec whose client is gone (daemon restart): attach ID EXEC_ID");
  cmd->add_option("--offset", o->offset,
                  "first byte wanted (stdout and stderr counted together; default 0)");
  cmd->add_option("id", o->id, "sandbox id")->required();
  cmd->add_option("exec_id", o->exec_id, "exec id (from exec's start event)")->required();
  return [cmd, o, &ctx]() -> std::optional<int> {
    if (!cmd->parsed()) return std::nullopt;
    client::Client c = ctx.connect();
    return run_attach(c, o->id, o->exec_id, o->offset);
  };
}

Verb add_shell(CLI::App& app, const Context& ctx) {
  struct Opts {
    std::string id;
    PtyOptions pty;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("shell", "an interactive shell in a sandbox: shell ID");
  cmd->add_option("--cwd", o->pty.cwd, "working directory (default the user's home)");
  cmd->add_option("--user", o->pty.user, "user name or uid (default root)");
  cmd->add_option("--env", o->pty.env, "KEY=VALUE");
  cmd->add_option("id", o->id, "sandbox id")->required();
  return [cmd, o, &ctx]() -> std::optional<int> {
    if (!cmd->parsed()) return std::nullopt;
    parse_kvs(o->pty.env, "--env");  // usage errors before a daemon is started
    client::Client c = ctx.connect();
    return run_pty(c.socket(), o->id, o->pty);
  };
}

Verb add_run(CLI::App& app, const Context& ctx) {
  struct Opts : ExecVerbOptions {
    CreateOptions create;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("run", "create, exec, destroy: run [flags] -- ARGV...");
  add_create_flags(cmd, o->create);
  add_exec_flags(cmd, *o);
  cmd->add_option("--env", o->exec.env, "KEY=VALUE");
  cmd->add_option("--meta", o->create.meta, "KEY=VALUE label");
  cmd->add_option("--timeout", o->timeout, "seconds before the command is killed");
  cmd->add_option("argv", o->argv, "command and arguments (after --)");
  return [cmd, o, &ctx]() -> std::optional<int> {
    if (!cmd->parsed()) return std::nullopt;
    const auto& argv = o->command(ctx, "run -- ARGV...");
    // Validate everything before a sandbox exists.
    json create_req = create_body(o->create);
    exec_body(o->exec, argv, std::nullopt);
    client::Client c = ctx.connect();
    return run_once(c, create_req, *o);
  };
}

}  // namespace airlock::cli

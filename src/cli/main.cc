// airlock: docker-like verbs over airlockd (started on demand), plus image
// build/ls run directly in this process. The verbs live in *_verbs.cc and
// *_cmd.cc (verbs.h); this file builds the tree and runs the parsed one.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <type_traits>

#include "cli/args.h"
#include "cli/image_cmd.h"
#include "cli/journal_cmd.h"
#include "cli/pool_cmd.h"
#include "cli/recipe_cmd.h"
#include "cli/snapshot_cmd.h"
#include "cli/spawn.h"
#include "cli/token_cmd.h"
#include "cli/verbs.h"
#include "client/client.h"
#include "common/error.h"
#include "daemon/paths.h"
#include "engine/storage/image_store.h"
#include "mcp/guardian.h"
#include "mcp/session.h"
#include "mcp/stdio.h"

namespace airlock::cli {
namespace {

void print_progress(const storage::BuildProgress& p, bool tty, std::string& last_step) {
  if (tty) {
    std::string line = "[" + p.step + "]";
    if (p.bytes) line += " " + client::human_bytes(p.bytes);
    std::fprintf(stdout, "\r%s\033[K", line.c_str());
    std::fflush(stdout);
  } else if (p.step != last_step) {
    std::fprintf(stdout, "[%s]\n", p.step.c_str());
    std::fflush(stdout);
  }
  last_step = p.step;
}

storage::ImageStore image_store(const Context& ctx) {
  DaemonPaths p = ctx.paths();
  auto bin = daemon::exe_dir();
  auto dir = p.image_dir.empty() ? daemon::default_image_dir(p.data_dir) : p.image_dir;
  return storage::ImageStore(dir, bin.parent_path() / "share" / "airlock" / "images",
                             bin / "airlock-guest");
}

// A built-in image built in this process, its progress on stdout.
int build_builtin_image(const Context& ctx, const std::string& name) {
  auto store = image_store(ctx);
  bool tty = ::isatty(1);
  std::string last;
  auto start = std::chrono::steady_clock::now();
  storage::Image img =
      store.build(name, [&](const storage::BuildProgress& p) { print_progress(p, tty, last); });
  if (tty && !last.empty()) std::fprintf(stdout, "\r\033[K");
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s %s (%s, kernel %s) in %.1f s: %s\n", img.name.c_str(), img.key.c_str(),
              client::human_bytes(img.rootfs_bytes).c_str(), img.kernel_release.c_str(), s,
              img.dir.c_str());
  return 0;
}

// The MCP server on stdin/stdout, as this caller (the socket, or AIRLOCK_URL's tenant).
int serve_mcp(const Context& ctx, bool all) {
  DaemonPaths p = ctx.paths();
  client::Client c(ctx.url.empty() ? p.socket.string() : ctx.url);
  try {
    if (ctx.url.empty()) ensure_daemon(c, p);
  } catch (const Error& e) {
    // Serve anyway: every tool call then reports why the daemon is not
    // there, which an MCP client shows, where a dead server says nothing.
    std::fprintf(stderr, "airlock mcp: %s\n", e.what());
  }
  // The first tool call may come much later: close the connection the
  // daemon check kept (Client::listening) now, before the guardian's fork
  // would inherit it and hold it open until the daemon's idle timeout.
  c = client::Client(c.socket());
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

// Adds a command group that keeps its own options (pool, tokens, journal,
// snapshots) and returns its verb.
template <class Commands, class Add, class Run>
Verb group(CLI::App& app, const Context& ctx, Add add, Run run) {
  auto cmds = std::make_shared<Commands>();
  add(app, *cmds);
  return [cmds, run, &ctx]() -> std::optional<int> {
    auto rc = run(*cmds, [&ctx] { return ctx.connect(); });
    if constexpr (std::is_same_v<decltype(rc), bool>) {
      if (rc) return 0;
    } else if (rc >= 0) {
      return rc;
    }
    return std::nullopt;
  };
}

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
  Context ctx;
  app.add_option("--socket", ctx.socket, "airlockd's socket (default <data-dir>/airlockd.sock)")
      ->envname("AIRLOCK_SOCKET");
  app.add_option("--data-dir", ctx.data_dir, "data directory of the daemon")
      ->envname("AIRLOCK_DATA_DIR");
  app.add_option("--image-dir", ctx.image_dir, "guest image directory")
      ->envname("AIRLOCK_IMAGE_DIR");
  app.add_option("--url", ctx.url,
                 "http(s)://HOST:PORT of an airlockd --listen instead of the socket (token: "
                 "$AIRLOCK_TOKEN, https CA: $AIRLOCK_CA)")
      ->envname("AIRLOCK_URL");
  app.set_version_flag("--version", AIRLOCK_VERSION);

  std::vector<Verb> verbs;
  if (want("create")) verbs.push_back(add_create(app, ctx));
  if (want("ls")) verbs.push_back(add_ls(app, ctx));
  if (want("exec")) verbs.push_back(add_exec(app, ctx));
  if (full) {
    verbs.push_back(add_attach(app, ctx));
    verbs.push_back(add_shell(app, ctx));
  }
  if (want("run")) verbs.push_back(add_run(app, ctx));
  if (full) verbs.push_back(add_cp(app, ctx));
  if (want("rm")) verbs.push_back(add_rm(app, ctx));
  if (full) {
    for (auto add : {add_logs, add_watch, add_network, add_port, add_inspect})
      verbs.push_back(add(app, ctx));
    verbs.push_back(group<PoolCommand>(app, ctx, add_pool_command, run_pool_command));
    verbs.push_back(add_info(app, ctx));
    verbs.push_back(add_probe(app, ctx));
    verbs.push_back(add_mcp(app, ctx));
    verbs.push_back(group<TokenCommands>(app, ctx, add_token_commands, run_token_command));
    verbs.push_back(group<JournalCommands>(app, ctx, add_journal_commands, run_journal_command));
    verbs.push_back(group<SnapshotCommands>(app, ctx, add_snapshot_commands, run_snapshot_command));
    verbs.push_back(add_image(app, ctx));
  }

  for (int i = split + 1; i < argc; ++i) ctx.tail.push_back(argv[i]);
  try {
    app.parse(split, argv);
  } catch (const CLI::ParseError& e) {
    // --help/--version exit 0; every other parse error is a usage error: 2.
    int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  for (auto& verb : verbs)
    if (auto rc = verb()) return *rc;
  return 2;
}

}  // namespace

DaemonPaths Context::paths() const {
  DaemonPaths p;
  p.data_dir = std::filesystem::absolute(data_dir.empty() ? daemon::default_data_dir()
                                                          : std::filesystem::path(data_dir));
  p.socket = std::filesystem::absolute(socket.empty() ? daemon::default_socket(p.data_dir)
                                                      : std::filesystem::path(socket));
  if (!image_dir.empty()) p.image_dir = std::filesystem::absolute(image_dir);
  return p;
}

client::Client Context::connect() const {
  // A remote daemon is used as it is: nothing to start.
  if (!url.empty() && client::parse_remote(url)) return client::Client(url);
  DaemonPaths p = paths();
  client::Client c(p.socket);
  ensure_daemon(c, p);
  return c;
}

Verb add_mcp(CLI::App& app, const Context& ctx) {
  auto all = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand(
      "mcp",
      "serve the Model Context Protocol on stdin/stdout (for MCP clients); its tools act only "
      "on the sandboxes this session created; with AIRLOCK_URL and AIRLOCK_TOKEN, as that "
      "token's tenant on that daemon");
  cmd->add_flag("--all", *all,
                "let the tools act on every sandbox the daemon shows this caller (on the "
                "unix socket: every tenant's), not only those this session created");
  return [cmd, all, &ctx]() -> std::optional<int> {
    if (!cmd->parsed()) return std::nullopt;
    return serve_mcp(ctx, *all);
  };
}

Verb add_image(CLI::App& app, const Context& ctx) {
  struct Opts {
    std::string name;
    RecipeBuild recipe;
    bool json = false;
    ImageCommands images;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* image = app.add_subcommand("image", "guest images");
  image->require_subcommand(1);
  CLI::App* build = image->add_subcommand("build", "build an image (if its inputs changed)");
  build
      ->add_option("name", o->name,
                   "built-in recipe (minimal, debian), or with -f the new image's name")
      ->required();
  build->add_option("-f,--file", o->recipe.file,
                    "build NAME from this recipe (airlock.toml) in build sandboxes");
  build->add_option("--arg", o->recipe.args, "NAME=VALUE: a value for the recipe's [args]");
  build->add_flag("--json", o->json, "with -f: print the build's events as JSON lines");
  add_image_commands(app, *image, o->images);
  return [build, o, &ctx]() -> std::optional<int> {
    if (run_image_command(o->images, [&ctx] { return ctx.connect(); })) return 0;
    if (!build->parsed()) return std::nullopt;
    if (!o->recipe.file.empty())
      return run_recipe_build(ctx.connect(), o->name, o->recipe, o->json);
    return build_builtin_image(ctx, o->name);
  };
}

}  // namespace airlock::cli

int main(int argc, char** argv) {
  try {
    return airlock::cli::main_impl(argc, argv);
  } catch (const airlock::cli::UsageError& e) {
    std::fprintf(stderr, "airlock: %s\n", e.what());
    return 2;
  } catch (const airlock::client::ConnectionLost& e) {
    std::fprintf(stderr, "airlock: %s\n", e.what());
    return airlock::client::kExitConnectionLost;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "airlock: %s\n", e.what());
    return 1;
  }
}

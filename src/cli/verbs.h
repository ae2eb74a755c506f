// The verbs of the `airlock` command line. Each add_* adds one subcommand
// (with options it owns) to the tree and returns what runs it: the exit
// code, or nullopt when another verb was the one parsed. main.cc adds them
// in the order --help lists them and runs the first that answers.
//
//   std::vector<Verb> verbs{add_create(app, ctx), add_ls(app, ctx)};
//   app.parse(argc, argv);
//   for (auto& v : verbs) if (auto rc = v()) return *rc;
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/spawn.h"
#include "client/client.h"

namespace airlock::cli {

// What every verb reads once the command line is parsed: the global
// options and the command after "--" (exec and run).
struct Context {
  std::string socket, data_dir, image_dir;
  std::string url;  // AIRLOCK_URL: a daemon's TCP listener instead of the socket
  std::vector<std::string> tail;
  DaemonPaths paths() const;
  // A remote daemon as it is; on the socket, airlockd started if none answers.
  client::Client connect() const;
};

using Verb = std::function<std::optional<int>()>;

// A verb with no subcommand of its own here (tokens, images, ...): `ran`
// says whether it was parsed; it then exits 0.
Verb group_verb(std::function<bool()> ran);

// sandbox_verbs.cc
Verb add_create(CLI::App& app, const Context& ctx);
Verb add_ls(CLI::App& app, const Context& ctx);
Verb add_rm(CLI::App& app, const Context& ctx);
Verb add_inspect(CLI::App& app, const Context& ctx);
Verb add_info(CLI::App& app, const Context& ctx);
Verb add_probe(CLI::App& app, const Context& ctx);
// --image, --cpus, ... and the network flags of create and run.
void add_create_flags(CLI::App* app, CreateOptions& o);

// exec_verbs.cc
Verb add_exec(CLI::App& app, const Context& ctx);
Verb add_attach(CLI::App& app, const Context& ctx);
Verb add_shell(CLI::App& app, const Context& ctx);
Verb add_run(CLI::App& app, const Context& ctx);

// io_verbs.cc: what goes in and out of a sandbox and what it recorded.
Verb add_cp(CLI::App& app, const Context& ctx);
Verb add_logs(CLI::App& app, const Context& ctx);
Verb add_watch(CLI::App& app, const Context& ctx);
Verb add_network(CLI::App& app, const Context& ctx);
Verb add_port(CLI::App& app, const Context& ctx);

// main.cc
Verb add_mcp(CLI::App& app, const Context& ctx);
// `airlock image build|ls|...`: built here or by a recipe in sandboxes.
Verb add_image(CLI::App& app, const Context& ctx);

}  // namespace airlock::cli

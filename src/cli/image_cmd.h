// `airlock image import|save|ls|rm|inspect`, `airlock df`, `airlock prune` (the
// image routes of airlockd, unix socket) and `airlock top` (a live view of
// the sandboxes with their stats, GET /v1/sandboxes?stats=true).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>

#include "client/client.h"

namespace airlock::cli {

struct ImageCommands {
  CLI::App* import = nullptr;
  CLI::App* save = nullptr;  // image save SNAPSHOT NAME
  CLI::App* ls = nullptr;
  CLI::App* rm = nullptr;
  CLI::App* inspect = nullptr;
  CLI::App* df = nullptr;
  CLI::App* prune = nullptr;
  CLI::App* top = nullptr;
  std::string name, file, snapshot, sort = "cpu";
  bool replace = false, dry_run = false, json = false, once = false;
  double interval = 2.0;
};

// Adds import/rm/inspect under `image` (ls replaces the local listing) and
// df/prune/top at the top level.
void add_image_commands(CLI::App& app, CLI::App& image, ImageCommands& c);

// Runs the verb that was parsed; false if none was.
bool run_image_command(const ImageCommands& c, const std::function<client::Client()>& connect);

// "1.5 GiB"-style size.
std::string human_size(uint64_t bytes);

}  // namespace airlock::cli

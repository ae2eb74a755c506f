// `airlock pause ID`, `airlock resume ID`, `airlock snapshot ID [--name N]
// [--memory]`, `airlock snapshot ls|rm NAME`, `airlock fork ID -n N`
// (POST /v1/sandboxes/{id}/pause|resume|snapshots|fork, /v1/snapshots).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>

#include "client/client.h"

namespace airlock::cli {

struct SnapshotCommands {
  CLI::App* pause = nullptr;
  CLI::App* resume = nullptr;
  CLI::App* snapshot = nullptr;  // snapshot ID | snapshot ls | snapshot rm NAME
  CLI::App* ls = nullptr;
  CLI::App* rm = nullptr;
  CLI::App* fork = nullptr;
  std::string id, name, rm_name;
  bool memory = false, json = false;
  int count = 1;
};

void add_snapshot_commands(CLI::App& app, SnapshotCommands& s);

// Runs the verb that was parsed; false if none was.
bool run_snapshot_command(const SnapshotCommands& s,
                          const std::function<client::Client()>& connect);

}  // namespace airlock::cli

// `airlock pool [IMAGE SIZE] [--cpus --memory --disk --network] [--json]`:
// the warm pool (PUT /v1/pool to set a slot, GET /v1/pool to show them).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <optional>
#include <string>

#include "client/client.h"

namespace airlock::cli {

struct PoolCommand {
  CLI::App* cmd = nullptr;
  std::string image;
  std::optional<int> size, cpus, memory, disk;
  bool network = false, json = false;
};

void add_pool_command(CLI::App& app, PoolCommand& p);

// Runs `pool` if it was parsed; false if not. UsageError for IMAGE without SIZE.
bool run_pool_command(const PoolCommand& p, const std::function<client::Client()>& connect);

}  // namespace airlock::cli

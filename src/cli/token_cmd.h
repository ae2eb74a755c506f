// `airlock token create|ls|rm`: the operator's API tokens (POST/GET/DELETE
// /v1/tokens over the unix socket). A secret is printed once, at creation.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <string>

#include "cli/client.h"

namespace airlock::cli {

struct TokenCommands {
  CLI::App* token = nullptr;
  CLI::App* create = nullptr;
  CLI::App* ls = nullptr;
  CLI::App* rm = nullptr;
  std::string tenant, expires, id;
  bool e2b = false, json = false;
};

void add_token_commands(CLI::App& app, TokenCommands& t);

// Runs the token verb that was parsed; false if none was.
bool run_token_command(const TokenCommands& t, const std::function<Client()>& connect);

// "90" or "90s", "15m", "12h", "30d" -> seconds. Throws Error(invalid_argument,
// field "expires") otherwise.
int64_t parse_duration(const std::string& text);

}  // namespace airlock::cli

// `airlock token create|ls|rm`: the operator's API tokens (POST/GET/DELETE
// /v1/tokens over the unix socket). A secret is printed once, at creation.
// `airlock tenant set|ls`: tenants' quotas (PUT/GET /v1/tenants).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "client/client.h"

namespace airlock::cli {

struct TokenCommands {
  CLI::App* token = nullptr;
  CLI::App* create = nullptr;
  CLI::App* ls = nullptr;
  CLI::App* rm = nullptr;
  std::string tenant, expires, id;
  bool e2b = false, json = false;
  // airlock tenant set T [--max-sandboxes N ...] | tenant ls
  CLI::App* tenants = nullptr;
  CLI::App* tenant_set = nullptr;
  CLI::App* tenant_ls = nullptr;
  std::string quota_tenant;
  std::optional<int64_t> max_sandboxes, max_memory_mb, max_disk_mb, creates_per_minute;
};

void add_token_commands(CLI::App& app, TokenCommands& t);

// Runs the token verb that was parsed; false if none was.
bool run_token_command(const TokenCommands& t, const std::function<client::Client()>& connect);

// "90" or "90s", "15m", "12h", "30d" -> seconds. Throws Error(invalid_argument,
// field "expires") otherwise.
int64_t parse_duration(const std::string& text);

}  // namespace airlock::cli

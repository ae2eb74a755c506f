// `airlock logs ID --verify` (GET .../journal/verify) and `airlock diff ID
// [--since start] [--content]` (GET .../changes).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "client/client.h"

namespace airlock::cli {

struct JournalCommands {
  CLI::App* diff = nullptr;
  std::string id, since = "start";
  bool content = false, json = false;
};

void add_journal_commands(CLI::App& app, JournalCommands& j);

// Runs `diff` if it was parsed: its exit code, or -1 if it was not.
int run_journal_command(const JournalCommands& j, const std::function<client::Client()>& connect);

// `logs ID --verify`: prints the report; 0 if the chain holds, 1 if not.
int verify_journal(client::Client& c, const std::string& id, bool json);

// Human forms of the two answers (exercised by tests/integration/test_journal.py).
std::string format_verify(const nlohmann::json& report);
std::string format_changes(const nlohmann::json& changes);

}  // namespace airlock::cli

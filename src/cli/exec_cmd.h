// `airlock exec` and `airlock run`: one exec's output streamed to this
// process's stdout/stderr as it arrives, stdin forwarded, the exit status
// mapped (args.h, exit_code_of); and `airlock attach`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli/args.h"
#include "client/client.h"

namespace airlock::cli {

// Runs the exec `opts` + `argv` in sandbox `id`; stdin goes along if it is
// not a terminal (or `interactive`). Reattaches on its own if the connection
// to airlockd breaks mid-exec. Returns the CLI's exit status.
int run_exec(const client::Client& c, const std::string& id, const ExecOptions& opts,
             const std::vector<std::string>& argv, bool interactive);

// airlock attach ID EXEC_ID [--offset N]: the output of an exec whose client
// is gone, from byte N, then its exit status as exec's.
int run_attach(const client::Client& c, const std::string& id, const std::string& exec_id,
               uint64_t offset);

}  // namespace airlock::cli

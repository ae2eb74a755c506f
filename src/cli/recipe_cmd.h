// `airlock image build -f airlock.toml [--arg NAME=VALUE]... NAME`: reads the
// recipe and the files its [[copy]] entries name (refusing paths that leave
// the recipe's directory), sends them to airlockd (POST /v1/images/build)
// and shows the build's progress: one updating line on a terminal (step,
// bytes, elapsed), plain lines (with the steps' output) otherwise.
#pragma once

#include <string>
#include <vector>

#include "client/client.h"

namespace airlock::cli {

struct RecipeBuild {
  std::string file;               // -f
  std::vector<std::string> args;  // --arg NAME=VALUE
};

// The exit status: 0 built, 1 failed (the error, with a failed step's
// output, on stderr). Error for a bad recipe or a refused request.
int run_recipe_build(const client::Client& client, const std::string& name, const RecipeBuild& opts,
                     bool json_out);

}  // namespace airlock::cli

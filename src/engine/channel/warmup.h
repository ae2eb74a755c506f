// An image's warm-up commands run on a fresh guest (a template before its
// save, a pool member before it is ready): only caches get warm.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/channel/guest_channel.h"

namespace airlock::channel {

// The image's declared warm-up commands (ImageConfig::warmup), each as
// `sh -c CMD` with a 60 s deadline, in order; none declared: `true`. Throws
// (naming `who` and the command) if one fails or exits non-zero. Returns
// one record per command (argv, exit_code, ms) for the caller's journal.
nlohmann::json run_warmup(GuestChannel& ch, const std::vector<std::string>& commands,
                          const std::string& who);

}  // namespace airlock::channel

#include "engine/channel/warmup.h"

#include <chrono>

#include "common/error.h"
#include "engine/channel/guest_client.h"

namespace airlock::channel {

nlohmann::json run_warmup(GuestChannel& ch, const std::vector<std::string>& commands,
                          const std::string& who) {
  nlohmann::json done = nlohmann::json::array();
  std::vector<std::vector<std::string>> argvs;
  for (const auto& c : commands) argvs.push_back({"sh", "-c", c});
  if (argvs.empty()) argvs.push_back({"true"});
  for (const auto& argv : argvs) {
    auto t0 = std::chrono::steady_clock::now();
    ExecHandlers h;
    h.on_output = [](int, std::string_view) { return true; };
    ExecOutcome r = run_exec(ch, ch.open_stream(), {.argv = argv}, nullptr, h,
                             Clock::now() + std::chrono::seconds(60));
    int code = r.exit_code.value_or(-1);  // none: a signal ended it
    if (code != 0)
      throw Error(Errc::internal, who + ": warm-up command " + nlohmann::json(argv).dump() +
                                      " exited with " + std::to_string(code));
    done.push_back({{"argv", argv},
                    {"exit_code", code},
                    {"ms", std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::steady_clock::now() - t0)
                               .count()}});
  }
  return done;
}

}  // namespace airlock::channel

#include "cli/attach.h"

#include <cstdio>
#include <cstdlib>
#include <thread>

#include "daemon/base64.h"

namespace airlock::cli {

using nlohmann::json;

namespace {

// One attach: streams until the exit event (returned) or an error (thrown).
json attach_once(const client::Client& c, AttachState& st, const OutputWriter& write) {
  json exit;
  c.stream_lines(
      "/v1/sandboxes/" + st.id + "/exec/" + st.exec_id + "?offset=" + std::to_string(st.offset),
      [&](const json& ev) {
        std::string type = ev.value("type", "");
        if (type == "attach") {
          uint64_t from = ev.value("offset", st.offset);
          if (from > st.offset) {
            // Evicted from the guest's bounded buffer before
            // anyone read it: say so, once per gap.
            st.dropped += from - st.offset;
            std::fprintf(stderr,
                         "airlock: %llu bytes of output were lost while no client "
                         "was attached (the exec's buffer was full)\n",
                         static_cast<unsigned long long>(from - st.offset));
            st.offset = from;
          }
        } else if (type == "stdout" || type == "stderr") {
          auto bytes = daemon::base64_decode(ev.value("data", ""));
          if (!bytes) throw Error(Errc::internal, "airlockd sent invalid base64 output");
          write(type == "stdout" ? 1 : 2, *bytes);
          st.offset += bytes->size();
        } else if (type == "exit") {
          exit = ev;
        }
      });
  if (exit.is_null())
    throw client::ConnectionLost("the attach stream of exec " + st.exec_id +
                                 " ended without an exit");
  return exit;
}

}  // namespace

std::chrono::milliseconds reattach_patience() {
  if (const char* v = std::getenv("AIRLOCK_REATTACH_SECONDS"); v && *v) {
    char* end = nullptr;
    double s = std::strtod(v, &end);
    if (*end == '\0' && s >= 0 && s <= 86400)
      return std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
  }
  return std::chrono::seconds(60);
}

json reattach(const client::Client& c, AttachState& st, const OutputWriter& write,
              std::chrono::milliseconds patience) {
  auto give_up = std::chrono::steady_clock::now() + patience;
  std::string last;
  for (int attempt = 0;; ++attempt) {
    try {
      return attach_once(c, st, write);
    } catch (const Error& e) {
      // Only "airlockd is not there (yet)" is worth waiting for; what the
      // daemon answers (no such exec, a bad offset) is final.
      if (e.code() != Errc::unavailable) throw;
      last = e.what();
    }
    if (std::chrono::steady_clock::now() >= give_up)
      throw client::ConnectionLost("could not reattach to exec " + st.exec_id + " within " +
                                   std::to_string(patience.count() / 1000) + " s: " + last);
    std::this_thread::sleep_for(std::chrono::milliseconds(attempt < 10 ? 200 : 500));
  }
}

}  // namespace airlock::cli

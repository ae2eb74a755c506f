// Attaching to an exec's output by offset (GET /v1/sandboxes/{id}/exec/
// {exec_id}?offset=N): `airlock attach`, and `airlock exec/run` resuming on
// their own when the connection to airlockd breaks mid-exec (the daemon was
// restarted). The offset counts stdout and stderr bytes together, in the
// order the exec produced them, so a client that counts what it printed
// resumes without losing or repeating a byte.
//
//   AttachState st{id, exec_id, printed_so_far};
//   json exit = reattach(c, st, write_output, std::chrono::seconds(60));
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "client/client.h"

namespace airlock::cli {

struct AttachState {
  std::string id, exec_id;
  uint64_t offset = 0;   // the next byte wanted; advanced by every byte written
  uint64_t dropped = 0;  // bytes the guest no longer held when asked for them
};

// Writes one output chunk (fd 1 or 2).
using OutputWriter = std::function<void(int fd, std::string_view bytes)>;

// Attaches (retrying while airlockd cannot be reached, for up to `patience`)
// and writes the output from st.offset on until the exec ends; returns its
// "exit" event. Errors the daemon answers (no such exec, bad offset) are
// thrown at once; still unreachable after `patience`: ConnectionLost.
nlohmann::json reattach(const client::Client& c, AttachState& st, const OutputWriter& write,
                        std::chrono::milliseconds patience);

// How long exec/run wait for the daemon to come back:
// $AIRLOCK_REATTACH_SECONDS (0 = do not reattach), default 60.
std::chrono::milliseconds reattach_patience();

}  // namespace airlock::cli

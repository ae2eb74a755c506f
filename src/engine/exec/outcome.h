// A guest exec's end (channel::ExecOutcome, decoded and bounded by the
// client) as the API's result: shared by the foreground run, background
// jobs and attach.
#pragma once

#include "engine/api/types.h"
#include "engine/channel/guest_client.h"

namespace airlock::engine::exec {

// The exit fields into `res`; the duration only if the guest reported one.
void take_exit(const channel::ExecOutcome& o, ExecResult& res);
// The exit fields and the drop counts (and so `truncated`).
void take_outcome(const channel::ExecOutcome& o, ExecResult& res);

}  // namespace airlock::engine::exec

// envd's process.Process service (E2B's process.proto, JSON codec) over the
// engine's exec machinery: Start and Connect (server streams of start /
// data / end / keepalive events), List, SendInput, SendSignal, CloseStdin,
// Update (PTY size). See docs/e2b.md for where it differs from E2B's envd.
//
// As in envd, a started process does not belong to the stream that started
// it: closing that stream (or a Connect stream) leaves the process running;
// it ends when it exits, is signalled, its Connect-Timeout-Ms (the SDK's
// timeoutMs, 0 = none) passes, or the sandbox ends. Its output goes to the
// streams attached at the time (none: dropped, as envd does); a stream that
// does not read holds the process back once its bounded queue is full.
#pragma once

#include "e2b/envd.h"

namespace airlock::e2b {

// Registers /process.Process/* on `envd` (and a shutdown hook that ends the
// processes it runs).
void register_process(Envd& envd);

}  // namespace airlock::e2b

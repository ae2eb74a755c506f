#include "engine/exec/outcome.h"

namespace airlock::engine::exec {

void take_exit(const channel::ExecOutcome& o, ExecResult& res) {
  res.exit_code = o.exit_code;
  res.signal = o.signal;
  res.timed_out = o.timed_out;
  res.reason = o.reason;
  if (o.duration_ms) res.duration_ms = *o.duration_ms;
}

void take_outcome(const channel::ExecOutcome& o, ExecResult& res) {
  take_exit(o, res);
  res.stdout_dropped = o.stdout_dropped;
  res.stderr_dropped = o.stderr_dropped;
  res.truncated = res.stdout_dropped > 0 || res.stderr_dropped > 0;
}

}  // namespace airlock::engine::exec

// The helper's checked event stream (docs/network.md "Event intake").
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>

#include "engine/audit/journal.h"
#include "engine/engine_metrics.h"

namespace airlock::engine::nethost {

class EventReader;

// Connects to the helper's event stream (run_dir/net-events.sock, peer
// checked to be `helper_pid`) on a thread of its own, checks and rate-limits
// every report (net/intake.h) and appends the accepted ones to `journal`
// under sandbox `id`; reconnects while the helper lives. Destroying the
// reader drains what is still in the socket, writes the last net_suppressed
// summary and stops. nullptr for helper_pid <= 0. Call at start and at
// re-adoption (a restarted daemon re-attaches; the helper queued meanwhile).
std::shared_ptr<EventReader> attach_events(AuditJournal& journal, const std::string& id,
                                           const std::filesystem::path& run_dir, pid_t helper_pid,
                                           EngineMetrics* metrics = nullptr);
// Payload bytes of the sandbox's ended flows so far (for stats):
// {guest -> peer, peer -> guest}.
std::pair<uint64_t, uint64_t> flow_bytes(const EventReader& reader);

}  // namespace airlock::engine::nethost

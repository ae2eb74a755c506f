// What the engine counts for GET /metrics (engine_metrics.cc writes it out
// with the gauges read at scrape time). One instance per engine, in
// Engine::Impl; the places that know a fact call these few methods, so no
// counter lives in a global.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "common/metrics/metrics.h"

namespace airlock::engine {

class EngineMetrics {
 public:
  // A create finished: `start` pool|clone|boot ("none" when it failed
  // before a start path was chosen), `outcome` ok or the error code.
  void create_done(const std::string& start, const std::string& outcome, double seconds);
  // A foreground or background exec call finished: `outcome` the exit
  // reason (exited, signaled, timeout, ...) or the error code.
  void exec_done(const std::string& kind, const std::string& outcome, double seconds);
  // A sandbox ended `failed` with this typed reason (guest_panic, vmm_died,
  // agent_lost, oom, net_helper_died, boot_failed).
  void failure(const std::string& reason);
  // A network event the sandbox's helper reported (net_flow: allowed or
  // denied; net_flow_end: its byte counts).
  void net_event(const std::string& event, const nlohmann::json& fields);

  // A pause, resume, snapshot (disk/memory), restore or fork finished
  // successfully in `seconds`.
  void snapshot_op(const std::string& op, double seconds);

  void write(metrics::Writer& out) const;

 private:
  metrics::CounterVec creates_;
  metrics::HistogramVec create_seconds_{metrics::latency_buckets()};
  metrics::CounterVec execs_;
  metrics::HistogramVec exec_seconds_{metrics::latency_buckets()};
  metrics::CounterVec failures_;
  metrics::CounterVec flows_;
  metrics::CounterVec net_bytes_;
  metrics::HistogramVec snapshot_seconds_{metrics::latency_buckets()};
};

}  // namespace airlock::engine

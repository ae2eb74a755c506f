// GET /metrics facts of the engine: counters kept as things happen
// (EngineMetrics) plus gauges read at scrape time (sandboxes by state, pool,
// journal bytes, QEMU memory), and the readiness check behind GET /readyz.
#include "engine/engine_metrics.h"

#include <spdlog/spdlog.h>

#include <fstream>
#include <sstream>

#include "engine/engine_impl.h"
#include "engine/types_json.h"

namespace airlock::engine {
namespace fs = std::filesystem;
using metrics::Labels;

void EngineMetrics::create_done(const std::string& start, const std::string& outcome,
                                double seconds) {
  creates_.inc({{"start", start}, {"outcome", outcome}});
  // Latency of the creates that produced a sandbox, by how it started (a
  // refused create says nothing about how long starting takes).
  if (outcome == "ok") create_seconds_.observe({{"start", start}}, seconds);
}

void EngineMetrics::exec_done(const std::string& kind, const std::string& outcome, double seconds) {
  execs_.inc({{"kind", kind}, {"outcome", outcome}});
  exec_seconds_.observe({{"kind", kind}}, seconds);
}

void EngineMetrics::failure(const std::string& reason) {
  failures_.inc({{"reason", reason.empty() ? "unknown" : reason}});
}

void EngineMetrics::net_event(const std::string& event, const nlohmann::json& fields) {
  auto num = [&](const char* k) -> double {
    auto it = fields.find(k);
    return it != fields.end() && it->is_number() && *it >= 0 ? it->get<double>() : 0;
  };
  std::string direction = fields.value("direction", std::string("out")) == "in" ? "in" : "out";
  if (event == "net_flow") {
    bool allowed = fields.value("allowed", false);
    flows_.inc({{"direction", direction}, {"verdict", allowed ? "allowed" : "denied"}});
  } else if (event == "net_flow_end") {
    // bytes_out: guest -> peer, bytes_in: peer -> guest, whoever opened it.
    net_bytes_.inc({{"direction", "guest_to_peer"}}, num("bytes_out"));
    net_bytes_.inc({{"direction", "peer_to_guest"}}, num("bytes_in"));
  }
}

void EngineMetrics::snapshot_op(const std::string& op, double seconds) {
  snapshot_seconds_.observe({{"op", op}}, seconds);
}

void EngineMetrics::write(metrics::Writer& out) const {
  out.counter("airlock_creates_total",
              "Sandbox creates by start path (pool, clone, boot; none = refused before one was "
              "chosen) and outcome (ok or the error code)",
              creates_.values());
  out.histogram("airlock_create_duration_seconds",
                "Time of successful creates, call to agent ready, by start path",
                create_seconds_.values());
  out.counter("airlock_execs_total",
              "Exec calls by kind (foreground, background) and outcome (exit reason or error code)",
              execs_.values());
  out.histogram("airlock_exec_duration_seconds",
                "Time of exec calls by kind (a background one: until it runs)",
                exec_seconds_.values());
  out.counter("airlock_sandbox_failures_total", "Sandboxes that ended failed, by typed reason",
              failures_.values());
  out.counter("airlock_network_flows_total",
              "Network flows the sandboxes' filters decided, by direction and verdict",
              flows_.values());
  out.counter("airlock_network_bytes_total", "Payload bytes of ended network flows, by direction",
              net_bytes_.values());
  out.histogram("airlock_snapshot_duration_seconds",
                "Time of successful pause, resume, snapshot_disk, snapshot_memory, restore and "
                "fork operations, by op",
                snapshot_seconds_.values());
}

namespace {

// Resident memory of a process in bytes (VmRSS), 0 if it is gone.
double rss_bytes(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      std::istringstream in(line.substr(6));
      double kb = 0;
      in >> kb;
      return kb * 1024;
    }
  }
  return 0;
}

}  // namespace

void Engine::write_metrics(metrics::Writer& out) {
  auto& impl = *impl_;
  std::map<Labels, double> by_state;
  for (State s :
       {State::starting, State::running, State::pausing, State::paused, State::snapshotting,
        State::stopping, State::deleted, State::timed_out, State::failed})
    by_state[{{"state", to_string(s)}}] = 0;
  double journal_bytes = 0, qemu_rss = 0, qemus = 0;
  // Live sandboxes per owner ("operator" for the unix socket's).
  std::map<Labels, double> by_tenant{{{{"tenant", "operator"}}, 0}};
  for (const auto& sb : list({}, true)) {
    // Warm-pool members are not anyone's sandbox: the pool gauges count them.
    if (sb.spec.metadata.count(kPoolMarker)) continue;
    by_state[{{"state", to_string(sb.state)}}] += 1;
    if (!is_terminal(sb.state))
      by_tenant[{{"tenant", sb.spec.tenant.empty() ? "operator" : sb.spec.tenant}}] += 1;
    try {
      journal_bytes += static_cast<double>(impl.journal.stats(sb.id).bytes);
    } catch (const std::exception& e) {
      spdlog::debug("metrics: journal of {}: {}", sb.id, e.what());
    }
  }
  std::vector<std::shared_ptr<Sandbox>> running;
  {
    // Copied out: impl.mu is never held while a sandbox is looked at.
    running = impl.table.all();
  }
  for (const auto& sb : running) {
    int pid = sb->info().pid;
    if (pid > 0) {
      qemu_rss += rss_bytes(pid);
      ++qemus;
    }
  }
  out.gauge("airlock_sandboxes", "Sandboxes in the registry by state (pool members excluded)",
            by_state);
  impl.metrics.write(out);
  std::map<Labels, double> target, ready, hits, misses;
  for (const auto& slot : pool_info()) {  // every shape of an image, added up
    Labels l{{"image", slot.value("image", std::string())}};
    target[l] += slot.value("target", 0);
    ready[l] += slot.value("ready", 0);
  }
  // Since the daemon started: slots come and go, counters never go down.
  for (const auto& [image, c] : impl.pool.counts()) {
    hits[{{"image", image}}] = static_cast<double>(c.first);
    misses[{{"image", image}}] = static_cast<double>(c.second);
  }
  out.gauge("airlock_pool_target", "Warm pool size asked for, by image", target);
  out.gauge("airlock_pool_ready", "Warm pool members ready to hand out, by image", ready);
  out.counter("airlock_pool_hits_total", "Creates served by a warm pool member, by image", hits);
  out.counter("airlock_pool_misses_total",
              "Creates that found no ready pool member of their shape (a configured or learned "
              "slot), by image",
              misses);
  out.gauge("airlock_journal_bytes", "Size of the audit journals of the sandboxes in the registry",
            journal_bytes);
  out.gauge("airlock_qemu_processes", "QEMU processes of running sandboxes", qemus);
  out.gauge("airlock_qemu_resident_memory_bytes",
            "Resident memory (VmRSS) of the running sandboxes' QEMU processes", qemu_rss);
  out.gauge("airlock_tenant_sandboxes",
            "Live (not ended) sandboxes by owning tenant (operator = the unix socket's)",
            by_tenant);
  std::map<Labels, double> disk;
  nlohmann::json used = disk_usage();
  for (const auto& [kind, bytes] : used["bytes"].items())
    if (kind != "total") disk[{{"kind", kind}}] = bytes.get<double>();
  out.gauge("airlock_disk_bytes",
            "Host disk used by airlock, by kind (images, layers, snapshots, templates, overlays, "
            "journals)",
            disk);
}

nlohmann::json Engine::readiness() {
  auto& impl = *impl_;
  nlohmann::json missing = nlohmann::json::array();
  std::vector<storage::Image> imgs;
  try {
    imgs = impl.images.list();
  } catch (const std::exception& e) {
    missing.push_back(std::string("the image directory cannot be read: ") + e.what());
  }
  bool probed;
  {
    std::lock_guard lock(impl.accel_mu);
    probed = impl.accel.has_value();
  }
  if (imgs.empty()) {
    missing.push_back("no image is built in " + impl.cfg.image_dir.string() +
                      " (airlock image build minimal)");
  } else if (!probed) {
    try {
      impl.resolve_accel(imgs.front());  // cached: done once per daemon
      probed = true;
    } catch (const std::exception& e) {
      missing.push_back(std::string("the accelerator probe failed: ") + e.what());
    }
  }
  if (!probed && imgs.empty())
    missing.push_back("the accelerator probe has not run (it needs a built image's kernel)");
  return {{"ready", missing.empty()}, {"missing", missing}};
}

}  // namespace airlock::engine

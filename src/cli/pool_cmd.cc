#include "cli/pool_cmd.h"

#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/args.h"

namespace airlock::cli {

using nlohmann::json;

void add_pool_command(CLI::App& app, PoolCommand& p) {
  p.cmd = app.add_subcommand(
      "pool",
      "warm pool: keep SIZE sandboxes of IMAGE in one shape ready (0 removes that shape; no "
      "args: show every shape, configured or learned)");
  p.cmd->add_option("image", p.image, "image name");
  p.cmd->add_option("size", p.size, "members to keep ready")->check(CLI::Range(0, 64));
  p.cmd->add_option("--cpus", p.cpus, "members' vCPUs (default 1)");
  p.cmd->add_option("--memory", p.memory, "members' RAM in MiB (default 256)");
  p.cmd->add_option("--disk", p.disk, "members' disk in MiB (default 1024)");
  p.cmd->add_flag("--network", p.network,
                  "members carry a NIC under deny-everything and serve creates with a network "
                  "policy (run --network ...), which they get at hand-out");
  p.cmd->add_flag("--json", p.json, "print JSON");
}

bool run_pool_command(const PoolCommand& p, const std::function<client::Client()>& connect) {
  if (!p.cmd || !p.cmd->parsed()) return false;
  if (!p.image.empty() && !p.size) throw UsageError("pool IMAGE needs a SIZE");
  client::Client c = connect();
  json answer;
  if (p.size) {
    json body{{"image", p.image}, {"size", *p.size}};
    if (p.cpus) body["cpus"] = *p.cpus;
    if (p.memory) body["memory_mb"] = *p.memory;
    if (p.disk) body["disk_mb"] = *p.disk;
    if (p.network) body["network"] = true;
    answer = c.call("PUT", "/v1/pool", body);
  } else {
    answer = c.call("GET", "/v1/pool");
  }
  if (p.json) {
    std::cout << answer.dump(2) << "\n";
    return true;
  }
  for (const auto& slot : answer) {
    const json& sh = slot["shape"];
    std::cout << slot.value("image", "?") << " (" << sh.value("cpus", 0) << " cpu, "
              << sh.value("memory_mb", 0) << "M, disk " << sh.value("disk_mb", 0) << "M"
              << (sh.value("network", false) ? ", network" : "") << "): " << slot.value("ready", 0)
              << "/" << slot.value("target", 0) << " ready, " << slot.value("hits", 0) << " hits, "
              << slot.value("misses", 0) << " misses"
              << (slot.value("learned", false) ? ", learned" : "") << "\n";
  }
  return true;
}

}  // namespace airlock::cli

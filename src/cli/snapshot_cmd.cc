#include "cli/snapshot_cmd.h"

#include <cstdio>
#include <ctime>
#include <iostream>

#include "cli/args.h"

namespace airlock::cli {

using nlohmann::json;

void add_snapshot_commands(CLI::App& app, SnapshotCommands& s) {
  s.pause = app.add_subcommand("pause", "save a sandbox's VM to disk and end it: pause ID");
  s.pause->add_option("id", s.id)->required();
  s.resume = app.add_subcommand("resume", "restore a paused sandbox: resume ID");
  s.resume->add_option("id", s.id)->required();
  s.snapshot = app.add_subcommand(
      "snapshot", "snapshot ID [--name N] [--memory] | snapshot ls | snapshot rm NAME");
  s.snapshot->add_option("id", s.id, "the sandbox to snapshot");
  s.snapshot->add_option("--name", s.name, "the snapshot's name (default: <id>-<time>)");
  s.snapshot->add_flag("--memory", s.memory, "save the running VM too (processes, memory)");
  s.snapshot->add_flag("--json", s.json, "print JSON");
  s.ls = s.snapshot->add_subcommand("ls", "list snapshots");
  s.ls->add_flag("--json", s.json, "print JSON");
  s.rm = s.snapshot->add_subcommand("rm", "delete a snapshot nothing uses");
  s.rm->add_option("name", s.rm_name)->required();
  s.fork = app.add_subcommand("fork", "N new sandboxes continuing from one: fork ID -n N");
  s.fork->add_option("id", s.id)->required();
  s.fork->add_option("-n,--count", s.count, "how many (1..16)");
  s.fork->add_flag("--json", s.json, "print JSON");
}

bool run_snapshot_command(const SnapshotCommands& s,
                          const std::function<client::Client()>& connect) {
  if (s.pause->parsed() || s.resume->parsed()) {
    std::string verb = s.pause->parsed() ? "pause" : "resume";
    json sb = connect().call("POST", "/v1/sandboxes/" + s.id + "/" + verb);
    std::cout << sb.value("id", "") << " " << sb.value("state", "") << "\n";
    return true;
  }
  if (s.ls->parsed()) {
    json arr = connect().call("GET", "/v1/snapshots");
    if (s.json) {
      std::cout << arr.dump(2) << "\n";
      return true;
    }
    std::printf("%-24s %-8s %-16s %-10s %s\n", "NAME", "MEMORY", "SOURCE", "IMAGE", "BYTES");
    for (const auto& j : arr)
      std::printf("%-24s %-8s %-16s %-10s %llu\n", j.value("name", "").c_str(),
                  j.value("memory", false) ? "yes" : "no", j.value("source", "").c_str(),
                  j.value("image", "").c_str(),
                  static_cast<unsigned long long>(j.value("bytes", uint64_t{0})));
    return true;
  }
  if (s.rm->parsed()) {
    connect().call("DELETE", "/v1/snapshots/" + s.rm_name);
    return true;
  }
  if (s.snapshot->parsed()) {
    if (s.id.empty()) throw UsageError("snapshot needs a sandbox id (or ls, rm)");
    std::string name = s.name.empty() ? s.id + "-" + std::to_string(std::time(nullptr)) : s.name;
    json j = connect().call("POST", "/v1/sandboxes/" + s.id + "/snapshots",
                            json{{"name", name}, {"memory", s.memory}});
    std::cout << (s.json ? j.dump(2) : j.value("name", "")) << "\n";
    return true;
  }
  if (s.fork->parsed()) {
    json j = connect().call("POST", "/v1/sandboxes/" + s.id + "/fork", json{{"count", s.count}});
    if (s.json) {
      std::cout << j.dump(2) << "\n";
    } else {
      for (const auto& sb : j.value("sandboxes", json::array()))
        std::cout << sb.value("id", "") << "\n";
    }
    return true;
  }
  return false;
}

}  // namespace airlock::cli

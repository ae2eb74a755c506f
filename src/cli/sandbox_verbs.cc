// create, ls, rm, inspect, info, probe: a sandbox's life and the daemon's facts.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>

#include "cli/probe.h"
#include "cli/verbs.h"
#include "common/error.h"

namespace airlock::cli {
namespace {

using nlohmann::json;

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void add_create_flags(CLI::App* app, CreateOptions& o) {
  app->add_option("--image", o.image, "guest image (default: minimal)");
  app->add_option("--cpus", o.cpus, "virtual CPUs (1..16)");
  app->add_option("--memory", o.memory_mb, "memory in MiB (64..65536)");
  app->add_option("--disk", o.disk_mb, "disk size in MiB");
  app->add_option("--lifetime", o.timeout_s, "seconds before the sandbox is destroyed");
  app->add_option("--idle-timeout", o.idle_timeout_s,
                  "destroy (or pause, --on-idle) it after this many seconds without an exec or "
                  "call (0 = never)");
  app->add_option("--on-idle", o.on_idle, "what --idle-timeout does: destroy (default) or pause");
  app->add_option("--network", o.network, "egress: none (default, no NIC), allowlist or open");
  app->add_option("--allow", o.allow, "allow a CIDR, host name or *.domain (repeatable)")
      ->allow_extra_args(false);
  app->add_option("--deny", o.deny, "deny a CIDR, host name or *.domain (repeatable)")
      ->allow_extra_args(false);
}

Verb add_create(CLI::App& app, const Context& ctx) {
  struct Opts {
    CreateOptions create;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("create", "create a sandbox and print its id");
  add_create_flags(cmd, o->create);
  cmd->add_option("--timeout", o->create.timeout_s, "seconds of life (same as --lifetime)");
  cmd->add_option("--env", o->create.env, "KEY=VALUE default environment of every exec");
  cmd->add_option("--meta", o->create.meta, "KEY=VALUE label");
  cmd->add_flag("--json", o->json, "print the sandbox as JSON");
  cmd->add_option("--from", o->create.from, "start from this snapshot (airlock snapshot)");
  return [cmd, o, &ctx]() -> std::optional<int> {
    if (!cmd->parsed()) return std::nullopt;
    json body = create_body(o->create);  // usage errors before a daemon is started
    json sb = ctx.connect().call("POST", "/v1/sandboxes", body);
    std::cout << (o->json ? sb.dump(2) : sb.value("id", "")) << "\n";
    return 0;
  };
}

Verb add_ls(CLI::App& app, const Context& ctx) {
  struct Opts {
    bool json = false, all = false;
    std::vector<std::string> metas;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("ls", "list sandboxes");
  cmd->add_flag("--json", o->json, "print JSON");
  cmd->add_flag("-a,--all", o->all, "include deleted, failed and timed-out sandboxes");
  cmd->add_option("--meta", o->metas, "KEY=VALUE filter");
  return [cmd, o, &ctx]() -> std::optional<int> {
    if (!cmd->parsed()) return std::nullopt;
    std::string target = "/v1/sandboxes";
    std::string q = o->all ? "all=true" : "";
    for (const auto& [k, v] : parse_kvs(o->metas, "--meta"))
      q += (q.empty() ? "" : "&") + client::url_encode("metadata." + k) + "=" +
           client::url_encode(v);
    if (!q.empty()) target += "?" + q;
    json list = ctx.connect().call("GET", target);
    std::cout << (o->json ? list.dump(2) + "\n" : format_sandbox_table(list, now_ms()));
    return 0;
  };
}

Verb add_rm(CLI::App& app, const Context& ctx) {
  struct Opts {
    std::vector<std::string> ids;
    bool wait = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("rm", "destroy sandboxes");
  cmd->add_option("ids", o->ids, "sandbox ids")->required();
  cmd->add_flag("--wait", o->wait,
                "return once each sandbox's VM and files are gone and its journal is complete "
                "(default: once it is out of service; the teardown finishes in the background)");
  return [cmd, o, &ctx]() -> std::optional<int> {
    if (!cmd->parsed()) return std::nullopt;
    client::Client c = ctx.connect();
    int rc = 0;
    for (const auto& victim : o->ids) {
      try {
        c.call("DELETE", "/v1/sandboxes/" + victim + (o->wait ? "?wait=true" : ""));
        std::cout << victim << "\n";
      } catch (const Error& e) {
        std::fprintf(stderr, "airlock: %s: %s\n", victim.c_str(), e.what());
        rc = 1;
      }
    }
    return rc;
  };
}

Verb add_inspect(CLI::App& app, const Context& ctx) {
  struct Opts {
    std::string id;
    bool posture = false, json = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("inspect", "a sandbox's details; --posture: its QEMU jail");
  cmd->add_option("id", o->id)->required();
  cmd->add_flag("--posture", o->posture, "the jail as read back from /proc, and what is missing");
  cmd->add_flag("--json", o->json, "print JSON");
  return [cmd, o, &ctx]() -> std::optional<int> {
    if (!cmd->parsed()) return std::nullopt;
    json j = ctx.connect().call("GET", "/v1/sandboxes/" + o->id + (o->posture ? "/posture" : ""));
    if (o->json || !o->posture)
      std::cout << j.dump(2) << "\n";
    else
      std::cout << format_posture(j);
    return 0;
  };
}

Verb add_info(CLI::App& app, const Context& ctx) {
  auto json_out = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("info", "daemon and host facts");
  cmd->add_flag("--json", *json_out, "print JSON");
  return [cmd, json_out, &ctx]() -> std::optional<int> {
    if (!cmd->parsed()) return std::nullopt;
    json j = ctx.connect().call("GET", "/v1/info");
    if (*json_out) {
      std::cout << j.dump(2) << "\n";
    } else {
      for (const auto& [k, v] : j.items())
        std::cout << k << ": " << (v.is_string() ? v.get<std::string>() : v.dump()) << "\n";
    }
    return 0;
  };
}

Verb add_probe(CLI::App& app, const Context& ctx) {
  auto o = std::make_shared<ProbeOptions>();
  CLI::App* cmd = app.add_subcommand(
      "probe", "run the containment battery against fresh sandboxes on this host");
  cmd->add_option("--image", o->image, "guest image (default: minimal)");
  cmd->add_option("--network", o->network, "policy of the ordinary task: none (default), open")
      ->check(CLI::IsMember({"none", "open"}));
  cmd->add_flag("--json", o->json, "print JSON");
  cmd->add_flag("--quick", o->quick, "fewer samples (time to a new instance over 3, not 10)");
  cmd->add_option("--only", o->only,
                  "run only these sections: task, reach, leftovers, time, hostile, after "
                  "(repeatable; cleanup always runs)")
      ->delimiter(',');
  return [cmd, o, &ctx]() -> std::optional<int> {
    if (!cmd->parsed()) return std::nullopt;
    client::Client c = ctx.connect();
    return run_probe(c, *o, ctx.paths());
  };
}

}  // namespace airlock::cli

// cp, logs, watch, network, port: what goes in and out of a sandbox and
// what it recorded.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>

#include "cli/journal_cmd.h"
#include "cli/verbs.h"
#include "common/error.h"

namespace airlock::cli {
namespace {

using nlohmann::json;

void upload(const client::Client& c, const CpPlan& plan) {
  int fd = 0;
  uint32_t mode = 0644;
  std::string guest = plan.dst.path;
  if (!plan.src.stdio) {
    fd = ::open(plan.src.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw_errno("cannot open " + plan.src.path);
    struct stat st {};
    if (::fstat(fd, &st) == 0) {
      if (S_ISDIR(st.st_mode)) throw UsageError("cp: " + plan.src.path + " is a directory");
      mode = st.st_mode & 07777;
    }
    if (guest.back() == '/') guest += std::filesystem::path(plan.src.path).filename().string();
  } else if (guest.back() == '/') {
    throw UsageError("cp: name the file in the sandbox when copying from stdin");
  }
  c.upload(plan.dst.id, guest, mode, fd);
  if (fd != 0) ::close(fd);
}

void download(const client::Client& c, const CpPlan& plan) {
  if (plan.dst.stdio) {
    c.download(plan.src.id, plan.src.path, 1);
    return;
  }
  std::filesystem::path local = plan.dst.path;
  if (std::filesystem::is_directory(local))
    local /= std::filesystem::path(plan.src.path).filename();
  int fd = ::open(local.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_errno("cannot create " + local.string());
  try {
    c.download(plan.src.id, plan.src.path, fd);
  } catch (...) {
    ::close(fd);
    std::filesystem::remove(local);  // never leave a truncated copy behind
    throw;
  }
  ::close(fd);
}

// One event of `airlock watch` as a line (stderr for the stream's own news).
void print_watch_event(const json& ev, const std::string& path, bool recursive) {
  const std::string type = ev.value("type", "");
  if (type == "watching") {
    std::fprintf(stderr, "airlock: watching %s (%s)\n", path.c_str(),
                 recursive ? "recursive" : "this directory only");
  } else if (type == "overflow") {
    std::cout << "overflow " << ev.value("dropped", uint64_t{0}) << " events dropped" << std::endl;
  } else if (type == "end") {
    std::fprintf(stderr, "airlock: watch ended: %s%s%s\n", ev.value("reason", "").c_str(),
                 ev.contains("message") ? ": " : "", ev.value("message", "").c_str());
  } else {
    std::string p = ev.value("path", "") + (ev.value("is_dir", false) ? "/" : "");
    if (type == "renamed") p = ev.value("old_path", "") + " -> " + p;
    std::cout << type << " " << p << std::endl;
  }
}

}  // namespace

Verb add_cp(CLI::App& app, const Context& ctx) {
  struct Opts {
    std::string src, dst;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd =
      app.add_subcommand("cp", "copy a file: cp SRC DST, one side ID:/path, '-' = stdio");
  cmd->add_option("src", o->src)->required();
  cmd->add_option("dst", o->dst)->required();
  return [cmd, o, &ctx]() -> std::optional<int> {
    if (!cmd->parsed()) return std::nullopt;
    CpPlan plan = plan_cp(o->src, o->dst);
    client::Client c = ctx.connect();
    if (plan.upload())
      upload(c, plan);
    else
      download(c, plan);
    return 0;
  };
}

Verb add_logs(CLI::App& app, const Context& ctx) {
  struct Opts {
    std::string id;
    bool json = false, network = false, follow = false, verify = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("logs", "a sandbox's audit journal");
  cmd->add_option("id", o->id)->required();
  cmd->add_flag("--json", o->json, "print JSON");
  cmd->add_flag("--network", o->network, "only network events, one line each");
  cmd->add_flag("-f,--follow", o->follow, "keep printing new records as they are appended");
  cmd->add_flag("--verify", o->verify,
                "check the journal's hash chain; exit 1 naming the first break");
  return [cmd, o, &ctx]() -> std::optional<int> {
    if (!cmd->parsed()) return std::nullopt;
    client::Client c = ctx.connect();
    const std::string base = "/v1/sandboxes/" + o->id;
    if (o->network) {
      auto print = [&](const json& ev) {
        std::cout << (o->json ? ev.dump() : client::format_net_event(ev)) << std::endl;
      };
      if (o->follow) {
        c.stream_lines(base + "/network/events?follow=true", print);
      } else {
        for (const auto& ev : c.call("GET", base + "/network/events")) print(ev);
      }
      return 0;
    }
    if (o->verify) return verify_journal(c, o->id, o->json);
    if (o->follow) {  // every record, streamed (GET .../events?follow=true)
      c.stream_lines(base + "/events?follow=true", [&](const json& r) {
        std::cout << (o->json ? r.dump() : client::format_audit_line(r)) << std::endl;
      });
      return 0;
    }
    json records = c.call("GET", base + "/logs");
    if (o->json) {
      std::cout << records.dump(2) << "\n";
    } else {
      for (const auto& r : records) std::cout << client::format_audit_line(r) << "\n";
    }
    return 0;
  };
}

Verb add_watch(CLI::App& app, const Context& ctx) {
  struct Opts {
    std::string id, path;
    bool recursive = false, json = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand(
      "watch", "print changes under a guest directory as they happen: watch ID PATH [-r]");
  cmd->add_option("id", o->id)->required();
  cmd->add_option("path", o->path, "absolute guest directory")->required();
  cmd->add_flag("-r,--recursive", o->recursive, "also every directory below it");
  cmd->add_flag("--json", o->json, "print the NDJSON events as they come");
  return [cmd, o, &ctx]() -> std::optional<int> {
    if (!cmd->parsed()) return std::nullopt;
    client::Client c = ctx.connect();
    std::string target = "/v1/sandboxes/" + o->id +
                         "/files/watch?path=" + client::url_encode(o->path) +
                         "&recursive=" + (o->recursive ? "true" : "false");
    c.stream_lines(target, [&](const json& ev) {
      if (o->json)
        std::cout << ev.dump() << std::endl;
      else
        print_watch_event(ev, o->path, o->recursive);
    });
    return 0;
  };
}

Verb add_network(CLI::App& app, const Context& ctx) {
  struct Opts {
    std::string id;
    std::optional<std::string> mode;
    std::vector<std::string> allow, deny;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd =
      app.add_subcommand("network", "change a running sandbox's egress policy (no flags: show it)");
  cmd->add_option("id", o->id)->required();
  cmd->add_option("--mode", o->mode, "none, allowlist or open (--allow alone: allowlist)");
  cmd->add_option("--allow", o->allow, "allow a CIDR, host name or *.domain (repeatable)")
      ->allow_extra_args(false);
  cmd->add_option("--deny", o->deny, "deny a CIDR, host name or *.domain (repeatable)")
      ->allow_extra_args(false);
  cmd->add_flag("--json", o->json, "print JSON");
  return [cmd, o, &ctx]() -> std::optional<int> {
    if (!cmd->parsed()) return std::nullopt;
    auto policy = network_policy(o->mode, o->allow, o->deny);
    client::Client c = ctx.connect();
    if (!policy) {
      json sb = c.call("GET", "/v1/sandboxes/" + o->id);
      json net = sb.value("network", json{{"mode", "none"}});
      std::cout << (o->json ? net.dump(2) : "policy: " + net.dump()) << "\n";
      return 0;
    }
    json answer = c.call("PATCH", "/v1/sandboxes/" + o->id + "/network", *policy);
    std::cout << (o->json ? answer.dump(2) + "\n" : format_network_change(answer));
    return 0;
  };
}

Verb add_port(CLI::App& app, const Context& ctx) {
  struct Opts {
    std::string id;
    std::optional<int> guest_port, host_port, remove;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand(
      "port", "forward a host loopback port to a guest TCP port (no GUEST_PORT: list them)");
  cmd->add_option("id", o->id)->required();
  cmd->add_option("guest_port", o->guest_port, "the guest's TCP port")->check(CLI::Range(1, 65535));
  cmd->add_option("--host-port", o->host_port, "the 127.0.0.1 port (default: a free one)")
      ->check(CLI::Range(1024, 65535));
  cmd->add_option("--rm", o->remove, "stop the forward from this host port")
      ->check(CLI::Range(1, 65535));
  cmd->add_flag("--json", o->json, "print JSON");
  return [cmd, o, &ctx]() -> std::optional<int> {
    if (!cmd->parsed()) return std::nullopt;
    if (o->remove && (o->guest_port || o->host_port))
      throw UsageError("port --rm takes no GUEST_PORT or --host-port");
    if (o->host_port && !o->guest_port) throw UsageError("--host-port needs a GUEST_PORT");
    client::Client c = ctx.connect();
    std::string target = "/v1/sandboxes/" + o->id + "/ports";
    if (o->remove) {
      c.call("DELETE", target + "/" + std::to_string(*o->remove));
      return 0;
    }
    auto line = [](const json& p) {
      return p.value("host", "127.0.0.1") + ":" + std::to_string(p.value("host_port", 0)) +
             " -> guest port " + std::to_string(p.value("guest_port", 0)) + "\n";
    };
    json answer = o->guest_port ? c.call("POST", target,
                                         o->host_port ? json{{"guest_port", *o->guest_port},
                                                             {"host_port", *o->host_port}}
                                                      : json{{"guest_port", *o->guest_port}})
                                : c.call("GET", target);
    if (o->json)
      std::cout << answer.dump(2) << "\n";
    else if (o->guest_port)
      std::cout << line(answer);
    else
      for (const auto& p : answer) std::cout << line(p);
    return 0;
  };
}

}  // namespace airlock::cli

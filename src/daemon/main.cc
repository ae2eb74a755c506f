// airlockd: the engine behind an HTTP/JSON API on a unix socket.
// See server.h for the socket and streaming rules, api/openapi.yaml for the API.
// main reads the flags (grouped below in --help's order), then serve()
// binds the socket, sets up authentication and listeners, builds the
// engine's Config and runs the server on the one Engine this file makes.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>

#include "auth/auth.h"
#include "common/error.h"
#include "daemon/listener.h"
#include "daemon/paths.h"
#include "daemon/server.h"
#include "e2b/api.h"
#include "e2b/envd.h"
#include "engine/engine.h"

namespace {

using namespace airlock;
namespace fs = std::filesystem;

// The command line, with its defaults.
struct Flags {
  std::string data_dir, socket, image_dir, accel = "auto", log_level = "info";
  std::vector<std::string> pools;
  // The learned pool (docs/design.md, "Warm pool").
  int pool_learn = 4, pool_learn_memory_mb = 1024, pool_learn_idle_s = 300;
  int pool_cpu_weight = engine::Config{}.pool_cpu_weight;
  bool no_templates = false;
  std::string template_ram_dir;
  int tcg_tb_size_mb = 128;
  daemon::ServerLimits limits;
  double header_timeout_s = 10;
  double idle_timeout_s = 60;
  int journal_anchor_lag_ms = engine::Config{}.journal_anchor_lag_ms;
  double audit_log_max_mb = 4;
  int journal_max_mb = 64;
  uint64_t exec_buffer_bytes = 1 << 20;
  bool background_delete = true;
  std::string port_forward_range = "40000-40999";
  std::string jail_ids;
  std::vector<std::string> listen;
  std::string tls_cert, tls_key;
  bool e2b_allow_insecure = false;
};

// Where it keeps its state and how it logs.
void add_path_flags(CLI::App& app, Flags& f) {
  app.add_option("--data-dir", f.data_dir,
                 "registry, sandboxes and audit journals (default: /var/lib/airlock as root, "
                 "else $XDG_DATA_HOME/airlock or ~/.local/share/airlock)");
  app.add_option("--socket", f.socket,
                 "unix socket to listen on (default: <data-dir>/airlockd.sock)");
  app.add_option("--image-dir", f.image_dir,
                 "guest images (default: $AIRLOCK_IMAGE_DIR or <data-dir>/images)");
  app.add_option("--accel", f.accel, "accelerator: auto (probe), kvm or tcg")
      ->check(CLI::IsMember({"auto", "kvm", "tcg"}));
  app.add_option("--log-level", f.log_level, "trace, debug, info, warn, error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
}

// The warm pool, configured and learned (docs/design.md, "Warm pool").
void add_pool_flags(CLI::App& app, Flags& f) {
  app.add_option("--pool", f.pools,
                 "IMAGE=N: keep N sandboxes of IMAGE cloned and ready (repeatable; default none)");
  // The learned pool (docs/design.md, "Warm pool"). TakeLast: a later flag
  // wins (the test harness turns learning off first, a suite back on).
  app.add_option("--pool-learn", f.pool_learn,
                 "learn up to N shapes from creates that found no ready pool member: each "
                 "gets 1-2 members ready (0: off; default 4; configured pools are never "
                 "changed; env AIRLOCK_POOL_LEARN)")
      ->envname("AIRLOCK_POOL_LEARN")
      ->check(CLI::Range(0, 64))
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--pool-learn-memory-mb", f.pool_learn_memory_mb,
                 "memory budget of the learned pool: the sum of its members' memory_mb "
                 "(least recently used shapes go first; default 1024)")
      ->check(CLI::Range(64, 1 << 20))
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--pool-learn-idle-s", f.pool_learn_idle_s,
                 "a learned shape no create used for this long is forgotten, its members "
                 "deleted (default 300)")
      ->check(CLI::Range(1, 604800))
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--pool-cpu-weight", f.pool_cpu_weight,
                 "cpu weight of a warm-pool member until its hand-out, against 100 for a "
                 "sandbox in use: refills yield the CPU (1-10000; default 10; 100: no "
                 "difference)")
      ->check(CLI::Range(1, 10000));
}

// How sandboxes start: templates and TCG.
void add_vm_flags(CLI::App& app, Flags& f) {
  app.add_flag("--no-templates", f.no_templates,
               "always cold-boot (no VM templates or copy-on-write clones)");
  app.add_option("--template-ram-dir", f.template_ram_dir,
                 "where template RAM files live; tmpfs (default /dev/shm/airlock-<hash>)");
  app.add_option("--tcg-tb-size", f.tcg_tb_size_mb,
                 "TCG translation cache per QEMU in MiB, counted in its memory limit (0: QEMU's "
                 "1 GiB default)")
      ->check(CLI::Range(0, 4096));
}

// Connection bounds and timeouts (server.h).
void add_connection_flags(CLI::App& app, Flags& f) {
  app.add_option("--max-connections", f.limits.max_connections,
                 "client connections served at once; more are answered 503 (default 256)")
      ->check(CLI::Range(1, 65536));
  app.add_option("--max-connections-per-tenant", f.limits.max_per_tenant,
                 "TCP connections one tenant holds at once, streams included; more are "
                 "answered 503 (default 64)")
      ->check(CLI::Range(1, 65536));
  app.add_option("--max-connections-per-source", f.limits.max_per_source,
                 "TCP connections from one source address at once (an IPv6 /64 counts as one; "
                 "behind a proxy on this host every client is its address); more are answered "
                 "503 (default 128)")
      ->check(CLI::Range(1, 65536));
  app.add_option("--unix-socket-reserve", f.limits.unix_reserve,
                 "connections of --max-connections kept for the unix socket, so the operator "
                 "gets in however many TCP clients there are (at most half; default 16)")
      ->check(CLI::Range(0, 65536));
  app.add_option("--header-timeout", f.header_timeout_s,
                 "seconds a request's whole header block may take to arrive, from its first "
                 "byte (a connection's first request: from accept); later is answered 408 and "
                 "closed (default 10)")
      ->check(CLI::Range(0.05, 3600.0));
  app.add_option("--idle-timeout", f.idle_timeout_s,
                 "seconds a connection may send nothing (between or mid-request) or read "
                 "nothing of a stream before it is closed; a silent exec is not idle (default 60)")
      ->check(CLI::Range(0.05, 86400.0));
}

// Journals, exec output kept for re-attach, deletes.
void add_journal_flags(CLI::App& app, Flags& f) {
  app.add_option("--journal-anchor-lag-ms", f.journal_anchor_lag_ms,
                 "how long the head of a buffered journal record (an exec's) may wait for its "
                 "signed anchor; sync records and verify anchor at once (0: every record at "
                 "once; default 50)")
      ->check(CLI::Range(0, 10000));
  app.add_option("--audit-log-max-mb", f.audit_log_max_mb,
                 "size of <data-dir>/audit.jsonl (authentication failures, tokens, creates and "
                 "deletes) before it is rotated to audit.jsonl.1 (two rotated files kept; "
                 "default 4)")
      ->check(CLI::Range(0.01, 1024.0));
  app.add_option("--journal-max-mb", f.journal_max_mb,
                 "audit journal cap per sandbox in MiB: past it guest-driven records are "
                 "dropped and counted, lifecycle records kept (0: no cap)")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--exec-buffer-bytes", f.exec_buffer_bytes,
                 "output each foreground exec keeps in the guest so a client can attach again "
                 "after a daemon restart; beyond it the oldest bytes are dropped, counted "
                 "(default 1048576)")
      ->check(CLI::Range(uint64_t{65536}, uint64_t{1} << 30));
  app.add_flag("--background-delete,!--sync-delete", f.background_delete,
               "answer a DELETE once the sandbox is out of service and finish its teardown in "
               "the background, the journal's deleted record marking the end (the default); "
               "--sync-delete: answer once everything is gone");
}

// Host resources sandboxes get: forwarded ports, jail ids.
void add_host_flags(CLI::App& app, Flags& f) {
  app.add_option("--port-forward-range", f.port_forward_range,
                 "MIN-MAX: the host ports on 127.0.0.1 that sandbox port forwards may bind "
                 "(airlock port), for tenants and the operator alike; 1024-65535 at widest "
                 "(default 40000-40999)");
  app.add_option("--jail-ids", f.jail_ids,
                 "BASE:COUNT: uids/gids for QEMU jails, checked against /etc/subuid, /etc/subgid, "
                 "passwd and group (default 2100000000:65536)");
}

// TCP listeners and the E2B surface.
void add_listen_flags(CLI::App& app, Flags& f) {
  app.add_option("--listen", f.listen,
                 "HOST:PORT: also serve the API on TCP, authenticated by tokens (airlock token "
                 "create); plain HTTP only on loopback, else --tls-cert/--tls-key (repeatable)");
  app.add_option("--tls-cert", f.tls_cert, "PEM certificate (chain) for --listen");
  app.add_option("--tls-key", f.tls_key, "PEM private key for --listen");
  app.add_flag("--e2b-allow-insecure", f.e2b_allow_insecure,
               "let E2B creates on POST /e2b/api/sandboxes with `secure: false` make sandboxes "
               "whose envd anyone who knows the id may drive without an access token (default: "
               "every E2B sandbox is secure and such a create is refused)");
}

// --jail-ids BASE:COUNT.
vmm::JailIdRange parse_jail_ids(const std::string& text) {
  auto colon = text.find(':');
  try {
    if (colon == std::string::npos) throw std::invalid_argument("no ':'");
    unsigned long base = std::stoul(text.substr(0, colon));
    unsigned long count = std::stoul(text.substr(colon + 1));
    if (base > UINT32_MAX || count > UINT32_MAX) throw std::out_of_range("past 2^32");
    return {static_cast<uint32_t>(base), static_cast<uint32_t>(count)};
  } catch (const std::exception&) {
    throw Error(Errc::invalid_argument, "--jail-ids must be BASE:COUNT, got " + text, "jail_ids");
  }
}

// --port-forward-range MIN-MAX into config's port_forward_min/max.
void set_port_forward_range(engine::Config& config, const std::string& range) {
  auto dash = range.find('-');
  int lo = 0, hi = 0;
  try {
    if (dash == std::string::npos) throw std::invalid_argument("no '-'");
    size_t a = 0, b = 0;
    lo = std::stoi(range.substr(0, dash), &a);
    hi = std::stoi(range.substr(dash + 1), &b);
    if (a != dash || b != range.size() - dash - 1) throw std::invalid_argument("trailing text");
  } catch (const std::exception&) {
    lo = hi = 0;
  }
  if (lo < 1024 || hi > 65535 || lo > hi)
    throw Error(Errc::invalid_argument,
                "--port-forward-range must be MIN-MAX within 1024-65535, got " + range,
                "port-forward-range");
  config.port_forward_min = lo;
  config.port_forward_max = hi;
}

// Each --pool IMAGE=N.
std::map<std::string, int> parse_pools(const std::vector<std::string>& pools) {
  std::map<std::string, int> out;
  for (const std::string& p : pools) {
    auto eq = p.find('=');
    int n = -1;
    try {
      if (eq != std::string::npos) n = std::stoi(p.substr(eq + 1));
    } catch (const std::exception&) {
    }
    if (eq == std::string::npos || eq == 0 || n < 0)
      throw Error(Errc::invalid_argument, "--pool wants IMAGE=N, got '" + p + "'", "pool");
    out[p.substr(0, eq)] = n;
  }
  return out;
}

engine::Config engine_config(const Flags& f, const fs::path& data) {
  engine::Config config;
  config.data_dir = data;
  // Absolute: QEMU runs in a jail whose bind mounts need absolute paths.
  config.image_dir =
      fs::absolute(f.image_dir.empty() ? daemon::default_image_dir(data) : fs::path(f.image_dir));
  config.accel = f.accel == "auto" ? "" : f.accel;
  config.templates = !f.no_templates;
  config.tcg_tb_size_mb = f.tcg_tb_size_mb;
  if (!f.jail_ids.empty()) config.jail_ids = parse_jail_ids(f.jail_ids);
  set_port_forward_range(config, f.port_forward_range);
  config.journal_max_bytes = static_cast<uint64_t>(f.journal_max_mb) << 20;
  config.journal_anchor_lag_ms = f.journal_anchor_lag_ms;
  config.exec_buffer_bytes = f.exec_buffer_bytes;
  config.background_delete = f.background_delete;
  // The lifecycle reserve: 1 MiB, or a quarter of a smaller cap.
  config.journal_reserve_bytes = std::min<uint64_t>(1u << 20, config.journal_max_bytes / 4);
  if (!f.template_ram_dir.empty()) config.template_ram_dir = fs::absolute(f.template_ram_dir);
  config.pool_learn_shapes = f.pool_learn;
  config.pool_learn_memory_mb = f.pool_learn_memory_mb;
  config.pool_learn_idle_s = f.pool_learn_idle_s;
  config.pool_cpu_weight = f.pool_cpu_weight;
  for (const auto& [image, n] : parse_pools(f.pools)) config.pool[image] = n;
  return config;
}

// --listen (and its TLS pair) on the bound server.
void listen_tcp(daemon::Server& server, const Flags& f) {
  if (f.tls_cert.empty() != f.tls_key.empty())
    throw Error(Errc::invalid_argument, "--tls-cert and --tls-key go together",
                f.tls_cert.empty() ? "tls-cert" : "tls-key");
  if (!f.tls_cert.empty() && f.listen.empty())
    throw Error(Errc::invalid_argument, "--tls-cert needs --listen", "listen");
  auto tls = f.tls_cert.empty() ? nullptr : daemon::make_tls_context(f.tls_cert, f.tls_key);
  for (const auto& l : f.listen) server.listen(daemon::parse_listen(l), tls);
}

// Binds, builds the engine, serves until SIGTERM/SIGINT; the exit status.
int serve(Flags& f) {
  fs::path data = f.data_dir.empty() ? daemon::default_data_dir() : fs::path(f.data_dir);
  data = fs::absolute(data);
  fs::create_directories(data);
  fs::path sock = f.socket.empty() ? daemon::default_socket(data) : fs::path(f.socket);
  f.limits.idle_timeout = std::chrono::milliseconds(static_cast<int64_t>(f.idle_timeout_s * 1000));
  f.limits.header_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(f.header_timeout_s * 1000));
  daemon::Server server(fs::absolute(sock), f.limits);
  server.bind();  // before the engine: a second daemon must not touch the data dir
  auth::AuthOptions auth_options;
  auth_options.audit.max_bytes = static_cast<uint64_t>(f.audit_log_max_mb * (1 << 20));
  auth::Auth auth(data, auth_options);
  server.set_auth(&auth);
  listen_tcp(server, f);

  engine::Config config = engine_config(f, data);
  auto eng = std::make_unique<engine::Engine>(config);
  // E2B's control plane (docs/e2b.md); its access-token key lives beside
  // the registry.
  auto e2b_tokens = std::make_shared<const e2b::AccessTokens>(data / "e2b-access.key");
  server.add_extension("/e2b/api/", [api = e2b::Api(e2b_tokens, f.e2b_allow_insecure)](
                                        engine::SandboxService& e, daemon::Exchange& ex,
                                        const daemon::Principal& who) { api.serve(e, ex, who); });
  // ... and its in-sandbox half, envd (process.Process, filesystem, /files).
  auto envd = e2b::make_envd(e2b_tokens, f.e2b_allow_insecure);
  server.add_extension("/e2b/envd/",
                       [envd](engine::SandboxService& e, daemon::Exchange& ex,
                              const daemon::Principal& who) { envd->serve(e, ex, who); });
  spdlog::info("data dir {}, images {}", data.string(), config.image_dir.string());
  if (!server.run(*eng)) {
    // A connection thread is still inside the engine (e.g. a boot): do not
    // destroy the engine under it. Sandboxes are re-adopted at next start.
    spdlog::default_logger()->flush();
    std::_Exit(0);
  }
  envd->shutdown();  // its commands end before the engine goes
  eng.reset();
  spdlog::info("airlockd stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"airlockd: disposable microVM sandboxes behind an HTTP API on a unix socket"};
  Flags flags;
  for (auto add : {add_path_flags, add_pool_flags, add_vm_flags, add_connection_flags,
                   add_journal_flags, add_host_flags, add_listen_flags})
    add(app, flags);
  app.set_version_flag("--version", AIRLOCK_VERSION);
  CLI11_PARSE(app, argc, argv);

  spdlog::set_level(spdlog::level::from_str(flags.log_level));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ [%t] %v");
  try {
    return serve(flags);
  } catch (const airlock::Error& e) {
    spdlog::error("{}", e.what());
    return 1;
  } catch (const std::exception& e) {
    spdlog::error("fatal: {}", e.what());
    return 1;
  }
}

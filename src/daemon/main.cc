// airlockd: the engine behind an HTTP/JSON API on a unix socket.
// See server.h for the socket and streaming rules, api/openapi.yaml for the API.
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

int main(int argc, char** argv) {
  using namespace airlock;
  CLI::App app{"airlockd: disposable microVM sandboxes behind an HTTP API on a unix socket"};
  std::string data_dir, socket, image_dir, accel = "auto", log_level = "info";
  app.add_option("--data-dir", data_dir,
                 "registry, sandboxes and audit journals (default: /var/lib/airlock as root, "
                 "else $XDG_DATA_HOME/airlock or ~/.local/share/airlock)");
  app.add_option("--socket", socket,
                 "unix socket to listen on (default: <data-dir>/airlockd.sock)");
  app.add_option("--image-dir", image_dir,
                 "guest images (default: $AIRLOCK_IMAGE_DIR or <data-dir>/images)");
  app.add_option("--accel", accel, "accelerator: auto (probe), kvm or tcg")
      ->check(CLI::IsMember({"auto", "kvm", "tcg"}));
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  std::vector<std::string> pools;
  app.add_option("--pool", pools,
                 "IMAGE=N: keep N sandboxes of IMAGE cloned and ready (repeatable; default none)");
  // The learned pool (docs/design.md, "Warm pool"). TakeLast: a later flag
  // wins (the test harness turns learning off first, a suite back on).
  int pool_learn = 4, pool_learn_memory_mb = 1024, pool_learn_idle_s = 300;
  app.add_option("--pool-learn", pool_learn,
                 "learn up to N shapes from creates that found no ready pool member: each "
                 "gets 1-2 members ready (0: off; default 4; configured pools are never "
                 "changed; env AIRLOCK_POOL_LEARN)")
      ->envname("AIRLOCK_POOL_LEARN")
      ->check(CLI::Range(0, 64))
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--pool-learn-memory-mb", pool_learn_memory_mb,
                 "memory budget of the learned pool: the sum of its members' memory_mb "
                 "(least recently used shapes go first; default 1024)")
      ->check(CLI::Range(64, 1 << 20))
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--pool-learn-idle-s", pool_learn_idle_s,
                 "a learned shape no create used for this long is forgotten, its members "
                 "deleted (default 300)")
      ->check(CLI::Range(1, 604800))
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  int pool_cpu_weight = engine::Config{}.pool_cpu_weight;
  app.add_option("--pool-cpu-weight", pool_cpu_weight,
                 "cpu weight of a warm-pool member until its hand-out, against 100 for a "
                 "sandbox in use: refills yield the CPU (1-10000; default 10; 100: no "
                 "difference)")
      ->check(CLI::Range(1, 10000));
  bool no_templates = false;
  app.add_flag("--no-templates", no_templates,
               "always cold-boot (no VM templates or copy-on-write clones)");
  std::string template_ram_dir;
  app.add_option("--template-ram-dir", template_ram_dir,
                 "where template RAM files live; tmpfs (default /dev/shm/airlock-<hash>)");
  int tcg_tb_size_mb = 128;
  app.add_option("--tcg-tb-size", tcg_tb_size_mb,
                 "TCG translation cache per QEMU in MiB, counted in its memory limit (0: QEMU's "
                 "1 GiB default)")
      ->check(CLI::Range(0, 4096));
  daemon::ServerLimits limits;
  app.add_option("--max-connections", limits.max_connections,
                 "client connections served at once; more are answered 503 (default 256)")
      ->check(CLI::Range(1, 65536));
  app.add_option("--max-connections-per-tenant", limits.max_per_tenant,
                 "TCP connections one tenant holds at once, streams included; more are "
                 "answered 503 (default 64)")
      ->check(CLI::Range(1, 65536));
  app.add_option("--max-connections-per-source", limits.max_per_source,
                 "TCP connections from one source address at once (an IPv6 /64 counts as one; "
                 "behind a proxy on this host every client is its address); more are answered "
                 "503 (default 128)")
      ->check(CLI::Range(1, 65536));
  app.add_option("--unix-socket-reserve", limits.unix_reserve,
                 "connections of --max-connections kept for the unix socket, so the operator "
                 "gets in however many TCP clients there are (at most half; default 16)")
      ->check(CLI::Range(0, 65536));
  double header_timeout_s = 10;
  app.add_option("--header-timeout", header_timeout_s,
                 "seconds a request's whole header block may take to arrive, from its first "
                 "byte (a connection's first request: from accept); later is answered 408 and "
                 "closed (default 10)")
      ->check(CLI::Range(0.05, 3600.0));
  double idle_timeout_s = 60;
  app.add_option("--idle-timeout", idle_timeout_s,
                 "seconds a connection may send nothing (between or mid-request) or read "
                 "nothing of a stream before it is closed; a silent exec is not idle (default 60)")
      ->check(CLI::Range(0.05, 86400.0));
  int journal_anchor_lag_ms = engine::Config{}.journal_anchor_lag_ms;
  app.add_option("--journal-anchor-lag-ms", journal_anchor_lag_ms,
                 "how long the head of a buffered journal record (an exec's) may wait for its "
                 "signed anchor; sync records and verify anchor at once (0: every record at "
                 "once; default 50)")
      ->check(CLI::Range(0, 10000));
  double audit_log_max_mb = 4;
  app.add_option("--audit-log-max-mb", audit_log_max_mb,
                 "size of <data-dir>/audit.jsonl (authentication failures, tokens, creates and "
                 "deletes) before it is rotated to audit.jsonl.1 (two rotated files kept; "
                 "default 4)")
      ->check(CLI::Range(0.01, 1024.0));
  int journal_max_mb = 64;
  app.add_option("--journal-max-mb", journal_max_mb,
                 "audit journal cap per sandbox in MiB: past it guest-driven records are "
                 "dropped and counted, lifecycle records kept (0: no cap)")
      ->check(CLI::Range(0, 1 << 20));
  uint64_t exec_buffer_bytes = 1 << 20;
  app.add_option("--exec-buffer-bytes", exec_buffer_bytes,
                 "output each foreground exec keeps in the guest so a client can attach again "
                 "after a daemon restart; beyond it the oldest bytes are dropped, counted "
                 "(default 1048576)")
      ->check(CLI::Range(uint64_t{65536}, uint64_t{1} << 30));
  bool background_delete = true;
  app.add_flag("--background-delete,!--sync-delete", background_delete,
               "answer a DELETE once the sandbox is out of service and finish its teardown in "
               "the background, the journal's deleted record marking the end (the default); "
               "--sync-delete: answer once everything is gone");
  std::string port_forward_range = "40000-40999";
  app.add_option("--port-forward-range", port_forward_range,
                 "MIN-MAX: the host ports on 127.0.0.1 that sandbox port forwards may bind "
                 "(airlock port), for tenants and the operator alike; 1024-65535 at widest "
                 "(default 40000-40999)");
  std::string jail_ids;
  app.add_option("--jail-ids", jail_ids,
                 "BASE:COUNT: uids/gids for QEMU jails, checked against /etc/subuid, /etc/subgid, "
                 "passwd and group (default 2100000000:65536)");
  std::vector<std::string> listen;
  std::string tls_cert, tls_key;
  app.add_option("--listen", listen,
                 "HOST:PORT: also serve the API on TCP, authenticated by tokens (airlock token "
                 "create); plain HTTP only on loopback, else --tls-cert/--tls-key (repeatable)");
  app.add_option("--tls-cert", tls_cert, "PEM certificate (chain) for --listen");
  app.add_option("--tls-key", tls_key, "PEM private key for --listen");
  bool e2b_allow_insecure = false;
  app.add_flag("--e2b-allow-insecure", e2b_allow_insecure,
               "let E2B creates on POST /e2b/api/sandboxes with `secure: false` make sandboxes "
               "whose envd anyone who knows the id may drive without an access token (default: "
               "every E2B sandbox is secure and such a create is refused)");
  app.set_version_flag("--version", AIRLOCK_VERSION);
  CLI11_PARSE(app, argc, argv);

  spdlog::set_level(spdlog::level::from_str(log_level));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ [%t] %v");
  try {
    std::filesystem::path data =
        data_dir.empty() ? daemon::default_data_dir() : std::filesystem::path(data_dir);
    data = std::filesystem::absolute(data);
    std::filesystem::create_directories(data);
    std::filesystem::path sock =
        socket.empty() ? daemon::default_socket(data) : std::filesystem::path(socket);
    limits.idle_timeout = std::chrono::milliseconds(static_cast<int64_t>(idle_timeout_s * 1000));
    limits.header_timeout =
        std::chrono::milliseconds(static_cast<int64_t>(header_timeout_s * 1000));
    daemon::Server server(std::filesystem::absolute(sock), limits);
    server.bind();  // before the engine: a second daemon must not touch the data dir
    auth::AuthOptions auth_options;
    auth_options.audit.max_bytes = static_cast<uint64_t>(audit_log_max_mb * (1 << 20));
    auth::Auth auth(data, auth_options);
    server.set_auth(&auth);
    if (tls_cert.empty() != tls_key.empty())
      throw Error(Errc::invalid_argument, "--tls-cert and --tls-key go together",
                  tls_cert.empty() ? "tls-cert" : "tls-key");
    if (!tls_cert.empty() && listen.empty())
      throw Error(Errc::invalid_argument, "--tls-cert needs --listen", "listen");
    {
      auto tls = tls_cert.empty() ? nullptr : daemon::make_tls_context(tls_cert, tls_key);
      for (const auto& l : listen) server.listen(daemon::parse_listen(l), tls);
    }

    engine::Config config;
    config.data_dir = data;
    // Absolute: QEMU runs in a jail whose bind mounts need absolute paths.
    config.image_dir = std::filesystem::absolute(
        image_dir.empty() ? daemon::default_image_dir(data) : std::filesystem::path(image_dir));
    config.accel = accel == "auto" ? "" : accel;
    config.templates = !no_templates;
    config.tcg_tb_size_mb = tcg_tb_size_mb;
    if (!jail_ids.empty()) {
      auto colon = jail_ids.find(':');
      try {
        if (colon == std::string::npos) throw std::invalid_argument("no ':'");
        unsigned long base = std::stoul(jail_ids.substr(0, colon));
        unsigned long count = std::stoul(jail_ids.substr(colon + 1));
        if (base > UINT32_MAX || count > UINT32_MAX) throw std::out_of_range("past 2^32");
        config.jail_ids = {static_cast<uint32_t>(base), static_cast<uint32_t>(count)};
      } catch (const std::exception&) {
        throw Error(Errc::invalid_argument, "--jail-ids must be BASE:COUNT, got " + jail_ids,
                    "jail_ids");
      }
    }
    {
      auto dash = port_forward_range.find('-');
      int lo = 0, hi = 0;
      try {
        if (dash == std::string::npos) throw std::invalid_argument("no '-'");
        size_t a = 0, b = 0;
        lo = std::stoi(port_forward_range.substr(0, dash), &a);
        hi = std::stoi(port_forward_range.substr(dash + 1), &b);
        if (a != dash || b != port_forward_range.size() - dash - 1)
          throw std::invalid_argument("trailing text");
      } catch (const std::exception&) {
        lo = hi = 0;
      }
      if (lo < 1024 || hi > 65535 || lo > hi)
        throw Error(
            Errc::invalid_argument,
            "--port-forward-range must be MIN-MAX within 1024-65535, got " + port_forward_range,
            "port-forward-range");
      config.port_forward_min = lo;
      config.port_forward_max = hi;
    }
    config.journal_max_bytes = static_cast<uint64_t>(journal_max_mb) << 20;
    config.journal_anchor_lag_ms = journal_anchor_lag_ms;
    config.exec_buffer_bytes = exec_buffer_bytes;
    config.background_delete = background_delete;
    // The lifecycle reserve: 1 MiB, or a quarter of a smaller cap.
    config.journal_reserve_bytes = std::min<uint64_t>(1u << 20, config.journal_max_bytes / 4);
    if (!template_ram_dir.empty())
      config.template_ram_dir = std::filesystem::absolute(template_ram_dir);
    config.pool_learn_shapes = pool_learn;
    config.pool_learn_memory_mb = pool_learn_memory_mb;
    config.pool_learn_idle_s = pool_learn_idle_s;
    config.pool_cpu_weight = pool_cpu_weight;
    for (const std::string& p : pools) {
      auto eq = p.find('=');
      int n = -1;
      try {
        if (eq != std::string::npos) n = std::stoi(p.substr(eq + 1));
      } catch (const std::exception&) {
      }
      if (eq == std::string::npos || eq == 0 || n < 0)
        throw Error(Errc::invalid_argument, "--pool wants IMAGE=N, got '" + p + "'", "pool");
      config.pool[p.substr(0, eq)] = n;
    }
    auto eng = std::make_unique<engine::Engine>(config);
    // E2B's control plane (docs/e2b.md); its access-token key lives beside
    // the registry.
    auto e2b_tokens = std::make_shared<const e2b::AccessTokens>(data / "e2b-access.key");
    server.add_extension("/e2b/api/", [api = e2b::Api(e2b_tokens, e2b_allow_insecure)](
                                          engine::SandboxService& e, daemon::Exchange& ex,
                                          const daemon::Principal& who) { api.serve(e, ex, who); });
    // ... and its in-sandbox half, envd (process.Process, filesystem, /files).
    auto envd = e2b::make_envd(e2b_tokens, e2b_allow_insecure);
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
  } catch (const airlock::Error& e) {
    spdlog::error("{}", e.what());
    return 1;
  } catch (const std::exception& e) {
    spdlog::error("fatal: {}", e.what());
    return 1;
  }
}

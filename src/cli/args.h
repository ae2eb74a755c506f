// The airlock CLI's argument -> request mapping and output formatting, kept
// free of I/O so each rule is unit-tested (args_test.cc).
//
//   auto body = create_body(opts);              // {"image":..,"env":{..}}
//   CpPlan plan = plan_cp("sb-1:/etc/hosts", "-");
//   int code = exit_code_of(exit_event);        // 128+signal, 124 on timeout
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "client/text.h"

namespace airlock::cli {

// A mistake in the command line: printed as "airlock: <message>", exit 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// "K=V" -> {K, V}; `flag` names the option in the error ("--env expects KEY=VALUE").
std::pair<std::string, std::string> parse_kv(const std::string& text, const std::string& flag);
std::map<std::string, std::string> parse_kvs(const std::vector<std::string>& items,
                                             const std::string& flag);

// --network / --allow / --deny as a policy object {"mode", "allow", "deny"}:
//   no flags                     -> nullopt (the daemon's default, mode none)
//   --allow X (no --network)     -> allowlist
//   --deny Y alone               -> usage error (say --network open or allowlist)
//   --network none + --allow/--deny, --network open + --allow -> usage error
//   --network M not none|allowlist|open -> usage error
// What the entries mean is the daemon's to check (its 400 names the entry).
std::optional<nlohmann::json> network_policy(const std::optional<std::string>& mode,
                                             const std::vector<std::string>& allow,
                                             const std::vector<std::string>& deny);

struct CreateOptions {
  std::optional<std::string> image;
  std::optional<int> cpus, memory_mb, disk_mb, timeout_s;
  std::optional<int> idle_timeout_s;   // --idle-timeout (0 = none)
  std::vector<std::string> env, meta;  // raw "K=V"
  std::optional<std::string> network;  // --network
  std::vector<std::string> allow, deny;
  std::optional<std::string> from;     // --from SNAPSHOT
  std::optional<std::string> on_idle;  // --on-idle pause|destroy
};
// Body for POST /v1/sandboxes: only the options given (the daemon has defaults).
nlohmann::json create_body(const CreateOptions& opts);

struct ExecOptions {
  std::vector<std::string> env;  // raw "K=V"
  std::string cwd, user;
  std::optional<double> timeout_s;
  // --pids, --memory-limit (MiB), --cpu-seconds: the exec's "limits".
  std::optional<int> pids, memory_limit_mb;
  std::optional<double> cpu_seconds;
  std::optional<uint64_t> output_limit;  // --output-limit BYTES per stream
  bool background = false;               // -d/--background (exec only)
};
// Body for POST /v1/sandboxes/{id}/exec. `stdin_data` (if any) is sent as
// stdin_b64 so arbitrary bytes survive JSON.
nlohmann::json exec_body(const ExecOptions& opts, const std::vector<std::string>& argv,
                         const std::optional<std::string>& stdin_data);

// The CLI's exit status for an exec's final event: the exit code, 128+signal
// if a signal ended it, 124 on timeout (like timeout(1)).
int exit_code_of(const nlohmann::json& exit_event);

// One side of `airlock cp`: "ID:/abs/path" (in a sandbox), "-" (stdin or
// stdout) or a local path. A local path containing ':' can be written "./a:b".
struct CpEndpoint {
  bool remote = false;
  bool stdio = false;
  std::string id;    // remote only
  std::string path;  // guest path (absolute) or local path
};
CpEndpoint parse_cp_endpoint(const std::string& text);

struct CpPlan {
  CpEndpoint src, dst;
  bool upload() const { return dst.remote; }
};
// Exactly one side must be in a sandbox; "-" only on the local side.
CpPlan plan_cp(const std::string& src, const std::string& dst);

// `airlock ls` table: ID, IMAGE, STATE, CPUS, MEM, AGE/EXPIRES, METADATA.
std::string format_sandbox_table(const nlohmann::json& sandboxes, int64_t now_ms);
// `airlock network ID` output for PATCH's {"policy", "flows_cut"}.
std::string format_network_change(const nlohmann::json& answer);
// `airlock inspect ID --posture`: GET .../posture as lines, e.g.
//   isolation: tcg (TCG: QEMU's own security policy does not ...)
//   jail: full    uid: 200123    capabilities: none    seccomp: filter    no_new_privs: yes
//   namespaces: mnt pid ipc uts net (own)    root: own (dev run tmp usr)
//   cgroup: memory 512.0 MiB, pids 1024, cpu 100000 100000
//   rlimits: core 0, nofile 4096, nproc 1024, fsize 1.1 GiB
//   missing: none
std::string format_posture(const nlohmann::json& posture);

// The CLI's global options that take a value (main.cc defines them; the
// rest of its global options, --help/-h and --version, take none).
inline constexpr std::string_view kGlobalValueOptions[] = {"--socket", "--data-dir", "--image-dir",
                                                           "--url"};
// Commands run once per agent call whose CLI11 options alone parse their
// command line: main.cc builds only that command's part of the tree.
inline constexpr std::string_view kHotCommands[] = {"run", "exec", "ls", "create", "rm"};

// The hot command `args` (argv[1..], up to the first "--") invokes, or "" to
// build the whole tree: no command, help, --version, an option that is not a
// global one, or any other command. Global options and their values before
// the command are skipped ("--socket S" and "--socket=S").
//   hot_command({"--socket", "s", "run", "--image", "x"}) == "run"
//   hot_command({"--help", "run"}) == "";  hot_command({"image", "ls"}) == ""
// The rest of the tree cannot change how a command's own arguments parse:
// once the root has its one subcommand, CLI11 no longer matches a sibling's
// name there, so the reduced tree parses (and fails) exactly as the whole.
std::string_view hot_command(const std::vector<std::string_view>& args);

}  // namespace airlock::cli

// `airlock probe`: the standard sandbox experiment run against fresh
// sandboxes on this host, through the daemon, as a table of checks
// (check · expectation · observed · PASS/FAIL/SKIP) or JSON.
//
//   ProbeOptions o{.image = "minimal", .network = "none", .quick = true};
//   int code = run_probe(client, o, paths);   // 0 only if nothing FAILed
//
// The battery (run_probe) needs a daemon and real VMs; the bookkeeping and
// formatting (ProbeReport, SandboxTracker, median_ms, parse_reach_lines) are
// pure and unit-tested in probe_test.cc.
#pragma once

#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "cli/spawn.h"
#include "client/client.h"

namespace airlock::cli {

// PASS: the expectation held. FAIL: it did not (exit code 1). SKIP: the
// check cannot run here (e.g. no package manager in the image); a SKIP must
// say why in `observed`.
enum class ProbeStatus { pass, fail, skip };
const char* to_string(ProbeStatus s);

struct ProbeCheck {
  std::string section;      // "1 task", "2 reach", ...
  std::string name;         // "fetch a URL"
  std::string expectation;  // "fails fast (< 5 s)"
  std::string observed;     // "wget: bad address, 0.1 s"
  ProbeStatus status = ProbeStatus::fail;
  int64_t ms = 0;  // how long the check took (0 if not timed)
};

// The checks in the order they ran.
class ProbeReport {
 public:
  // Records a check. A SKIP without a reason in `observed` is recorded as a
  // FAIL: a silent skip would hide a check that never ran.
  void add(ProbeCheck c);
  // Shorthand: PASS if `ok`, else FAIL.
  void expect(const std::string& section, const std::string& name, const std::string& expectation,
              bool ok, const std::string& observed, int64_t ms = 0);
  const std::vector<ProbeCheck>& checks() const { return checks_; }
  size_t count(ProbeStatus s) const;
  // True if no check FAILed (and at least one ran).
  bool passed() const;
  // 0 if passed(), else 1.
  int exit_code() const { return passed() ? 0 : 1; }

  // {"passed": bool, "counts": {"pass","fail","skip"}, "checks": [{section,
  // check, expectation, observed, status ("PASS"...), ms}], plus `context`'s
  // keys (image, network, host facts).
  nlohmann::json to_json(const nlohmann::json& context = nlohmann::json::object()) const;
  // A fixed-width table, one row per check; observed text longer than
  // `observed_width` is cut with "…" (the JSON keeps it whole); a summary
  // line at the end ("23 passed, 0 failed, 1 skipped").
  std::string format_table(size_t observed_width = 60) const;

 private:
  std::vector<ProbeCheck> checks_;
};

// The sandboxes a probe created, so every one is destroyed at the end, on
// failure and on Ctrl-C (the signal thread and the battery share it).
class SandboxTracker {
 public:
  void add(const std::string& id);
  // The sandbox was destroyed (or is known gone): no longer tracked.
  void forget(const std::string& id);
  std::vector<std::string> ids() const;
  // Set by the signal thread; the battery stops at its next step.
  void interrupt();
  bool interrupted() const;

 private:
  mutable std::mutex mu_;
  std::set<std::string> ids_;
  bool interrupted_ = false;
};

// The median of `samples_ms` (the mean of the two middle ones for an even
// count); 0 for none.
double median_ms(std::vector<double> samples_ms);

// One line of the reach script's output: "<target> <rc>" (rc 0 = connected).
struct ReachResult {
  std::string target;  // "169.254.169.254:80"
  int rc = -1;
};
// Parses the reach script's output; lines that are not "<target> <int>" are
// ignored (the guest may print noise).
std::vector<ReachResult> parse_reach_lines(const std::string& out);

// One line of the outside-network check's output: "<what> <host> <status>",
// what = apt | pip (whose configured source was tried), status = ok |
// unresolved | unreachable | no-source.
struct OutsideResult {
  std::string what;
  std::string host;
  std::string status;
};
std::vector<OutsideResult> parse_outside_lines(const std::string& out);
// Why the task for `what` cannot reach its source, for a SKIP ("" if it
// can): "no outside network: the image's apt source deb.example.org does
// not resolve". A missing line (the check did not run) is a reason too.
std::string outside_missing(const std::vector<OutsideResult>& results, const std::string& what);
// The host has no outside network: some source was tried and did not
// resolve or connect, and none answered. The first failure's reason, else "".
std::string no_outside_network(const std::vector<OutsideResult>& results);

// The host's own addresses (getifaddrs): IPv4 and global IPv6, no loopback,
// no link-local. These must be unreachable from a guest.
std::vector<std::string> host_addresses();

struct ProbeOptions {
  std::string image = "minimal";
  std::string network = "none";  // none | open
  bool json = false;
  bool quick = false;  // fewer samples (time to instance over 3, not 10)
  // Run only these sections (names as in kProbeSections); empty = all.
  // Cleanup (7) always runs.
  std::vector<std::string> only;
};

// The sections `--only` accepts, in the order they run.
inline const std::vector<std::string> kProbeSections = {"task", "reach",   "leftovers",
                                                        "time", "hostile", "after"};

// Runs the battery against the daemon behind `client` (started already),
// prints the table (or JSON) to stdout and progress to stderr, destroys every
// sandbox it created (also on SIGINT/SIGTERM: exit 130). Returns the exit code.
int run_probe(const client::Client& client, const ProbeOptions& opts, const DaemonPaths& paths);

}  // namespace airlock::cli

#include "cli/args.h"

#include <cstdio>
#include <sstream>

#include "client/text.h"
#include "daemon/base64.h"

namespace airlock::cli {

namespace {
bool is_id_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
}
}  // namespace

std::string_view hot_command(const std::vector<std::string_view>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    std::string_view a = args[i];
    if (a.empty() || a[0] != '-') {
      for (std::string_view hot : kHotCommands)
        if (a == hot) return hot;
      return {};
    }
    bool known = false;
    for (std::string_view opt : kGlobalValueOptions) {
      if (a == opt) {
        known = true;
        ++i;  // its value, whatever it looks like (CLI11 takes it as is)
        break;
      }
      if (a.size() > opt.size() && a.substr(0, opt.size()) == opt && a[opt.size()] == '=') {
        known = true;
        break;
      }
    }
    if (!known) return {};
  }
  return {};
}

std::pair<std::string, std::string> parse_kv(const std::string& text, const std::string& flag) {
  auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0)
    throw UsageError(flag + " expects KEY=VALUE, got '" + text + "'");
  return {text.substr(0, eq), text.substr(eq + 1)};
}

std::map<std::string, std::string> parse_kvs(const std::vector<std::string>& items,
                                             const std::string& flag) {
  std::map<std::string, std::string> out;
  for (const auto& item : items) {
    auto [k, v] = parse_kv(item, flag);
    out[k] = v;
  }
  return out;
}

nlohmann::json create_body(const CreateOptions& o) {
  nlohmann::json j = nlohmann::json::object();
  if (o.image) j["image"] = *o.image;
  if (o.cpus) j["cpus"] = *o.cpus;
  if (o.memory_mb) j["memory_mb"] = *o.memory_mb;
  if (o.disk_mb) j["disk_mb"] = *o.disk_mb;
  if (o.timeout_s) j["timeout"] = *o.timeout_s;
  if (o.idle_timeout_s) j["idle_timeout"] = *o.idle_timeout_s;
  if (!o.env.empty()) j["env"] = parse_kvs(o.env, "--env");
  if (!o.meta.empty()) j["metadata"] = parse_kvs(o.meta, "--meta");
  if (auto net = network_policy(o.network, o.allow, o.deny)) j["network"] = *net;
  if (o.from) j["from"] = *o.from;
  if (o.on_idle) j["on_idle"] = *o.on_idle;
  return j;
}

std::optional<nlohmann::json> network_policy(const std::optional<std::string>& mode,
                                             const std::vector<std::string>& allow,
                                             const std::vector<std::string>& deny) {
  if (!mode && allow.empty() && deny.empty()) return std::nullopt;
  std::string m;
  if (mode) {
    m = *mode;
    if (m != "none" && m != "allowlist" && m != "open")
      throw UsageError("--network must be none, allowlist or open, got '" + m + "'");
  } else if (!allow.empty()) {
    m = "allowlist";  // --allow says what is wanted
  } else {
    // Deny entries alone could mean "open minus these" or "nothing"; the
    // difference is too large to guess.
    throw UsageError("--deny needs --network open or --network allowlist");
  }
  if (m == "none" && (!allow.empty() || !deny.empty()))
    throw UsageError(std::string("--network none takes no ") +
                     (allow.empty() ? "--deny" : "--allow") +
                     " (mode none has no network interface at all)");
  if (m == "open" && !allow.empty())
    throw UsageError("--network open takes no --allow (everything not denied is allowed)");
  nlohmann::json j = {{"mode", m}};
  if (!allow.empty()) j["allow"] = allow;
  if (!deny.empty()) j["deny"] = deny;
  return j;
}

nlohmann::json exec_body(const ExecOptions& o, const std::vector<std::string>& argv,
                         const std::optional<std::string>& stdin_data) {
  if (argv.empty()) throw UsageError("no command given (put it after --)");
  nlohmann::json j = {{"argv", argv}};
  if (!o.env.empty()) j["env"] = parse_kvs(o.env, "--env");
  if (!o.cwd.empty()) j["cwd"] = o.cwd;
  if (!o.user.empty()) j["user"] = o.user;
  if (o.timeout_s) {
    if (*o.timeout_s < 0) throw UsageError("--timeout must not be negative");
    j["timeout"] = *o.timeout_s;
  }
  if (stdin_data) {
    j["stdin_b64"] = daemon::base64_encode(*stdin_data);
  }
  // Ranges are the daemon's to check: its 400 names the field.
  nlohmann::json limits = nlohmann::json::object();
  if (o.pids) limits["pids"] = *o.pids;
  if (o.memory_limit_mb) limits["memory_mb"] = *o.memory_limit_mb;
  if (o.cpu_seconds) limits["cpu_seconds"] = *o.cpu_seconds;
  if (!limits.empty()) j["limits"] = limits;
  if (o.output_limit) j["output_limit_bytes"] = *o.output_limit;
  if (o.background) {
    if (stdin_data) throw UsageError("--background takes no stdin (it runs detached)");
    j["background"] = true;
  }
  return j;
}

int exit_code_of(const nlohmann::json& e) {
  if (e.value("timed_out", false)) return 124;
  if (e.contains("signal") && e["signal"].is_number_integer()) return 128 + e["signal"].get<int>();
  if (e.contains("exit_code") && e["exit_code"].is_number_integer()) {
    int code = e["exit_code"].get<int>();
    return code >= 0 && code <= 255 ? code : 1;
  }
  return 1;  // neither exit nor signal: something went wrong
}

CpEndpoint parse_cp_endpoint(const std::string& text) {
  CpEndpoint ep;
  if (text.empty()) throw UsageError("cp: empty path");
  if (text == "-") {
    ep.stdio = true;
    return ep;
  }
  auto colon = text.find(':');
  bool id_prefix = colon != std::string::npos && colon > 0;
  for (size_t i = 0; id_prefix && i < colon; ++i) id_prefix = is_id_char(text[i]);
  if (!id_prefix) {
    ep.path = text;
    return ep;
  }
  ep.remote = true;
  ep.id = text.substr(0, colon);
  ep.path = text.substr(colon + 1);
  if (ep.path.empty() || ep.path[0] != '/')
    throw UsageError("cp: the path in a sandbox must be absolute: '" + text + "'");
  return ep;
}

CpPlan plan_cp(const std::string& src, const std::string& dst) {
  CpPlan p{parse_cp_endpoint(src), parse_cp_endpoint(dst)};
  if (p.src.remote == p.dst.remote)
    throw UsageError(p.src.remote ? "cp: copying between two sandboxes is not supported"
                                  : "cp: one side must be ID:/path in a sandbox");
  return p;
}

namespace {
std::string duration(int64_t ms) {
  if (ms < 0) ms = 0;
  int64_t s = ms / 1000;
  if (s < 60) return std::to_string(s) + "s";
  if (s < 3600) return std::to_string(s / 60) + "m";
  if (s < 86400) return std::to_string(s / 3600) + "h";
  return std::to_string(s / 86400) + "d";
}
std::string str(const nlohmann::json& j, const char* key) {
  if (!j.contains(key)) return "-";
  const auto& v = j[key];
  return v.is_string() ? v.get<std::string>() : v.dump();
}
}  // namespace

std::string format_sandbox_table(const nlohmann::json& sandboxes, int64_t now_ms) {
  std::vector<std::vector<std::string>> rows = {
      {"ID", "IMAGE", "STATE", "CPUS", "MEMORY", "AGE", "EXPIRES", "METADATA"}};
  for (const auto& sb : sandboxes) {
    std::string meta;
    if (sb.contains("metadata") && sb["metadata"].is_object())
      for (const auto& [k, v] : sb["metadata"].items())
        meta +=
            (meta.empty() ? "" : ",") + k + "=" + (v.is_string() ? v.get<std::string>() : v.dump());
    std::string state = str(sb, "state");
    // A failed sandbox's typed cause belongs next to its state.
    std::string failure = sb.value("failure", "");
    std::string shown = failure.empty() ? state : state + "/" + failure;
    rows.push_back(
        {str(sb, "id"), str(sb, "image"), shown, str(sb, "cpus"), str(sb, "memory_mb") + "M",
         duration(now_ms - sb.value("created_at_ms", now_ms)),
         state == "running" ? "in " + duration(sb.value("expires_at_ms", now_ms) - now_ms) : "-",
         meta.empty() ? "-" : meta});
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  std::string out;
  for (const auto& r : rows) {
    std::string line;
    for (size_t i = 0; i < r.size(); ++i) {
      line += r[i];
      if (i + 1 < r.size()) line += std::string(width[i] - r[i].size() + 2, ' ');
    }
    out += line + "\n";
  }
  return out;
}

std::string format_network_change(const nlohmann::json& answer) {
  std::string out = "policy: " + (answer.contains("policy") ? answer["policy"].dump() : "-") + "\n";
  out += "flows cut: " + str(answer, "flows_cut") + "\n";
  return out;
}

std::string format_posture(const nlohmann::json& p) {
  const nlohmann::json proc = p.value("process", nlohmann::json::object());
  auto val = [](const nlohmann::json& v) -> std::string {
    if (v.is_null()) return "unlimited";
    return v.is_string() ? v.get<std::string>() : v.dump();
  };
  std::string out = "isolation: " + p.value("isolation", "?") + " (" + p.value("note", "") + ")\n";
  const auto& caps = proc.value("capabilities", nlohmann::json::object());
  std::string eff = caps.value("effective", "?");
  bool no_caps = !eff.empty() && eff.find_first_not_of('0') == std::string::npos;
  int seccomp = proc.value("seccomp", -1);
  out += "jail: " + p.value("jail", "?") + "    uid: " +
         val(proc.contains("uid") ? proc["uid"].value("effective", nlohmann::json()) : nullptr) +
         "    capabilities: " + (no_caps ? std::string("none") : eff) + "    seccomp: " +
         (seccomp == 2   ? "filter"
          : seccomp == 1 ? "strict"
                         : "off") +
         "    no_new_privs: " + (proc.value("no_new_privs", false) ? "yes" : "no") + "\n";
  std::string own, shared;
  const nlohmann::json nss = proc.value("namespaces", nlohmann::json::object());
  for (const auto& [ns, v] : nss.items()) (v.value("own", false) ? own : shared) += (ns + " ");
  out += "namespaces: own: " + (own.empty() ? "none " : own) +
         "shared with the host: " + (shared.empty() ? "none" : shared) + "\n";
  const auto& root = proc.value("root", nlohmann::json::object());
  std::string entries;
  const nlohmann::json ents = root.value("entries", nlohmann::json::array());
  for (const auto& e : ents) entries += (entries.empty() ? "" : " ") + e.get<std::string>();
  out += std::string("root: ") + (root.value("own", false) ? "own" : "the host's /") + " (" +
         entries + ")\n";
  const auto& cg = proc.value("cgroup", nlohmann::json::object());
  auto mem = cg.value("memory_max", nlohmann::json());
  out += "cgroup: memory " +
         (mem.is_number() ? client::human_bytes(mem.get<uint64_t>()) : "unlimited") + ", pids " +
         val(cg.value("pids_max", nlohmann::json())) + ", cpu " +
         val(cg.value("cpu_max", nlohmann::json())) + "\n";
  std::string rl;
  const nlohmann::json rls = proc.value("rlimits", nlohmann::json::object());
  for (const auto& [name, v] : rls.items())
    rl += (rl.empty() ? "" : ", ") + name + " " + val(v.value("hard", nlohmann::json()));
  out += "rlimits: " + rl + "\n";
  std::string missing;
  const nlohmann::json miss = p.value("missing", nlohmann::json::array());
  for (const auto& m : miss) missing += (missing.empty() ? "" : ", ") + m.get<std::string>();
  out += "missing: " + (missing.empty() ? std::string("none") : missing) + "\n";
  return out;
}

}  // namespace airlock::cli

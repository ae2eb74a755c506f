#include "cli/token_cmd.h"

#include <charconv>
#include <cstdio>
#include <ctime>
#include <iostream>

#include "common/error.h"

namespace airlock::cli {

using nlohmann::json;

int64_t parse_duration(const std::string& text) {
  int64_t n = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  std::string unit(end, text.data() + text.size());
  int64_t mult = unit.empty() || unit == "s" ? 1
                 : unit == "m"               ? 60
                 : unit == "h"               ? 3600
                 : unit == "d"               ? 86400
                                             : 0;
  if (text.empty() || ec != std::errc() || end == text.data() || mult == 0 || n <= 0 ||
      n > 10ll * 366 * 86400 / mult)
    throw Error(
        Errc::invalid_argument,
        "--expires must be a positive duration like 90s, 15m, 12h or 30d, got '" + text + "'",
        "expires");
  return n * mult;
}

void add_token_commands(CLI::App& app, TokenCommands& t) {
  t.token = app.add_subcommand("token", "API tokens for the TCP listener (airlockd --listen)");
  t.token->require_subcommand(1);
  t.create = t.token->add_subcommand("create", "make a token for a tenant; prints its secret once");
  t.create->add_option("--tenant", t.tenant, "the tenant it acts for")->required();
  t.create->add_option("--expires", t.expires, "lifetime: 90s, 15m, 12h, 30d (default never)");
  t.create->add_flag("--e2b", t.e2b, "the e2b_<hex> form E2B's SDK accepts as E2B_API_KEY");
  t.create->add_flag("--json", t.json, "print JSON");
  t.ls = t.token->add_subcommand("ls", "list tokens (ids, tenants, expiry; never secrets)");
  t.ls->add_flag("--json", t.json, "print JSON");
  t.rm = t.token->add_subcommand("rm", "revoke a token at once");
  t.rm->add_option("id", t.id, "token id (tok_...)")->required();

  t.tenants = app.add_subcommand("tenant", "tenants' quotas (limits left out: none)");
  t.tenants->require_subcommand(1);
  t.tenant_set = t.tenants->add_subcommand("set", "replace a tenant's quota");
  t.tenant_set->add_option("tenant", t.quota_tenant, "tenant name")->required();
  t.tenant_set->add_option("--max-sandboxes", t.max_sandboxes, "live sandboxes at once");
  t.tenant_set->add_option("--max-memory-mb", t.max_memory_mb, "sum of memory_mb of live ones");
  t.tenant_set->add_option("--max-disk-mb", t.max_disk_mb, "sum of disk_mb of live ones");
  t.tenant_set->add_option("--creates-per-minute", t.creates_per_minute, "creates in any 60 s");
  t.tenant_ls = t.tenants->add_subcommand("ls", "tenants, their quotas and usage");
  for (CLI::App* c : {t.tenant_set, t.tenant_ls}) c->add_flag("--json", t.json, "print JSON");
}

namespace {
std::string when(const json& v) {
  if (!v.is_number_integer()) return "never";
  std::time_t t = v.get<int64_t>();
  char buf[32];
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}
}  // namespace

bool run_token_command(const TokenCommands& t, const std::function<client::Client()>& connect) {
  if (t.create->parsed()) {
    json body{{"tenant", t.tenant}, {"format", t.e2b ? "e2b" : "airlock"}};
    if (!t.expires.empty()) body["expires_in_s"] = parse_duration(t.expires);
    json j = connect().call("POST", "/v1/tokens", body);
    if (t.json) {
      std::cout << j.dump(2) << "\n";
    } else {
      std::cout << j.value("secret", "") << "\n";
      std::cerr << "token " << j.value("id", "") << " for tenant " << j.value("tenant", "")
                << ", expires " << when(j["expires"])
                << ". The secret is shown only now: store it.\n";
    }
    return true;
  }
  if (t.ls->parsed()) {
    json arr = connect().call("GET", "/v1/tokens");
    if (t.json) {
      std::cout << arr.dump(2) << "\n";
    } else {
      std::printf("%-20s %-20s %-8s %-20s\n", "ID", "TENANT", "FORMAT", "EXPIRES");
      for (const auto& j : arr)
        std::printf("%-20s %-20s %-8s %-20s\n", j.value("id", "").c_str(),
                    j.value("tenant", "").c_str(), j.value("format", "").c_str(),
                    when(j["expires"]).c_str());
    }
    return true;
  }
  if (t.tenant_set->parsed() || t.tenant_ls->parsed()) {
    json arr;
    if (t.tenant_set->parsed()) {
      json body = json::object();
      auto put = [&](const char* k, const std::optional<int64_t>& v) {
        if (v) body[k] = *v;
      };
      put("max_sandboxes", t.max_sandboxes);
      put("max_memory_mb", t.max_memory_mb);
      put("max_disk_mb", t.max_disk_mb);
      put("creates_per_minute", t.creates_per_minute);
      arr = json::array({connect().call("PUT", "/v1/tenants/" + t.quota_tenant, body)});
    } else {
      arr = connect().call("GET", "/v1/tenants");
    }
    if (t.json) {
      std::cout << (t.tenant_set->parsed() ? arr[0] : arr).dump(2) << "\n";
      return true;
    }
    auto limit = [](const json& q, const char* k) {
      return q.contains(k) && q[k].is_number() ? std::to_string(q[k].get<int64_t>())
                                               : std::string("-");
    };
    std::printf("%-20s %-12s %-16s %-16s %s\n", "TENANT", "SANDBOXES", "MEMORY_MB", "DISK_MB",
                "CREATES/MIN");
    for (const auto& j : arr) {
      const json& q = j["quota"];
      const json& u = j["usage"];
      auto pair = [&](const char* used, const char* k) {
        return std::to_string(u.value(used, int64_t{0})) + "/" + limit(q, k);
      };
      std::printf("%-20s %-12s %-16s %-16s %s\n", j.value("tenant", "").c_str(),
                  pair("sandboxes", "max_sandboxes").c_str(),
                  pair("memory_mb", "max_memory_mb").c_str(),
                  pair("disk_mb", "max_disk_mb").c_str(), limit(q, "creates_per_minute").c_str());
    }
    return true;
  }
  if (t.rm->parsed()) {
    connect().call("DELETE", "/v1/tokens/" + t.id);
    std::cout << t.id << "\n";
    return true;
  }
  return false;
}

}  // namespace airlock::cli

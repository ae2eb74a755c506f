#include "mcp/tool_defs.h"

#include "engine/api/limits.h"

namespace airlock::mcp {

using nlohmann::json;

namespace {

json str(const std::string& description) {
  return {{"type", "string"}, {"description", description}};
}

json string_map(const std::string& description) {
  return {{"type", "object"},
          {"description", description},
          {"additionalProperties", {{"type", "string"}}}};
}

namespace L = engine::limits;

// A number bounded as the API's limits table says (engine/api/limits.h).
json bounded(const char* type, L::Range r, const std::string& description = {}) {
  json j = {{"type", type}, {"minimum", r.min}, {"maximum", r.max}};
  if (!description.empty()) j["description"] = description;
  return j;
}

json sandbox_id() {
  return {{"type", "string"},
          {"description", "the sandbox's id, as sandbox_create or sandbox_list return it"},
          {"pattern", "^[A-Za-z0-9_-]{1,64}$"}};
}

json guest_path(const std::string& what) {
  return {{"type", "string"},
          {"description", what + " (an absolute path inside the sandbox)"},
          {"minLength", 1},
          {"maxLength", 4096}};
}

json object(json properties, json required = json::array()) {
  json j = {{"type", "object"}, {"properties", std::move(properties)}};
  if (!required.empty()) j["required"] = std::move(required);
  j["additionalProperties"] = false;
  return j;
}

// Output schemas say what structuredContent always has; extra fields from the
// daemon pass through (additionalProperties is left open).
json out(json properties, json required) {
  return {
      {"type", "object"}, {"properties", std::move(properties)}, {"required", std::move(required)}};
}

json network_policy() {
  json entries = {{"type", "array"},
                  {"maxItems", 1024},
                  {"items", {{"type", "string"}, {"minLength", 1}, {"maxLength", 255}}}};
  json allow = entries, deny = entries;
  allow["description"] = "allowed destinations: IPv4/IPv6 addresses or CIDRs, host names, *.domain";
  deny["description"] = "denied destinations (deny wins over allow)";
  return object({{"mode",
                  {{"type", "string"},
                   {"enum", {"none", "allowlist", "open"}},
                   {"description",
                    "none: no network interface; allowlist: only `allow`; open: all but `deny` "
                    "(private and host addresses are always denied)"}}},
                 {"allow", allow},
                 {"deny", deny}},
                {"mode"});
}

json annotations(bool read_only, bool destructive, bool idempotent) {
  return {{"readOnlyHint", read_only},
          {"destructiveHint", destructive},
          {"idempotentHint", idempotent},
          {"openWorldHint", false}};
}

// A table (one literal schema per tool, nothing else): long because the tool list is.
json build() {
  json sandbox = {{"type", "object"}, {"required", {"id", "state"}}};
  json tools = json::array();

  tools.push_back(
      {{"name", "sandbox_create"},
       {"title", "Create a sandbox"},
       {"description",
        "Boot a new disposable microVM sandbox and return its id. It is destroyed when this MCP "
        "session ends unless `keep` is true, and in any case after `timeout` seconds."},
       {"inputSchema",
        object({{"image", str("guest image: minimal (busybox) or debian; default minimal")},
                {"cpus", bounded("integer", L::kCpus)},
                {"memory_mb", bounded("integer", L::kMemoryMb)},
                {"disk_mb", bounded("integer", L::kDiskMb)},
                {"timeout", bounded("integer", L::kTimeoutS,
                                    "seconds of life before the host destroys it (default 600)")},
                {"idle_timeout", bounded("integer", L::kIdleTimeoutS,
                                         "destroy it after this many idle seconds (0 = never)")},
                {"env", string_map("default environment of every command")},
                {"metadata", string_map("free-form labels (sandbox_list filters on them)")},
                {"network", network_policy()},
                {"keep",
                 {{"type", "boolean"},
                  {"default", false},
                  {"description", "keep the sandbox after this MCP session ends"}}}})},
       {"outputSchema", out({{"id", {{"type", "string"}}},
                             {"state", {{"type", "string"}}},
                             {"image", {{"type", "string"}}},
                             {"keep", {{"type", "boolean"}}}},
                            {"id", "state", "keep"})},
       {"annotations", annotations(false, false, false)}});

  tools.push_back(
      {{"name", "sandbox_exec"},
       {"title", "Run a command in a sandbox"},
       {"description",
        "Run a command in a sandbox and wait for it. Give `argv` (exact arguments) or `command` "
        "(a shell string run with /bin/sh -c), not both. Returns the exit code, why it ended, "
        "stdout and stderr (UTF-8, invalid bytes replaced) and whether output was truncated."},
       {"inputSchema",
        object(
            {{"sandbox_id", sandbox_id()},
             {"argv",
              {{"type", "array"},
               {"minItems", 1},
               {"items", {{"type", "string"}}},
               {"description", "program and arguments, e.g. [\"ls\", \"-l\", \"/\"]"}}},
             {"command", str("shell command line, run with /bin/sh -c")},
             {"cwd", str("working directory (default /)")},
             {"env", string_map("extra environment variables")},
             {"user", str("user name or numeric uid (default root)")},
             {"stdin", str("text fed to the command's stdin, then EOF")},
             {"timeout", bounded("number", L::kExecTimeoutS,
                                 "seconds before the command is killed (default 300; 0 = none)")},
             {"max_output_bytes",
              {{"type", "integer"},
               {"minimum", 0},
               {"maximum", kMaxOutputBytes},
               {"description",
                "bytes kept per stream (default 262144); the rest is dropped "
                "and counted"}}}},
            {"sandbox_id"})},
       {"outputSchema",
        out({{"exit_code", {{"type", {"integer", "null"}}}},
             {"signal", {{"type", {"integer", "null"}}}},
             {"reason", {{"type", "string"}}},
             {"timed_out", {{"type", "boolean"}}},
             {"duration_ms", {{"type", "integer"}}},
             {"stdout", {{"type", "string"}}},
             {"stderr", {{"type", "string"}}},
             {"stdout_truncated", {{"type", "boolean"}}},
             {"stderr_truncated", {{"type", "boolean"}}},
             {"stdout_dropped", {{"type", "integer"}}},
             {"stderr_dropped", {{"type", "integer"}}}},
            {"exit_code", "reason", "stdout", "stderr", "stdout_truncated", "stderr_truncated"})},
       {"annotations", annotations(false, true, false)}});

  tools.push_back(
      {{"name", "sandbox_write_file"},
       {"title", "Write a file in a sandbox"},
       {"description", "Create or replace a file in a sandbox (its directory must exist)."},
       {"inputSchema",
        object(
            {{"sandbox_id", sandbox_id()},
             {"path", guest_path("the file")},
             {"content", str("the file's content (text, or base64 with encoding base64)")},
             {"encoding", {{"type", "string"}, {"enum", {"utf8", "base64"}}, {"default", "utf8"}}},
             {"mode",
              {{"type", "string"},
               {"pattern", "^[0-7]{3,4}$"},
               {"default", "0644"},
               {"description", "octal permission bits"}}}},
            {"sandbox_id", "path", "content"})},
       {"outputSchema",
        out({{"path", {{"type", "string"}}}, {"bytes", {{"type", "integer"}}}}, {"path", "bytes"})},
       {"annotations", annotations(false, true, true)}});

  tools.push_back(
      {{"name", "sandbox_read_file"},
       {"title", "Read a file from a sandbox"},
       {"description",
        "Read a file from a sandbox. Text comes back as is; content that is not valid UTF-8 "
        "(or with encoding base64) comes back base64-encoded. At most max_bytes are returned."},
       {"inputSchema",
        object(
            {{"sandbox_id", sandbox_id()},
             {"path", guest_path("the file")},
             {"encoding", {{"type", "string"}, {"enum", {"utf8", "base64"}}, {"default", "utf8"}}},
             {"max_bytes",
              {{"type", "integer"},
               {"minimum", 0},
               {"maximum", kMaxReadBytes},
               {"description", "bytes returned at most (default 1048576)"}}}},
            {"sandbox_id", "path"})},
       {"outputSchema", out({{"path", {{"type", "string"}}},
                             {"content", {{"type", "string"}}},
                             {"encoding", {{"type", "string"}, {"enum", {"utf8", "base64"}}}},
                             {"bytes", {{"type", "integer"}}},
                             {"truncated", {{"type", "boolean"}}}},
                            {"path", "content", "encoding", "bytes", "truncated"})},
       {"annotations", annotations(true, false, true)}});

  tools.push_back(
      {{"name", "sandbox_list_files"},
       {"title", "List a directory in a sandbox"},
       {"description", "The entries of a directory in a sandbox (name, type, size, mode, mtime)."},
       {"inputSchema", object({{"sandbox_id", sandbox_id()}, {"path", guest_path("the directory")}},
                              {"sandbox_id", "path"})},
       {"outputSchema", out({{"path", {{"type", "string"}}}, {"entries", {{"type", "array"}}}},
                            {"path", "entries"})},
       {"annotations", annotations(true, false, true)}});

  json net_in = network_policy();
  net_in["properties"]["sandbox_id"] = sandbox_id();
  net_in["required"] = {"sandbox_id", "mode"};
  tools.push_back(
      {{"name", "sandbox_set_network"},
       {"title", "Change a sandbox's network policy"},
       {"description",
        "Replace a running sandbox's egress policy. Flows the new policy denies are cut."},
       {"inputSchema", net_in},
       {"outputSchema",
        out({{"policy", {{"type", "object"}}}, {"flows_cut", {{"type", "integer"}}}}, {"policy"})},
       {"annotations", annotations(false, true, true)}});

  tools.push_back(
      {{"name", "sandbox_logs"},
       {"title", "A sandbox's audit journal"},
       {"description",
        "The most recent records of a sandbox's audit journal (creates, execs, file writes, "
        "network decisions); with network true only its network events."},
       {"inputSchema",
        object({{"sandbox_id", sandbox_id()},
                {"network", {{"type", "boolean"}, {"default", false}}},
                {"limit",
                 {{"type", "integer"},
                  {"minimum", 1},
                  {"maximum", 100000},
                  {"description", "most recent records returned at most (default 200)"}}}},
               {"sandbox_id"})},
       {"outputSchema", out({{"records", {{"type", "array"}, {"items", {{"type", "object"}}}}},
                             {"total", {{"type", "integer"}}}},
                            {"records", "total"})},
       {"annotations", annotations(true, false, true)}});

  tools.push_back(
      {{"name", "sandbox_destroy"},
       {"title", "Destroy a sandbox"},
       {"description", "Stop a sandbox's VM and remove everything of it but its audit journal."},
       {"inputSchema", object({{"sandbox_id", sandbox_id()}}, {"sandbox_id"})},
       {"outputSchema", out({{"id", {{"type", "string"}}}, {"destroyed", {{"type", "boolean"}}}},
                            {"id", "destroyed"})},
       {"annotations", annotations(false, true, true)}});

  tools.push_back(
      {{"name", "sandbox_list"},
       {"title", "List sandboxes"},
       {"description", "The daemon's sandboxes, optionally only those whose metadata matches."},
       {"inputSchema", object({{"metadata", string_map("only sandboxes with all these labels")},
                               {"all",
                                {{"type", "boolean"},
                                 {"default", false},
                                 {"description", "also deleted, failed and timed-out ones"}}}})},
       {"outputSchema",
        out({{"sandboxes", {{"type", "array"}, {"items", sandbox}}}}, {"sandboxes"})},
       {"annotations", annotations(true, false, true)}});
  return tools;
}

}  // namespace

const json& tool_definitions() {
  static const json tools = build();
  return tools;
}

const json* find_tool(const std::string& name) {
  for (const auto& t : tool_definitions())
    if (t["name"] == name) return &t;
  return nullptr;
}

}  // namespace airlock::mcp

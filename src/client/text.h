// What the CLI and the MCP server both say about airlockd's answers: query
// values percent-encoded for a request path, byte counts and journal
// records as text. Free of I/O, unit-tested in text_test.cc.
//
//   c.call("GET", "/v1/sandboxes/" + id + "/files/list?path=" + url_encode(p));
//   std::cout << format_net_event(record);
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace airlock::client {

// Percent-encodes a query value.
std::string url_encode(const std::string& text);

// "12.3 MiB" style size.
std::string human_bytes(uint64_t bytes);

// `airlock logs` line: "<ts> <event> key=value ..." (argv shown as a shell-ish list).
std::string format_audit_line(const nlohmann::json& record);
// `airlock logs ID --network` line for one net_* event, e.g.
//   "<ts> tcp 203.0.113.7:443 api.example.com allow *.example.com (pinned) allowed"
//   "<ts> tcp 203.0.113.7:443 api.example.com ... closed fin out=1.2 KiB in=3.0 KiB 120ms"
//   "<ts> dns api.example.com A allow *.example.com allowed answers=203.0.113.7"
// (IPv6 destinations as [addr]:port, "-" for an empty name).
std::string format_net_event(const nlohmann::json& event);

}  // namespace airlock::client

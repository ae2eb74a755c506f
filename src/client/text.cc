#include "client/text.h"

#include <cstdio>

namespace airlock::client {

namespace {
std::string str(const nlohmann::json& j, const char* key) {
  if (!j.contains(key)) return "-";
  const auto& v = j[key];
  return v.is_string() ? v.get<std::string>() : v.dump();
}
}  // namespace

std::string url_encode(const std::string& text) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || c == '/') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

std::string human_bytes(uint64_t bytes) {
  char buf[32];
  if (bytes < 1024) {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  } else if (bytes < (1ull << 20)) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", bytes / 1024.0);
  } else if (bytes < (1ull << 30)) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / 1048576.0);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / 1073741824.0);
  }
  return buf;
}

std::string format_audit_line(const nlohmann::json& rec) {
  std::string line = str(rec, "ts") + " " + str(rec, "event");
  for (const auto& [k, v] : rec.items()) {
    if (k == "ts" || k == "event" || k == "sandbox") continue;
    std::string value;
    if (v.is_string()) {
      value = v.get<std::string>();
      if (value.find_first_of(" \t\n\"") != std::string::npos || value.empty()) value = v.dump();
    } else {
      value = v.dump();
    }
    line += " " + k + "=" + value;
  }
  return line;
}

std::string format_net_event(const nlohmann::json& e) {
  std::string type = e.value("event", "");
  std::string line = str(e, "ts") + " ";
  auto verdict = [&] { return e.value("allowed", false) ? "allowed" : "denied"; };
  auto text = [&](const char* key) {
    std::string v = e.contains(key) && e[key].is_string() ? e[key].get<std::string>() : "";
    return v.empty() ? std::string("-") : v;
  };
  if (type == "net_flow" || type == "net_flow_end") {
    std::string dst = text("dst");
    if (dst.find(':') != std::string::npos) dst = "[" + dst + "]";
    std::string where = e.contains("port") ? dst + ":" + str(e, "port") : dst;
    line += text("proto") + " " + where + " " + text("name") + " " + text("rule") + " " + verdict();
    if (type == "net_flow_end") {
      line += " closed " + text("reason");
      line += " out=" + human_bytes(e.value("bytes_out", uint64_t(0)));
      line += " in=" + human_bytes(e.value("bytes_in", uint64_t(0)));
      line += " " + std::to_string(e.value("duration_ms", int64_t(0))) + "ms";
    }
  } else if (type == "net_dns") {
    line += "dns " + text("name") + " " + text("qtype") + " " + text("rule") + " " + verdict();
    if (e.contains("rcode")) line += " rcode=" + str(e, "rcode");
    std::string answers;
    if (e.contains("answers") && e["answers"].is_array())
      for (const auto& a : e["answers"])
        answers += (answers.empty() ? "" : ",") + (a.is_string() ? a.get<std::string>() : a.dump());
    if (!answers.empty()) line += " answers=" + answers;
    if (e.contains("dropped") && e["dropped"].is_array() && !e["dropped"].empty())
      line += " dropped=" + e["dropped"].dump();
  } else if (type == "net_policy") {
    line += "policy " + (e.contains("policy") ? e["policy"].dump() : std::string("-"));
  } else if (type == "net_suppressed") {
    line += "suppressed " + str(e, "count") + " events (rate limit)";
  } else {
    return format_audit_line(e);
  }
  return line;
}

}  // namespace airlock::client

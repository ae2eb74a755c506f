#include "cli/journal_cmd.h"

#include <iostream>
#include <sstream>

#include "cli/args.h"

namespace airlock::cli {

using nlohmann::json;

void add_journal_commands(CLI::App& app, JournalCommands& j) {
  j.diff = app.add_subcommand(
      "diff",
      "files added, modified and deleted in a sandbox since it started or since a snapshot (read "
      "from its disk)");
  j.diff->add_option("id", j.id)->required();
  j.diff->add_option("--since", j.since, "start (default) or a snapshot's name");
  j.diff->add_flag("--content", j.content, "unified diffs of text files (size-capped)");
  j.diff->add_flag("--json", j.json, "print JSON");
}

int run_journal_command(const JournalCommands& j, const std::function<client::Client()>& connect) {
  if (!j.diff->parsed()) return -1;
  json r = connect().call("GET", "/v1/sandboxes/" + j.id +
                                     "/changes?since=" + client::url_encode(j.since) +
                                     (j.content ? "&content=true" : ""));
  std::cout << (j.json ? r.dump(2) + "\n" : format_changes(r));
  return 0;
}

int verify_journal(client::Client& c, const std::string& id, bool as_json) {
  json r = c.call("GET", "/v1/sandboxes/" + id + "/journal/verify");
  std::cout << (as_json ? r.dump(2) + "\n" : format_verify(r));
  return r.value("ok", false) ? 0 : 1;
}

std::string format_verify(const json& r) {
  std::ostringstream o;
  uint64_t head = r.contains("head") ? r["head"].value("seq", uint64_t{0}) : 0;
  if (r.value("ok", false)) {
    o << "ok: " << r.value("records", uint64_t{0}) << " records, chain intact to seq " << head;
    if (r["anchor"].is_object())
      o << ", anchored at seq " << r["anchor"].value("seq", uint64_t{0})
        << (r.value("signature_ok", false) ? " (signature ok)" : "");
    o << "\n";
  } else {
    o << "BROKEN: " << r["breaks"].size() << " broken link(s)\n";
    for (const auto& b : r["breaks"]) {
      o << "  ";
      if (b.value("line", uint64_t{0}) > 0) o << "line " << b.value("line", uint64_t{0}) << ": ";
      o << b.value("kind", "") << ": " << b.value("message", "") << "\n";
    }
  }
  if (r.value("unanchored", uint64_t{0}) > 0)
    o << "note: " << r.value("unanchored", uint64_t{0})
      << " record(s) after the anchored head (written just before a daemon stopped)\n";
  if (r.value("legacy_records", uint64_t{0}) > 0)
    o << "note: " << r.value("legacy_records", uint64_t{0})
      << " record(s) from before the chain existed are not covered\n";
  return o.str();
}

std::string format_changes(const json& r) {
  std::ostringstream o;
  for (const auto& c : r.value("changes", json::array())) {
    std::string ch = c.value("change", "");
    char mark = ch == "added" ? 'A' : ch == "deleted" ? 'D' : 'M';
    o << mark << " " << c.value("type", "") << " " << c.value("mode", "") << " "
      << c.value("size", uint64_t{0}) << " " << c.value("path", "");
    if (c.contains("target")) o << " -> " << c["target"].get<std::string>();
    if (c.contains("what")) {
      o << " (";
      bool first = true;
      for (const auto& w : c["what"])
        o << (first ? "" : ",") << w.get<std::string>(), first = false;
      o << ")";
    }
    if (c.value("binary", false)) o << " [binary]";
    o << "\n";
    if (c.contains("diff")) o << c["diff"].get<std::string>();
  }
  if (r.value("truncated", false)) o << "(truncated: more changes than reported)\n";
  return o.str();
}

}  // namespace airlock::cli

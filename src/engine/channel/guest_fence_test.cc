// The guest's wire format stays in channel/: no host source outside it (the
// engine, the daemon, E2B, MCP) builds a guest request or holds a guest
// reply. The check is on the calls that do either — GuestChannel's JSON
// face (call, exec, attach, watch, job_stdin, post, and hello's reply) —
// rather than on field names: the API and the journal rightly use many of
// the same names ("exec_id", "reason", "path"), so a list of banned strings
// would flag them or miss the guest's. Without such a call no file has a
// guest JSON object to read a field of; the guest client's structs are the
// only way in.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace airlock::channel {
namespace {

// "file:line: text" for every line of `text` that uses the channel's JSON
// face. A receiver named *channel*, ch or chan is a GuestChannel by the
// code's own naming; the method names call, attach, watch, job_stdin and
// post are the channel's alone in the host, whatever the receiver.
std::vector<std::string> json_face_uses(const std::string& file, const std::string& text) {
  static const std::regex any_receiver(R"((->|\.)\s*(call|attach|watch|job_stdin|post)\s*\()");
  static const std::regex channel_exec(
      R"(\b(\w*channel\w*|ch|chan)\s*(->|\.)\s*(exec|hello)\s*\()");
  static const std::regex detail(R"(#\s*include\s*"engine/channel/guest_channel_detail\.h")");
  // hello() is called for its effect; its reply (the guest's version and
  // kernel) is not read: the call is a statement of its own.
  static const std::regex hello_statement(R"(^\s*[\w.\->*]*\s*(->|\.)\s*hello\s*\()");
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line, previous;
  for (int n = 1; std::getline(in, line); ++n) {
    std::string code = line.substr(0, line.find("//"));
    std::smatch m;
    bool bad = std::regex_search(code, any_receiver) || std::regex_search(code, detail);
    if (std::regex_search(code, m, channel_exec)) {
      bool continued = std::regex_search(previous, std::regex(R"((=|\(|,|return)\s*$)"));
      bad = bad || m[3] == "exec" || !std::regex_search(code, hello_statement) || continued;
    }
    if (bad) out.push_back(file + ":" + std::to_string(n) + ": " + line);
    if (code.find_first_not_of(" \t") != std::string::npos) previous = code;
  }
  return out;
}

TEST(GuestFence, TheCheckSeesEachWayIn) {
  for (const char* bad : {
           "  r = sb->channel->call({{\"op\", \"sync\"}}, d);",
           "  auto r = ch.exec(ch.open_stream(), {{\"argv\", argv}}, nullptr, h);",
           "  nlohmann::json r = sbp->channel->attach(id, 0, h, d);",
           "  x = guest.watch(path, true, h, d);",
           "  r = sb.channel->job_stdin(id, src, true, d);",
           "  ch->post({{\"op\", \"set_time\"}});",
           "  auto reply = sb->channel->hello(hello, deadline);",
           "#include \"engine/channel/guest_channel_detail.h\"",
       })
    EXPECT_EQ(json_face_uses("f.cc", bad).size(), 1u) << bad;
  EXPECT_EQ(json_face_uses("f.cc", "  auto reply =\n      ch->hello(hello, deadline);").size(), 1u);
  for (const char* fine : {
           "  sb->channel->hello(hello, deadline);",
           "      ch->hello({.hostname = id, .resync = true}, deadline);",
           "  channel::sync(*sb->channel, deadline);",
           "  ExecResult r = engine.exec(id, req, cb);",
           "  auto r = confine::run(scratch.exec({\"qemu-img\"}, \"qemu-img\", lim));",
           "  sb->channel->send_input(stream, bytes);  // not ch->call(",
           "  hello.network = hello_network(info.id);",
       })
    EXPECT_TRUE(json_face_uses("f.cc", fine).empty()) << fine;
}

#ifdef AIRLOCK_SOURCE_DIR
namespace fs = std::filesystem;

// The C++ sources under `dir` but not under `except` (if given), with their text.
std::vector<std::pair<fs::path, std::string>> sources(const fs::path& dir, const fs::path& except) {
  std::vector<std::pair<fs::path, std::string>> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const fs::path& p = e.path();
    if (!e.is_regular_file() || (p.extension() != ".cc" && p.extension() != ".h")) continue;
    if (!except.empty() &&
        std::mismatch(except.begin(), except.end(), p.begin(), p.end()).first == except.end())
      continue;
    std::ifstream f(p);
    std::stringstream text;
    text << f.rdbuf();
    out.emplace_back(p, text.str());
  }
  return out;
}

std::string listed(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += "\n  " + l;
  return s;
}

TEST(GuestFence, NoEngineSourceOutsideTheChannelSpeaksTheGuestsJson) {
  const fs::path src = fs::path(AIRLOCK_SOURCE_DIR) / "src";
  std::vector<std::string> uses;
  bool saw_exec_service = false;  // exec/service.cc: the busiest user of the client
  auto files = sources(src / "engine", src / "engine" / "channel");
  for (const auto& [p, text] : files) {
    for (auto& u : json_face_uses(fs::relative(p, src).string(), text)) uses.push_back(u);
    saw_exec_service = saw_exec_service || p.filename() == "service.cc";
  }
  EXPECT_GT(files.size(), 100u);  // the tree was found, not an empty directory
  EXPECT_TRUE(saw_exec_service);
  EXPECT_TRUE(uses.empty()) << "guest JSON outside src/engine/channel/ (use guest_client.h):"
                            << listed(uses);
}

// Beyond the engine (daemon, E2B, MCP, CLI, auth) nothing reaches the
// channel at all; the guest agent and the codec it shares are the other
// end of the wire.
TEST(GuestFence, NothingBeyondTheEngineIncludesTheChannel) {
  const fs::path src = fs::path(AIRLOCK_SOURCE_DIR) / "src";
  static const std::regex include(R"(#\s*include\s*"engine/channel/)");
  std::vector<std::string> found;
  size_t scanned = 0;
  for (const auto& dir : fs::directory_iterator(src)) {
    std::string name = dir.path().filename();
    if (!dir.is_directory() || name == "engine" || name == "guest" || name == "protocol") continue;
    for (const auto& [p, text] : sources(dir.path(), {})) {
      ++scanned;
      if (std::regex_search(text, include)) found.push_back(fs::relative(p, src).string());
    }
  }
  EXPECT_GT(scanned, 50u);
  EXPECT_TRUE(found.empty()) << "includes engine/channel/:" << listed(found);
}
#endif

}  // namespace
}  // namespace airlock::channel

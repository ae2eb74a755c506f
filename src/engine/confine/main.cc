// airlock-confine: runs one parser of guest-written bytes confined (see
// confine.h). Started only by the daemon (confine::run), with one JSON
// argument:
//
//   airlock-confine '{"mode":"exec","what":"qemu-img","argv":["qemu-img",...],
//                     "fds":2,"uid":2100000007,"gid":2100000007,"limits":{...}}'
//
// mode "walk": the ext4 diff walker on descriptors 3 and 4, its JSON result
// on stdout. mode "exec": argv[0] (from PATH) executed under the filters.
#include <sys/stat.h>
#include <unistd.h>

#include <iostream>
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/confine/lockdown.h"
#include "engine/fsdiff/fsdiff.h"

namespace {

using airlock::Errc;
using airlock::Error;
namespace confine = airlock::engine::confine;

std::string find_in_path(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  for (const char* dir : {"/usr/sbin", "/usr/bin", "/sbin", "/bin"}) {
    std::string p = std::string(dir) + "/" + name;
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  throw Error(Errc::not_found, name + " not found in PATH");
}

void write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

int walk(const nlohmann::json& spec) {
  std::string out;
  try {
    auto opt = airlock::engine::fsdiff::options_from_json(spec.at("args"));
    confine::seal_walker();
    out = airlock::engine::fsdiff::walk_fds(3, 4, opt).dump(
        -1, ' ', false, nlohmann::json::error_handler_t::replace);
  } catch (const Error& e) {
    out = nlohmann::json{{"error",
                          {{"code", std::string(to_string(e.code()))}, {"message", e.what()}}}}
              .dump();
  }
  write_all(1, out);
  return 0;
}

int exec(const nlohmann::json& spec) {
  auto args = spec.at("argv").get<std::vector<std::string>>();
  if (args.empty()) throw Error(Errc::invalid_argument, "exec needs an argv", "argv");
  std::string path = find_in_path(args[0]);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  char path_env[] = "PATH=/usr/sbin:/usr/bin:/sbin:/bin";
  char lang_env[] = "LC_ALL=C";
  char* envp[] = {path_env, lang_env, nullptr};
  confine::seal_tool(path.c_str());
  ::execve(path.c_str(), argv.data(), envp);
  throw airlock::Error(Errc::unavailable, "cannot execute " + path + ": " + strerror(errno));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "airlock-confine: started by airlockd only, with one JSON argument\n";
    return 2;
  }
  try {
    auto spec = nlohmann::json::parse(argv[1]);
    // Only the descriptors the daemon named: anything else (a leak from an
    // unusual launcher) is closed before the first hostile byte.
    ::close_range(3 + spec.at("fds").get<unsigned>(), ~0U, 0);
    confine::set_limits(spec.at("limits"));
    confine::drop_identity(spec.at("uid").get<int64_t>(), spec.at("gid").get<int64_t>());
    ::umask(077);
    std::string mode = spec.at("mode").get<std::string>();
    if (mode == "walk") return walk(spec);
    if (mode == "exec") return exec(spec);
    throw Error(Errc::invalid_argument, "unknown mode '" + mode + "'", "mode");
  } catch (const std::exception& e) {
    std::cerr << "airlock-confine: " << e.what() << "\n";
    return 125;
  }
}

// airlock-confine: runs one parser of guest-written bytes confined (see
// confine.h). Started only by the daemon (confine::run), with one JSON
// argument:
//
//   airlock-confine '{"mode":"exec","what":"qemu-img","argv":["qemu-img",...],
//                     "fds":2,"uid":2100000007,"gid":2100000007,"limits":{...}}'
//
// mode "walk": the ext4 diff walker on descriptors 3 and 4, its JSON result
// on stdout. mode "exec": argv[0] (from PATH) executed under the filters.
// mode "import": an image archive (3) unpacked into a directory (4), see
// storage::import_oci.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <iostream>
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/confine/lockdown.h"
#include "engine/fsdiff/fsdiff.h"
#include "engine/storage/oci_import.h"

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

// An image archive on 3, its scratch directory on 4: unpacks it into
// 4/root writing contents only, leaves 4/manifest (what root applies), and
// prints the ImportResult's summary.
int import(const nlohmann::json& spec) {
  namespace storage = airlock::storage;
  std::string out;
  try {
    const auto& a = spec.at("args");
    storage::ImportPolicy p;
    p.keep_owners = a.at("keep_owners").get<bool>();
    p.max_bytes = a.at("max_bytes").get<uint64_t>();
    p.max_entries = a.at("max_entries").get<uint64_t>();
    p.max_archive_entries = a.at("max_archive_entries").get<uint64_t>();
    p.max_ratio = a.at("max_ratio").get<uint64_t>();
    p.min_layer_budget = a.at("min_layer_budget").get<uint64_t>();
    p.defer = true;
    p.keep_devices = false;  // it could not make one; the daemon never asks
    confine::restrict_paths(4, 3);
    confine::seal_importer();
    auto r = storage::unpack_oci("/proc/self/fd/3", "/proc/self/fd/4/root", "/proc/self/fd/4", p);
    int mf = ::openat(4, "manifest", O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (mf < 0) airlock::throw_errno("create the manifest");
    storage::write_manifest(r.manifest, mf);
    ::close(mf);
    out = nlohmann::json{{"config", storage::to_json(r.config)},
                         {"source", r.source},
                         {"layers", r.layers},
                         {"bytes", r.bytes},
                         {"entries", r.entries},
                         {"dropped", r.dropped}}
              .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  } catch (const Error& e) {
    out = nlohmann::json{{"error",
                          {{"code", std::string(to_string(e.code()))}, {"message", e.what()}}}}
              .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  } catch (const std::exception& e) {
    out = nlohmann::json{{"error", {{"code", "internal"}, {"message", e.what()}}}}.dump(
        -1, ' ', false, nlohmann::json::error_handler_t::replace);
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
    if (mode == "import") return import(spec);
    throw Error(Errc::invalid_argument, "unknown mode '" + mode + "'", "mode");
  } catch (const std::exception& e) {
    std::cerr << "airlock-confine: " << e.what() << "\n";
    return 125;
  }
}

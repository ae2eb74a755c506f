#include "recipes/plan.h"

#include <sys/stat.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "common/error.h"
#include "engine/storage/digest.h"

namespace airlock::recipes {
namespace fs = std::filesystem;

std::string sh_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  return out + "'";
}

namespace {

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

std::string env_exports(const Recipe& r) {
  std::string out;
  for (const auto& [k, v] : r.env) out += "export " + k + "=" + sh_quote(v) + "; ";
  return out;
}

// The files of `files` under `src` ("." = all), with their guest paths.
std::vector<CopyFile> select(const CopySpec& c, size_t index, const Files& files) {
  std::vector<CopyFile> out;
  for (const auto& f : files) {
    std::string rest;
    if (c.src == ".") {
      rest = f.path;
    } else if (f.path == c.src) {
      rest = "";
    } else if (f.path.size() > c.src.size() && f.path.compare(0, c.src.size(), c.src) == 0 &&
               f.path[c.src.size()] == '/') {
      rest = f.path.substr(c.src.size() + 1);
    } else {
      continue;
    }
    std::string guest;
    if (rest.empty()) {  // src is this one file
      guest = c.dest.back() == '/' ? c.dest + fs::path(f.path).filename().string() : c.dest;
    } else {
      guest = c.dest.back() == '/' ? c.dest + rest : c.dest + "/" + rest;
    }
    out.push_back({&f, guest, c.mode ? *c.mode : (f.mode & 07777)});
  }
  if (out.empty()) {
    std::string field = "copy[" + std::to_string(index) + "].src";
    throw Error(Errc::invalid_argument,
                field + " '" + c.src + "' matched no file sent with the recipe", field);
  }
  return out;
}

}  // namespace

std::vector<Step> plan_steps(const Recipe& r, const std::string& base_key, const Files& files) {
  std::vector<Step> steps;
  if (!r.apt_packages.empty()) {
    Step s{"apt", "apt-get install " + join(r.apt_packages, " "), "", {}, 1800, ""};
    // The recipe's sources are used for this step only (the image keeps its
    // own sources.list); the lists are removed afterwards so the layer holds
    // only what was installed.
    std::string opts;
    if (!r.apt_sources.empty()) {
      std::string list;
      for (const auto& src : r.apt_sources) list += src + "\n";
      s.script += "printf '%s' " + sh_quote(list) + " > /tmp/airlock-recipe.list; ";
      opts =
          " -o Dir::Etc::SourceList=/tmp/airlock-recipe.list -o Dir::Etc::SourceParts=/nonexistent";
    }
    std::string pkgs;
    for (const auto& p : r.apt_packages) pkgs += " " + sh_quote(p);
    s.script += "set -e; export DEBIAN_FRONTEND=noninteractive; apt-get" + opts +
                " update -q 2>&1; apt-get" + opts + " install -y -q --no-install-recommends" +
                pkgs + " 2>&1; apt-get clean; rm -rf /var/lib/apt/lists/* /tmp/airlock-recipe.list";
    steps.push_back(s);
  }
  if (!r.pip_packages.empty()) {
    Step s{"pip", "pip install " + join(r.pip_packages, " "), "", {}, 1800, ""};
    std::string args = " --no-cache-dir --break-system-packages --no-input";
    if (!r.pip_index_url.empty()) args += " --index-url " + sh_quote(r.pip_index_url);
    if (r.pip_trusted_host) args += " --trusted-host " + sh_quote(url_host(r.pip_index_url));
    for (const auto& p : r.pip_packages) args += " " + sh_quote(p);
    s.script = "set -e; cd /; python3 -m pip install" + args + " 2>&1";
    steps.push_back(s);
  }
  for (size_t i = 0; i < r.copies.size(); ++i) {
    const auto& c = r.copies[i];
    Step s{"copy", "copy " + c.src + " -> " + c.dest, "", select(c, i, files), 600, ""};
    if (!c.owner.empty())
      s.script = "set -e; chown -R " + sh_quote(c.owner) + ": " + sh_quote(c.dest);
    steps.push_back(s);
  }
  for (const auto& run : r.runs) {
    std::string title = run.cmd.substr(0, run.cmd.find('\n'));
    if (title.size() > 60) title = title.substr(0, 57) + "...";
    Step s{"run", "run " + title, "", {}, run.timeout_s, ""};
    s.script = env_exports(r) + "cd " + sh_quote(r.workdir.empty() ? "/" : r.workdir) +
               " 2>/dev/null || cd /; " + run.cmd;
    steps.push_back(s);
  }
  if (!r.workdir.empty() || !r.user.empty()) {
    Step s{"config", "workdir and user", "set -e; ", {}, 120, ""};
    if (!r.user.empty())
      s.script += "id -u " + sh_quote(r.user) + " >/dev/null 2>&1 || { echo \"user '" + r.user +
                  "' does not exist in the image (add it with a [[run]] step)\"; exit 1; }; ";
    if (!r.workdir.empty()) {
      s.script += "mkdir -p " + sh_quote(r.workdir) + "; ";
      if (!r.user.empty())
        s.script += "[ \"$(stat -c %u " + sh_quote(r.workdir) + ")\" != 0 ] || chown " +
                    sh_quote(r.user) + ": " + sh_quote(r.workdir) + "; ";
    }
    s.script += "true";
    steps.push_back(s);
  }
  std::string prev = base_key;
  for (auto& s : steps) {
    std::vector<std::string> parts{"airlock-recipe-step-v1", prev, s.kind, s.script,
                                   std::to_string(s.timeout_s)};
    for (const auto& f : s.files) {
      parts.push_back(f.guest_path);
      parts.push_back(std::to_string(f.mode));
      parts.push_back(storage::sha256_hex({f.file->data}));
    }
    s.key = storage::sha256_hex(parts);
    prev = s.key;
  }
  return steps;
}

std::string image_key(const Recipe& r, const std::string& base_key,
                      const std::vector<Step>& steps) {
  nlohmann::json config{
      {"env", r.env}, {"workdir", r.workdir}, {"user", r.user}, {"warmup", r.warmup}};
  return storage::sha256_hex(
      {"airlock-recipe-image-v1", steps.empty() ? base_key : steps.back().key, config.dump()});
}

namespace {

void read_one(const fs::path& real, const std::string& rel, Files& out, uint64_t& total,
              uint64_t max_bytes, const std::string& field) {
  std::ifstream in(real, std::ios::binary);
  if (!in) throw Error(Errc::invalid_argument, field + ": cannot read " + rel, field);
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  total += data.size();
  if (total > max_bytes)
    throw Error(Errc::invalid_argument,
                field + ": the copied files exceed " + std::to_string(max_bytes >> 20) + " MiB",
                field);
  struct stat st {};
  uint32_t mode = ::stat(real.c_str(), &st) == 0 ? (st.st_mode & 07777) : 0644;
  out.push_back({rel, mode, std::move(data)});
}

}  // namespace

Files collect_files(const fs::path& dir, const Recipe& recipe, uint64_t max_bytes) {
  Files out;
  std::set<std::string> seen;
  uint64_t total = 0;
  std::error_code ec;
  fs::path root = fs::canonical(dir, ec);
  if (ec)
    throw Error(Errc::invalid_argument, "cannot open recipe directory " + dir.string(), "file");
  auto inside = [&](const fs::path& real) {
    auto rs = root.string(), s = real.string();
    return s == rs ||
           (s.size() > rs.size() && s.compare(0, rs.size(), rs) == 0 && s[rs.size()] == '/');
  };
  for (size_t i = 0; i < recipe.copies.size(); ++i) {
    const auto& c = recipe.copies[i];
    std::string field = "copy[" + std::to_string(i) + "].src";
    fs::path p = c.src == "." ? root : root / c.src;
    fs::path real = fs::canonical(p, ec);
    if (ec) throw Error(Errc::invalid_argument, field + " '" + c.src + "' does not exist", field);
    if (!inside(real))
      throw Error(Errc::invalid_argument,
                  field + " '" + c.src + "' leaves the recipe's directory (it resolves to " +
                      real.string() + ")",
                  field);
    auto add = [&](const fs::path& file_real, const std::string& rel) {
      if (!inside(file_real))
        throw Error(Errc::invalid_argument,
                    field + ": '" + rel + "' is a symlink out of the recipe's directory", field);
      if (!fs::is_regular_file(file_real))
        throw Error(Errc::invalid_argument,
                    field + ": '" + rel + "' is not a regular file or directory", field);
      if (seen.insert(rel).second) read_one(file_real, rel, out, total, max_bytes, field);
    };
    if (fs::is_directory(real)) {
      for (auto it = fs::recursive_directory_iterator(p); it != fs::recursive_directory_iterator();
           ++it) {
        fs::path lexical = it->path();
        std::string rel = fs::relative(lexical, root).lexically_normal().string();
        fs::path fr = fs::canonical(lexical, ec);
        if (ec || !inside(fr))
          throw Error(Errc::invalid_argument,
                      field + ": '" + rel + "' is a symlink out of the recipe's directory", field);
        if (it->is_symlink()) it.disable_recursion_pending();  // never walk a linked directory
        if (fs::is_directory(fr)) continue;
        add(fr, rel);
      }
    } else {
      add(real, c.src);
    }
  }
  return out;
}

}  // namespace airlock::recipes

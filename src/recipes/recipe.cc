#include "recipes/recipe.h"

#include <toml++/toml.h>

#include <functional>
#include <set>
#include <sstream>

#include "common/error.h"

namespace airlock::recipes {
namespace {

// Reads one recipe; every error names the source, the line and the key.
class Reader {
 public:
  Reader(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(int line, const std::string& field, const std::string& what) const {
    std::string where = source_;
    if (line > 0) where += ":" + std::to_string(line);
    throw Error(Errc::invalid_argument, where + ": " + what, field);
  }

  static int line_of(const toml::node& n) { return static_cast<int>(n.source().begin.line); }

  // Every key of `t` must be in `known`; `prefix` is the table's dotted path.
  void only(const toml::table& t, const std::string& prefix,
            const std::set<std::string>& known) const {
    for (auto&& [k, v] : t) {
      if (known.count(std::string(k.str()))) continue;
      std::string path =
          prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
      std::string in = prefix.empty() ? "" : " in [" + prefix + "]";
      std::string list;
      for (const auto& s : known) list += (list.empty() ? "" : ", ") + s;
      fail(static_cast<int>(k.source().begin.line), path,
           "unknown key '" + std::string(k.str()) + "'" + in + " (known: " + list + ")");
    }
  }

  std::string str(const toml::node& n, const std::string& field) const {
    auto s = n.value<std::string>();
    if (!n.is_string() || !s) fail(line_of(n), field, field + " must be a string");
    return *s;
  }
  std::vector<std::string> strings(const toml::node& n, const std::string& field) const {
    const toml::array* a = n.as_array();
    if (!a) fail(line_of(n), field, field + " must be an array of strings");
    std::vector<std::string> out;
    size_t i = 0;
    for (const auto& e : *a) out.push_back(str(e, field + "[" + std::to_string(i++) + "]"));
    return out;
  }
  bool boolean(const toml::node& n, const std::string& field) const {
    if (!n.is_boolean()) fail(line_of(n), field, field + " must be true or false");
    return *n.value<bool>();
  }
  int integer(const toml::node& n, const std::string& field, int64_t lo, int64_t hi) const {
    if (!n.is_integer()) fail(line_of(n), field, field + " must be an integer");
    int64_t v = *n.value<int64_t>();
    if (v < lo || v > hi)
      fail(line_of(n), field,
           field + " must be between " + std::to_string(lo) + " and " + std::to_string(hi));
    return static_cast<int>(v);
  }
  const toml::table& table(const toml::node& n, const std::string& field) const {
    const toml::table* t = n.as_table();
    if (!t) fail(line_of(n), field, field + " must be a table ([" + field + "])");
    return *t;
  }

  const std::string& source() const { return source_; }

 private:
  std::string source_;
};

bool valid_arg_name(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) return false;
  return true;
}

bool valid_env_name(const std::string& s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

// POSIX-ish user name or numeric uid.
bool valid_user(const std::string& s) {
  if (s.empty() || s.size() > 32 || s[0] == '-') return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.'))
      return false;
  return true;
}

// An absolute guest path without "..", NUL or newlines.
void check_guest_path(const Reader& r, int line, const std::string& p, const std::string& field) {
  if (p.empty() || p[0] != '/') r.fail(line, field, field + " must be an absolute path");
  if (p.find('\0') != std::string::npos || p.find('\n') != std::string::npos)
    r.fail(line, field, field + " has a control character");
  std::stringstream ss(p);
  std::string part;
  while (std::getline(ss, part, '/'))
    if (part == "..") r.fail(line, field, field + " must not contain '..'");
}

}  // namespace

std::string normalize_relative(const std::string& path, const std::string& field) {
  if (path.empty()) throw Error(Errc::invalid_argument, field + " is empty", field);
  if (path[0] == '/')
    throw Error(Errc::invalid_argument,
                field + " '" + path + "' is absolute: paths are relative to the recipe's directory",
                field);
  if (path.find('\0') != std::string::npos || path.find('\n') != std::string::npos)
    throw Error(Errc::invalid_argument, field + " has a control character", field);
  std::vector<std::string> parts;
  std::stringstream ss(path);
  std::string part;
  while (std::getline(ss, part, '/')) {
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      if (parts.empty())
        throw Error(Errc::invalid_argument, field + " '" + path + "' leaves the recipe's directory",
                    field);
      parts.pop_back();
      continue;
    }
    parts.push_back(part);
  }
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : "/") + p;
  return out.empty() ? "." : out;
}

std::string url_host(const std::string& url) {
  auto scheme = url.find("://");
  if (scheme == std::string::npos) return "";
  std::string s = url.substr(0, scheme);
  if (s != "http" && s != "https") return "";
  std::string rest = url.substr(scheme + 3);
  rest = rest.substr(0, rest.find_first_of("/?#"));
  if (auto at = rest.rfind('@'); at != std::string::npos) rest = rest.substr(at + 1);
  if (!rest.empty() && rest[0] == '[') {  // [v6]:port
    auto close = rest.find(']');
    return close == std::string::npos ? "" : rest.substr(1, close - 1);
  }
  return rest.substr(0, rest.find(':'));
}

namespace {

// The steps of parse_recipe, each a part of the document, in the order the
// errors are found: [args] first (every other string may use them), then
// the top-level keys, [apt], [pip], [[copy]], [[run]], [build], [network].
class RecipeParser {
 public:
  RecipeParser(const std::string& text, const std::string& source_name) : r_(source_name) {
    try {
      doc_ = toml::parse(text, source_name);
    } catch (const toml::parse_error& e) {
      r_.fail(static_cast<int>(e.source().begin.line), "", std::string(e.description()));
    }
    r_.only(doc_, "",
            {"base", "workdir", "user", "warmup", "args", "env", "apt", "pip", "copy", "run",
             "network", "build"});
  }

  Recipe parse(const std::map<std::string, std::string>& arg_overrides) {
    parse_args(arg_overrides);
    parse_top_level();
    parse_apt();
    parse_pip();
    each_table("copy", [&](const toml::table& t, const std::string& field, int line) {
      parse_copy(t, field, line);
    });
    each_table("run", [&](const toml::table& t, const std::string& field, int line) {
      parse_run(t, field, line);
    });
    parse_build();
    parse_network();
    return rec_;
  }

 private:
  void parse_args(const std::map<std::string, std::string>& arg_overrides) {
    if (auto* n = doc_.get("args")) {
      for (auto&& [k, v] : r_.table(*n, "args")) {
        std::string name(k.str());
        std::string field = "args." + name;
        if (!valid_arg_name(name))
          r_.fail(static_cast<int>(k.source().begin.line), field,
                  "arg name '" + name + "' must be letters, digits, '_' or '-'");
        rec_.args[name] = r_.str(v, field);
      }
    }
    for (const auto& [k, v] : arg_overrides) {
      if (!rec_.args.count(k))
        throw Error(Errc::invalid_argument,
                    "--arg " + k + ": the recipe declares no such arg (declare it in [args])",
                    "args." + k);
      rec_.args[k] = v;
    }
  }

  // ${NAME} substitution; "$$" is a literal "$".
  std::string subst(const std::string& s, int line, const std::string& field) const {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] != '$' || i + 1 >= s.size() || (s[i + 1] != '{' && s[i + 1] != '$')) {
        out += s[i];
        continue;
      }
      if (s[i + 1] == '$') {
        out += '$';
        ++i;
        continue;
      }
      auto close = s.find('}', i + 2);
      if (close == std::string::npos) r_.fail(line, field, field + ": unterminated '${'");
      std::string name = s.substr(i + 2, close - i - 2);
      auto it = rec_.args.find(name);
      if (it == rec_.args.end())
        r_.fail(line, field, field + ": ${" + name + "} names no arg (declare it in [args])");
      out += it->second;
      i = close;
    }
    return out;
  }
  std::string sstr(const toml::node& n, const std::string& field) const {
    return subst(r_.str(n, field), Reader::line_of(n), field);
  }
  std::vector<std::string> sstrings(const toml::node& n, const std::string& field) const {
    auto v = r_.strings(n, field);
    for (auto& s : v) s = subst(s, Reader::line_of(n), field);
    return v;
  }

  // base, workdir, user, warmup, [env].
  void parse_top_level() {
    auto* base = doc_.get("base");
    if (!base) r_.fail(0, "base", "missing key 'base' (minimal, debian or another image's name)");
    rec_.base = sstr(*base, "base");
    if (rec_.base.empty()) r_.fail(Reader::line_of(*base), "base", "base is empty");

    if (auto* n = doc_.get("workdir")) {
      rec_.workdir = sstr(*n, "workdir");
      check_guest_path(r_, Reader::line_of(*n), rec_.workdir, "workdir");
    }
    if (auto* n = doc_.get("user")) {
      rec_.user = sstr(*n, "user");
      if (!valid_user(rec_.user))
        r_.fail(Reader::line_of(*n), "user", "user '" + rec_.user + "' is not a user name or uid");
    }
    if (auto* n = doc_.get("warmup")) {
      rec_.warmup = sstrings(*n, "warmup");
      for (size_t i = 0; i < rec_.warmup.size(); ++i)
        if (rec_.warmup[i].empty())
          r_.fail(Reader::line_of(*n), "warmup[" + std::to_string(i) + "]",
                  "warmup command is empty");
    }
    if (auto* n = doc_.get("env")) {
      for (auto&& [k, v] : r_.table(*n, "env")) {
        std::string name(k.str());
        std::string field = "env." + name;
        if (!valid_env_name(name))
          r_.fail(
              static_cast<int>(k.source().begin.line), field,
              "env name '" + name + "' must be letters, digits and '_', not starting with a digit");
        rec_.env[name] = sstr(v, field);
      }
    }
  }

  void parse_apt() {
    if (auto* n = doc_.get("apt")) {
      const auto& t = r_.table(*n, "apt");
      r_.only(t, "apt", {"sources", "packages"});
      if (auto* s = t.get("sources")) rec_.apt_sources = sstrings(*s, "apt.sources");
      if (auto* p = t.get("packages")) rec_.apt_packages = sstrings(*p, "apt.packages");
      for (size_t i = 0; i < rec_.apt_sources.size(); ++i)
        if (rec_.apt_sources[i].rfind("deb ", 0) != 0 ||
            rec_.apt_sources[i].find('\n') != std::string::npos)
          r_.fail(Reader::line_of(*t.get("sources")), "apt.sources[" + std::to_string(i) + "]",
                  "an apt source is one line starting with 'deb ': '" + rec_.apt_sources[i] + "'");
      for (size_t i = 0; i < rec_.apt_packages.size(); ++i) {
        const auto& p = rec_.apt_packages[i];
        bool ok = !p.empty() && p[0] != '-';
        for (char c : p)
          if (!(std::isalnum(static_cast<unsigned char>(c)) ||
                std::string_view("+-.:=~_").find(c) != std::string_view::npos))
            ok = false;
        if (!ok)
          r_.fail(Reader::line_of(*t.get("packages")), "apt.packages[" + std::to_string(i) + "]",
                  "'" + p + "' is not an apt package name (name, name=version)");
      }
      if (rec_.apt_packages.empty() && !rec_.apt_sources.empty())
        r_.fail(Reader::line_of(*n), "apt.packages", "[apt] has sources but no packages");
    }
  }

  void parse_pip() {
    if (auto* n = doc_.get("pip")) {
      const auto& t = r_.table(*n, "pip");
      r_.only(t, "pip", {"index_url", "trusted_host", "packages"});
      if (auto* s = t.get("index_url")) {
        rec_.pip_index_url = sstr(*s, "pip.index_url");
        if (url_host(rec_.pip_index_url).empty())
          r_.fail(Reader::line_of(*s), "pip.index_url",
                  "pip.index_url must be an http(s) URL with a host");
      }
      if (auto* s = t.get("trusted_host"))
        rec_.pip_trusted_host = r_.boolean(*s, "pip.trusted_host");
      if (auto* p = t.get("packages")) rec_.pip_packages = sstrings(*p, "pip.packages");
      for (size_t i = 0; i < rec_.pip_packages.size(); ++i) {
        const auto& p = rec_.pip_packages[i];
        bool ok = !p.empty() && p[0] != '-';
        for (char c : p)
          if (!(std::isalnum(static_cast<unsigned char>(c)) ||
                std::string_view("+-.=<>!~_[],").find(c) != std::string_view::npos))
            ok = false;
        if (!ok)
          r_.fail(Reader::line_of(*t.get("packages")), "pip.packages[" + std::to_string(i) + "]",
                  "'" + p + "' is not a pip requirement (name, name==version, name>=version)");
      }
      if (rec_.pip_packages.empty())
        r_.fail(Reader::line_of(*n), "pip.packages", "[pip] has no packages");
    }
  }

  // [[copy]] and [[run]]: arrays of tables.
  void each_table(const char* key,
                  const std::function<void(const toml::table&, const std::string&, int)>& fn) {
    auto* n = doc_.get(key);
    if (!n) return;
    const toml::array* a = n->as_array();
    if (!a)
      r_.fail(Reader::line_of(*n), key,
              std::string(key) + " must be an array of tables ([[" + key + "]])");
    size_t i = 0;
    for (const auto& e : *a) {
      std::string field = std::string(key) + "[" + std::to_string(i++) + "]";
      const toml::table* t = e.as_table();
      if (!t) r_.fail(Reader::line_of(e), field, field + " must be a table ([[" + key + "]])");
      fn(*t, field, Reader::line_of(e));
    }
  }

  void parse_copy(const toml::table& t, const std::string& field, int line) {
    r_.only(t, field, {"src", "dest", "owner", "mode"});
    CopySpec c;
    c.line = line;
    auto* src = t.get("src");
    auto* dest = t.get("dest");
    if (!src) r_.fail(line, field + ".src", field + " needs src");
    if (!dest) r_.fail(line, field + ".dest", field + " needs dest");
    try {
      c.src = normalize_relative(sstr(*src, field + ".src"), field + ".src");
    } catch (const Error& e) {
      r_.fail(Reader::line_of(*src), e.field(), e.what());
    }
    c.dest = sstr(*dest, field + ".dest");
    check_guest_path(r_, Reader::line_of(*dest), c.dest, field + ".dest");
    if (auto* o = t.get("owner")) {
      c.owner = sstr(*o, field + ".owner");
      if (!valid_user(c.owner))
        r_.fail(Reader::line_of(*o), field + ".owner",
                "owner '" + c.owner + "' is not a user name or uid");
    }
    if (auto* m = t.get("mode")) {
      std::string s = r_.str(*m, field + ".mode");
      bool ok = !s.empty() && s.size() <= 4;
      for (char ch : s) ok = ok && ch >= '0' && ch <= '7';
      if (!ok)
        r_.fail(Reader::line_of(*m), field + ".mode", field + ".mode must be octal like \"0644\"");
      c.mode = static_cast<uint32_t>(std::stoul(s, nullptr, 8));
    }
    rec_.copies.push_back(c);
  }

  void parse_run(const toml::table& t, const std::string& field, int line) {
    r_.only(t, field, {"cmd", "timeout"});
    RunSpec s;
    s.line = line;
    auto* cmd = t.get("cmd");
    if (!cmd) r_.fail(line, field + ".cmd", field + " needs cmd");
    s.cmd = sstr(*cmd, field + ".cmd");
    if (s.cmd.empty()) r_.fail(Reader::line_of(*cmd), field + ".cmd", field + ".cmd is empty");
    if (auto* to = t.get("timeout")) s.timeout_s = r_.integer(*to, field + ".timeout", 1, 86400);
    rec_.runs.push_back(s);
  }

  void parse_build() {
    if (auto* n = doc_.get("build")) {
      const auto& t = r_.table(*n, "build");
      r_.only(t, "build", {"memory_mb"});
      if (auto* m = t.get("memory_mb"))
        rec_.memory_mb = r_.integer(*m, "build.memory_mb", 128, 65536);
    }
  }

  // The network: what the recipe names, unless it says otherwise.
  void parse_network() {
    bool allow_given = false;
    if (auto* n = doc_.get("network")) {
      const auto& t = r_.table(*n, "network");
      r_.only(t, "network", {"mode", "allow"});
      if (auto* m = t.get("mode")) {
        rec_.network_mode = r_.str(*m, "network.mode");
        if (rec_.network_mode != "none" && rec_.network_mode != "allowlist" &&
            rec_.network_mode != "open")
          r_.fail(Reader::line_of(*m), "network.mode",
                  "network.mode must be none, allowlist or open");
      }
      if (auto* a = t.get("allow")) {
        rec_.network_allow = sstrings(*a, "network.allow");
        allow_given = true;
      }
    }
    if (!allow_given) {
      std::set<std::string> hosts;
      for (const auto& s : rec_.apt_sources) {
        std::stringstream ss(s);
        std::string tok;
        while (ss >> tok)
          if (auto h = url_host(tok); !h.empty()) hosts.insert(h);
      }
      if (auto h = url_host(rec_.pip_index_url); !h.empty()) hosts.insert(h);
      rec_.network_allow.assign(hosts.begin(), hosts.end());
    }
    if (rec_.network_mode == "allowlist" && rec_.network_allow.empty()) rec_.network_mode = "none";
  }

  Reader r_;
  toml::table doc_;
  Recipe rec_;
};

}  // namespace

Recipe parse_recipe(const std::string& text, const std::string& source_name,
                    const std::map<std::string, std::string>& arg_overrides) {
  return RecipeParser(text, source_name).parse(arg_overrides);
}

}  // namespace airlock::recipes

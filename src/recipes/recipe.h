// Image recipes: `airlock image build -f airlock.toml NAME`.
//
// A recipe is TOML (parsed with toml++). Every key is known; an unknown key,
// a value of the wrong type or a bad value is Error(invalid_argument) whose
// message names the key and its line ("airlock.toml:12: unknown key
// 'pakages' in [apt]") and whose field is the key's dotted path.
//
//   base = "debian"                  # minimal | debian | any airlock image
//   workdir = "/home/user/app"       # default cwd of execs (created)
//   user = "user"                    # default user of execs (must exist)
//   warmup = ["python3 -c 'import json'"]   # stored with the image
//   [args]                           # ${NAME} in any string below; default values,
//   mirror = "http://deb.example"    #   overridden by --arg mirror=...
//   [env]                            # image env; also set for run steps
//   LANG = "C.UTF-8"
//   [apt]                            # step "apt" (first)
//   sources = ["deb [trusted=yes] ${mirror}/apt ./"]   # used for this step only
//   packages = ["jq"]
//   [pip]                            # step "pip" (after apt)
//   index_url = "${mirror}/simple"
//   trusted_host = true              # pass --trusted-host (plain-http index)
//   packages = ["requests==2.31"]
//   [[copy]]                         # one step each, in order (after pip)
//   src = "app"                      # relative to the recipe's directory
//   dest = "/home/user/app"
//   owner = "user"                   # optional chown -R
//   mode = "0755"                    # optional, applied to files
//   [[run]]                          # one step each, in order (after copies)
//   cmd = "make -C /home/user/app"   # /bin/sh -c, as root, with [env]
//   timeout = 600                    # seconds (default 1800)
//   [network]                        # the build sandboxes' egress policy
//   allow = ["pkgs.example.com"]     # default: hosts of apt sources + pip index
//   mode = "allowlist"               # or "none" / "open"
//   [build]
//   memory_mb = 1024                 # of each build sandbox
// Steps can use the free space of the base image's filesystem.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace airlock::recipes {

struct CopySpec {
  std::string src;               // relative to the recipe's directory, normalised ("app/x")
  std::string dest;              // absolute guest path
  std::string owner;             // "" = root
  std::optional<uint32_t> mode;  // file mode, e.g. 0755
  int line = 0;
};

struct RunSpec {
  std::string cmd;
  int timeout_s = 1800;
  int line = 0;
};

struct Recipe {
  std::string base;
  std::map<std::string, std::string> args;  // after --arg overrides
  std::map<std::string, std::string> env;
  std::string workdir;  // "" = not set
  std::string user;     // "" = not set (root)
  std::vector<std::string> warmup;
  std::vector<std::string> apt_sources, apt_packages;
  std::string pip_index_url;
  bool pip_trusted_host = false;
  std::vector<std::string> pip_packages;
  std::vector<CopySpec> copies;
  std::vector<RunSpec> runs;
  std::string network_mode = "allowlist";  // "none" | "allowlist" | "open"
  std::vector<std::string> network_allow;  // resolved default included
  int memory_mb = 1024;                    // build sandbox memory
};

// Parses `text` (`source_name` is used in messages, e.g. "airlock.toml").
// `arg_overrides` replace [args] defaults; an override naming no declared
// arg is an error (field "args.NAME"), as is a ${NAME} with no value.
Recipe parse_recipe(const std::string& text, const std::string& source_name,
                    const std::map<std::string, std::string>& arg_overrides = {});

// A relative path inside the recipe's directory, normalised (no "." parts,
// no trailing "/"); Error(invalid_argument, field) for an absolute path, an
// empty one, or one that leaves the directory ("..", "a/../../b").
std::string normalize_relative(const std::string& path, const std::string& field);

// The host of an http(s) URL ("http://h:8080/x" -> "h"); "" if none.
std::string url_host(const std::string& url);

}  // namespace airlock::recipes

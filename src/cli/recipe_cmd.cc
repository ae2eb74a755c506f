#include "cli/recipe_cmd.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "cli/args.h"
#include "common/error.h"
#include "daemon/base64.h"
#include "recipes/plan.h"

namespace airlock::cli {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string elapsed(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1fs", s);
  return buf;
}

}  // namespace

int run_recipe_build(const client::Client& client, const std::string& name, const RecipeBuild& o,
                     bool json_out) {
  std::map<std::string, std::string> args;
  for (const auto& a : o.args) {
    auto eq = a.find('=');
    if (eq == std::string::npos || eq == 0)
      throw Error(Errc::invalid_argument, "--arg wants NAME=VALUE, got '" + a + "'", "args");
    args[a.substr(0, eq)] = a.substr(eq + 1);
  }
  std::ifstream in(o.file, std::ios::binary);
  if (!in) throw Error(Errc::invalid_argument, "cannot read recipe " + o.file, "file");
  std::stringstream text;
  text << in.rdbuf();
  fs::path path(o.file);
  std::string source = path.filename().string();
  // Parsed here too: the files to send, and errors before anything is sent.
  recipes::Recipe recipe = recipes::parse_recipe(text.str(), source, args);
  fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  recipes::Files files = recipes::collect_files(dir, recipe);
  json body{{"name", name},
            {"recipe", text.str()},
            {"source", source},
            {"args", args},
            {"files", json::array()}};
  for (const auto& f : files)
    body["files"].push_back(
        {{"path", f.path}, {"mode", f.mode}, {"data", daemon::base64_encode(f.data)}});

  bool tty = !json_out && ::isatty(1);
  auto t0 = std::chrono::steady_clock::now();
  auto now_s = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  size_t count = 0;
  std::string current;  // "[3/7] run make"
  json done;
  auto status = [&](const std::string& extra) {
    std::fprintf(stdout, "\r%s%s\033[K", current.c_str(), extra.c_str());
    std::fflush(stdout);
  };
  try {
    client.stream_lines(
        "/v1/images/build",
        [&](const json& e) {
          std::string type = e.value("type", "");
          if (json_out) {
            std::cout << e.dump() << "\n" << std::flush;
            if (type == "done") done = e;
            return;
          }
          if (type == "base") {
            std::printf("building base image %s\n", e.value("name", "").c_str());
          } else if (type == "plan") {
            count = e.value("steps", 0);
            if (!tty) std::printf("%zu steps on %s\n", count, e.value("base", "").c_str());
          } else if (type == "step") {
            current = "[" + std::to_string(e.value("index", 0) + 1) + "/" + std::to_string(count) +
                      "] " + e.value("title", "");
            bool cached = e.value("cached", false);
            if (tty) {
              if (cached) {
                status(" (cached)");
                std::printf("\n");
              } else {
                status("");
              }
            } else {
              std::printf("%s%s\n", current.c_str(), cached ? " (cached)" : "");
            }
          } else if (type == "progress" && tty) {
            status("  " + client::human_bytes(e.value("bytes", uint64_t{0})) + "  " +
                   elapsed(e.value("elapsed_s", 0.0)));
          } else if (type == "output" && !tty) {
            std::fwrite(e.value("data", "").data(), 1, e.value("data", "").size(), stdout);
          } else if (type == "step_done") {
            std::string line = "  done: " + client::human_bytes(e.value("bytes", uint64_t{0})) +
                               " layer in " + elapsed(e.value("elapsed_s", 0.0));
            if (tty) {
              status(line);
              std::printf("\n");
            } else {
              std::printf("%s\n", line.c_str());
            }
          } else if (type == "flatten") {
            if (tty) std::printf("\r\033[K");
            std::printf("flattened: %s\n",
                        client::human_bytes(e.value("bytes", uint64_t{0})).c_str());
          } else if (type == "done") {
            done = e;
          }
          std::fflush(stdout);
        },
        body);
  } catch (const Error&) {
    if (tty) std::printf("\n");
    std::fflush(stdout);
    throw;
  }
  if (done.is_null()) throw Error(Errc::internal, "the build's stream ended without a result");
  if (!json_out) {
    const json& img = done["image"];
    std::printf("%s: %d steps (%d cached, %d built) in %s\n", name.c_str(), done.value("steps", 0),
                done.value("cached", 0), done.value("built", 0), elapsed(now_s()).c_str());
    (void)img;
  }
  return 0;
}

}  // namespace airlock::cli

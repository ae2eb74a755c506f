// A parsed recipe as build steps, each keyed by its inputs (the layer cache).
//
// Steps, in this order: "apt" (if [apt]), "pip" (if [pip]), one "copy" per
// [[copy]], one "run" per [[run]], and "config" (if workdir or user is set:
// creates the workdir, checks that the user exists). Step i's key is
//   sha256(key of step i-1 (the base image's key for step 0),
//          kind, script, for each copied file: guest path, mode, sha256 of bytes)
// so a change to any step, or to a file it copies, changes its key and the
// keys of every later step: the build resumes from the first changed step.
// The image key adds the image config (env, workdir, user, warmup) to the
// last step's key; it does not change the disk, so it is not a layer.
//
//   Files files = collect_files(recipe_dir, recipe);  // the client side
//   auto steps = plan_steps(recipe, base_image.key, files);
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "recipes/recipe.h"

namespace airlock::recipes {

// A file the client sent with the recipe: its path relative to the recipe's
// directory (normalised), its mode bits and bytes.
struct FileEntry {
  std::string path;
  uint32_t mode = 0644;
  std::string data;
};
using Files = std::vector<FileEntry>;

struct CopyFile {
  const FileEntry* file;
  std::string guest_path;
  uint32_t mode;
};

struct Step {
  std::string kind;    // apt | pip | copy | run | config
  std::string title;   // one line for progress output
  std::string script;  // /bin/sh -c, as root, after the files (copy) are written
  std::vector<CopyFile> files;
  int timeout_s = 1800;
  std::string key;  // hex sha256 of the inputs, chained
};

// Error(invalid_argument, field "copy[i].src") for a copy that matches no
// sent file.
std::vector<Step> plan_steps(const Recipe& recipe, const std::string& base_key, const Files& files);

// The image key: the last step's key (or the base key) + the image config.
std::string image_key(const Recipe& recipe, const std::string& base_key,
                      const std::vector<Step>& steps);

// Reads the files every [[copy]] names from `dir` (the recipe's directory).
// A src that leaves `dir`, directly or through a symlink (the file's real
// path must be inside dir's real path), is Error(invalid_argument, field
// "copy[i].src") naming it; so is a missing one and anything that is not a
// regular file, directory or symlink to one. `max_bytes` caps the total.
Files collect_files(const std::filesystem::path& dir, const Recipe& recipe,
                    uint64_t max_bytes = 256ull << 20);

// Quotes `s` for /bin/sh ('...' with ' escaped).
std::string sh_quote(const std::string& s);

}  // namespace airlock::recipes

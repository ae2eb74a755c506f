// For the fence tests that read the source tree (which folder may include
// which): the lines of a folder's sources that match a pattern.
//
//   EXPECT_EQ(fence_breaks(src, {"mcp"}, std::regex("#include \"cli/")), "");
#pragma once

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace airlock {

// "file:line: text" (file relative to `src`) for each line of the .cc and .h
// files under src/dir that matches `pattern`; files in `skip` are counted
// but not read. `files` counts the files seen, so a test can tell the tree
// was found.
inline std::vector<std::string> source_lines_matching(
    const std::filesystem::path& src, const std::string& dir, const std::regex& pattern,
    size_t& files, const std::set<std::filesystem::path>& skip = {}) {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(src / dir)) {
    auto ext = e.path().extension();
    if (!e.is_regular_file() || (ext != ".cc" && ext != ".h")) continue;
    ++files;
    if (skip.count(e.path())) continue;
    std::ifstream in(e.path());
    std::string line;
    for (int n = 1; std::getline(in, line); ++n)
      if (std::regex_search(line, pattern))
        out.push_back(fs::relative(e.path(), src).string() + ":" + std::to_string(n) + ": " + line);
  }
  return out;
}

// Every line source_lines_matching finds under each of `dirs`, one per
// line ("" if none); "no sources found" if fewer than `min_files` were
// seen (the tree was not where the test looked).
inline std::string fence_breaks(const std::filesystem::path& src,
                                const std::vector<std::string>& dirs, const std::regex& pattern,
                                const std::set<std::filesystem::path>& skip = {},
                                size_t min_files = 10) {
  size_t files = 0;
  std::string out;
  for (const auto& dir : dirs)
    for (const auto& line : source_lines_matching(src, dir, pattern, files, skip))
      out += line + "\n";
  return files < min_files ? "no sources found under " + src.string() : out;
}

}  // namespace airlock

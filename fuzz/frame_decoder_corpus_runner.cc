// Runs every file of a corpus directory through the fuzz entry, so the normal
// (g++) build checks the committed corpus under ctest without libFuzzer.
//   frame_decoder_corpus_runner fuzz/corpus/frame_decoder
#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/error.h"
#include "frame_decoder_entry.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(argv[1], ec))
    if (e.is_regular_file()) files.push_back(e.path());
  if (ec || files.empty()) {
    std::fprintf(stderr, "no corpus files in %s\n", argv[1]);
    return 2;
  }
  std::sort(files.begin(), files.end());
  int failures = 0;
  for (const auto& p : files) {
    std::ifstream in(p, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    try {
      airlock::fuzz::frame_decoder_one_input(reinterpret_cast<const uint8_t*>(bytes.data()),
                                             bytes.size());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: unexpected exception: %s\n", p.c_str(), e.what());
      ++failures;
    } catch (...) {
      std::fprintf(stderr, "%s: unexpected non-std exception\n", p.c_str());
      ++failures;
    }
  }
  std::printf("%zu corpus files, %d failures\n", files.size(), failures);
  return failures ? 1 : 0;
}

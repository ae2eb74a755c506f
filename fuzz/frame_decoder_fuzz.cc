// libFuzzer target: clang++ -fsanitize=fuzzer,address (see fuzz/CMakeLists.txt).
//   build-fuzz/bin/frame_decoder_fuzz -max_total_time=60 fuzz/corpus/frame_decoder
#include "frame_decoder_entry.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return airlock::fuzz::frame_decoder_one_input(data, size);
}

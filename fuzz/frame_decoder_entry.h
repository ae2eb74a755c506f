// The one fuzz entry for the guest-protocol Decoder, shared by the libFuzzer
// target (frame_decoder_fuzz.cc, clang only) and the corpus runner that the
// normal build runs under ctest (frame_decoder_corpus_runner.cc).
#pragma once

#include <cstddef>
#include <cstdint>

namespace airlock::fuzz {

// Feeds `data` through a Decoder in chunks (sizes derived from the input's
// first byte), checks every decoded frame re-encodes to the same bytes and
// that parse_json / parse_credit fail only with airlock::Error and that
// parse_json accepts nothing nested deeper than protocol::kMaxJsonDepth. Returns 0.
// Aborts on a broken invariant; lets any exception other than airlock::Error
// escape (a bug: the decoder may only fail with Error(protocol_error)).
int frame_decoder_one_input(const uint8_t* data, size_t size);

}  // namespace airlock::fuzz

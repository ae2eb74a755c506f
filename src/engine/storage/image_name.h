// The one rule for an image's name, used by every door a name comes in
// through: a sandbox spec's `image`, E2B's template, an import, an image
// saved from a snapshot, a recipe build, and the store itself.
//
// A name becomes a directory under the image store and a word in URLs, so it
// is 1 to 64 of a-z 0-9 _ -, starting with a letter or digit. One rule means
// a name that passes validation is one the store can hold and find; before,
// `image: "Foo.x"` passed the spec's looser check and was then never found.
//
//   if (!storage::is_image_name(dir_name)) continue;   // foreign entry
//   storage::check_image_name(spec.image, "image");    // throws Error(invalid_argument)
#pragma once

#include <string_view>

namespace airlock::storage {

inline constexpr std::size_t kMaxImageName = 64;

bool is_image_name(std::string_view name);

// Throws Error(invalid_argument, naming the name and the rule, field).
void check_image_name(std::string_view name, std::string_view field = "image");

}  // namespace airlock::storage

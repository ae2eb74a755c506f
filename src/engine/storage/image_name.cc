#include "engine/storage/image_name.h"

#include <string>

#include "common/error.h"

namespace airlock::storage {
namespace {

bool lower_or_digit(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

}  // namespace

bool is_image_name(std::string_view name) {
  if (name.empty() || name.size() > kMaxImageName || !lower_or_digit(name[0])) return false;
  for (char c : name)
    if (!lower_or_digit(c) && c != '-' && c != '_') return false;
  return true;
}

void check_image_name(std::string_view name, std::string_view field) {
  if (is_image_name(name)) return;
  // The name is the caller's input: shown only in part, so a long one does
  // not become a long message (the audit log keeps messages).
  std::string shown(name.substr(0, 80));
  if (name.size() > 80) shown += "...";
  throw Error(Errc::invalid_argument,
              "image name '" + shown + "' is not valid: 1 to " + std::to_string(kMaxImageName) +
                  " of a-z 0-9 _ -, starting with a letter or digit",
              std::string(field));
}

}  // namespace airlock::storage

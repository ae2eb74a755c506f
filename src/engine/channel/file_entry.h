// A file entry as the guest reports it (list, stat, move: see
// api/guest-protocol.md §5), checked and rebuilt by the host from its known
// fields only: the guest is hostile, so a wrong type, an out-of-range
// number, a relative or oversized path is a GuestReplyError
// (guest_client.h) naming the field, never passed on to a client.
#pragma once

#include <nlohmann/json.hpp>

namespace airlock::channel {

// {"name", "type": file|dir|symlink|other, "size", "mode" (0..07777),
// "mtime", and when present "path" (absolute), "uid", "gid", "owner",
// "group", and for a symlink "target" (absolute), "target_type",
// "target_mode"}.
nlohmann::json file_entry_from_guest(const nlohmann::json& entry);

}  // namespace airlock::channel

// One POSIX ACL entry for one uid on an open file: how a confined tool's
// uid may read (or write) exactly the files it was given (confine.h).
#pragma once

#include <cstdint>

namespace airlock::engine::confine {

// Adds (or widens) a named-user entry {uid, perm (4 read, 6 read-write)} to
// the file's access ACL, keeping whatever entries it had; the mask grows to
// cover it. Throws Error naming `what` if the filesystem refuses.
void grant_user(int fd, uint32_t uid, uint16_t perm, const char* what);

// Removes uid's entry. When no named entry is left the ACL goes and the
// group bits of the mode are the group entry's again (an ACL's mask had
// stood in for them). Never throws.
void revoke_user(int fd, uint32_t uid);

}  // namespace airlock::engine::confine

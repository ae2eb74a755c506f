// envd's file transfer routes: GET /files (download) and POST /files
// (upload: multipart/form-data with one or more parts named "file", each
// filename the destination path, as E2B's SDK sends several files at once;
// or application/octet-stream to the `path` query parameter). Query
// parameters `path` and `username` as the SDK sends them; relative paths and
// "~" resolve against the user's home (envd_fs.h), and what is written
// belongs to that user.
//
// Both stream: a download goes to the client chunk by chunk as the guest
// sends it, an upload is passed to the guest part by part as it arrives
// (multipart.h), so memory stays bounded whatever the size. Errors are
// envd's {"code": <status>, "message"} with its statuses: 400 bad input
// (malformed multipart, a directory, no path), 401 unknown user, 404 not
// found, 507 no space left, 500 otherwise.
#pragma once

#include <string>

#include "daemon/exchange.h"
#include "engine/api/service.h"

namespace airlock::e2b {

// `user`: the user the call runs as when the query has no `username`.
void files_get(engine::SandboxService& engine, daemon::Exchange& ex, const std::string& sandbox,
               const std::string& user);
void files_post(engine::SandboxService& engine, daemon::Exchange& ex, const std::string& sandbox,
                const std::string& user);

// The HTTP status envd answers a failed file transfer with.
int files_status(const Error& e);

}  // namespace airlock::e2b

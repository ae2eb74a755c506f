#include "e2b/envd_files.h"

#include <set>

#include "daemon/request.h"
#include "e2b/envd_fs.h"
#include "e2b/multipart.h"

namespace airlock::e2b {
namespace {

using nlohmann::json;
constexpr size_t kChunk = 256 * 1024;

void send_error(daemon::Exchange& ex, int status, const std::string& message) {
  ex.send_json(status, {{"code", status}, {"message", message}});
}

std::string query_user(const daemon::Query& q, const std::string& fallback) {
  auto it = q.find("username");
  return it != q.end() && !it->second.empty() ? it->second : fallback;
}

std::string resolved(engine::SandboxService& engine, const std::string& sandbox, std::string_view path,
                     const std::string& user) {
  try {
    return resolve_path(path, [&] { return engine.guest_home(sandbox, user); });
  } catch (const FsError& e) {
    throw Error(Errc::invalid_argument, e.what(), "path");
  }
}

std::string basename_of(const std::string& p) { return p.substr(p.find_last_of('/') + 1); }

// Writes one upload to `path` as `user`: the entry envd answers with.
json write_one(engine::SandboxService& engine, const std::string& sandbox, const std::string& path,
               const std::string& user, const engine::ChunkSource& source) {
  try {
    engine.write_file_as(sandbox, path, 0644, source, user == "root" ? "" : user);
  } catch (const Error& e) {
    // The guest's "no user X": an unknown user, 401 as envd answers it.
    if (e.code() == Errc::not_found && std::string(e.what()).find("no user ") != std::string::npos)
      throw Error(Errc::not_found, "no user " + user + " in the sandbox", "user");
    throw;
  }
  return {{"name", basename_of(path)}, {"type", "file"}, {"path", path}};
}

}  // namespace

int files_status(const Error& e) {
  switch (e.code()) {
    case Errc::invalid_argument:
      return 400;
    case Errc::not_found:
      return e.field() == "user" ? 401 : 404;
    case Errc::payload_too_large:
      return 413;
    case Errc::unavailable:
      return 507;
    case Errc::unauthenticated:
      return 401;
    default:
      return 500;
  }
}

void files_get(engine::SandboxService& engine, daemon::Exchange& ex, const std::string& sandbox,
               const std::string& user) {
  try {
    daemon::Query q = daemon::parse_query(ex.query());
    const std::string who = query_user(q, user);
    if (!q.count("path") || q["path"].empty())
      throw Error(Errc::invalid_argument, "the path query parameter is required", "path");
    const std::string path = resolved(engine, sandbox, q["path"], who);
    // The stream begins with the first byte: an error before it (no such
    // file, a directory) is still a plain JSON answer.
    engine.read_file(sandbox, path, [&](std::string_view chunk) {
      if (!ex.streaming()) ex.begin_stream("application/octet-stream");
      return ex.write_chunk(chunk);
    });
    if (!ex.streaming()) ex.begin_stream("application/octet-stream");
    ex.end_stream();
  } catch (const Error& e) {
    if (ex.streaming()) {
      ex.abort_stream();  // a read error after data: the client sees a cut body
      return;
    }
    send_error(ex, files_status(e), e.what());
  }
}

void files_post(engine::SandboxService& engine, daemon::Exchange& ex, const std::string& sandbox,
                const std::string& user) {
  try {
    daemon::Query q = daemon::parse_query(ex.query());
    const std::string who = query_user(q, user);
    const std::string query_path = q.count("path") ? q["path"] : "";
    std::string type(ex.request()[daemon::http::field::content_type]);
    std::string media = type.substr(0, type.find(';'));
    for (char& c : media) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    while (!media.empty() && media.back() == ' ') media.pop_back();
    if (!ex.request()[daemon::http::field::content_encoding].empty() &&
        ex.request()[daemon::http::field::content_encoding] != "identity")
      throw Error(Errc::invalid_argument,
                  "Content-Encoding " +
                      std::string(ex.request()[daemon::http::field::content_encoding]) +
                      " is not supported: upload without gzip",
                  "Content-Encoding");
    json written = json::array();
    if (media == "application/octet-stream") {
      if (query_path.empty())
        throw Error(Errc::invalid_argument, "the path query parameter is required", "path");
      written.push_back(write_one(engine, sandbox, resolved(engine, sandbox, query_path, who), who,
                                  [&] { return ex.read_chunk(kChunk); }));
    } else if (media.rfind("multipart/", 0) == 0) {
      MultipartReader reader(boundary_of(type), [&] { return ex.read_chunk(kChunk); });
      std::set<std::string> seen;
      while (reader.next_part()) {
        if (reader.name() != "file") continue;  // envd skips other form fields
        std::string target = !query_path.empty() ? query_path : reader.filename();
        if (target.empty())
          throw Error(Errc::invalid_argument, "a file part has no filename and no path was given",
                      "path");
        std::string path = resolved(engine, sandbox, target, who);
        if (!seen.insert(path).second)
          throw Error(Errc::invalid_argument,
                      "you cannot upload multiple files to the same path '" + path +
                          "' in one upload request",
                      "path");
        written.push_back(
            write_one(engine, sandbox, path, who, [&] { return reader.read(kChunk); }));
      }
      if (written.empty())
        throw Error(Errc::invalid_argument, "the multipart body has no part named \"file\"",
                    "body");
    } else {
      throw Error(Errc::invalid_argument,
                  "unsupported content type: " + type +
                      ", expected multipart/form-data or application/octet-stream",
                  "Content-Type");
    }
    ex.send_json(200, written);
  } catch (const Error& e) {
    send_error(ex, files_status(e), e.what());
  }
}

}  // namespace airlock::e2b

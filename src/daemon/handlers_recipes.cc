// POST /v1/images/build: an image from a recipe (recipes/builder.h).
//
// Body: {"name", "recipe": TOML text, "source"?: file name for messages,
//        "args"?: {NAME: VALUE}, "files"?: [{"path", "mode"?, "data": base64}]}
// where files are what the recipe's [[copy]] entries read, by path relative
// to the recipe's directory (the CLI sends them). A bad request or recipe is
// answered 400 (409 for a built-in image's name) before anything runs; once
// the build runs the answer is 200 with NDJSON: the builder's progress
// events, then {"type":"done", "image", "key", "steps", "cached", "built",
// "elapsed_s"} or {"type":"error","error":{...}} (a failed step: its output).
#include <poll.h>

#include "daemon/base64.h"
#include "daemon/handlers.h"
#include "daemon/request.h"
#include "engine/storage/image_store.h"
#include "recipes/builder.h"

namespace airlock::daemon {

using nlohmann::json;

namespace {

constexpr uint64_t kMaxBuildBody = 96ull << 20;  // recipe + base64 of the copied files

recipes::BuildRequest parse_build(std::string_view body) {
  json req = parse_object(body);
  for (auto& [k, v] : req.items())
    if (k != "name" && k != "recipe" && k != "source" && k != "args" && k != "files")
      throw Error(Errc::invalid_argument, "unknown field " + k, k);
  recipes::BuildRequest out;
  auto str = [&](const char* key, bool required) -> std::string {
    if (!req.contains(key)) {
      if (required) throw Error(Errc::invalid_argument, std::string(key) + " is required", key);
      return "";
    }
    if (!req[key].is_string())
      throw Error(Errc::invalid_argument, std::string(key) + " must be a string", key);
    return req[key].get<std::string>();
  };
  out.name = str("name", true);
  out.recipe = str("recipe", true);
  out.source_name = str("source", false);
  if (req.contains("args")) {
    if (!req["args"].is_object())
      throw Error(Errc::invalid_argument, "args must be an object of strings", "args");
    for (auto& [k, v] : req["args"].items()) {
      if (!v.is_string())
        throw Error(Errc::invalid_argument, "args." + k + " must be a string", "args." + k);
      out.args[k] = v.get<std::string>();
    }
  }
  if (req.contains("files")) {
    if (!req["files"].is_array())
      throw Error(Errc::invalid_argument, "files must be an array", "files");
    size_t i = 0;
    for (const auto& f : req["files"]) {
      std::string field = "files[" + std::to_string(i++) + "]";
      if (!f.is_object()) throw Error(Errc::invalid_argument, field + " must be an object", field);
      for (auto& [k, v] : f.items())
        if (k != "path" && k != "mode" && k != "data")
          throw Error(Errc::invalid_argument, "unknown field " + field + "." + k, field + "." + k);
      if (!f.contains("path") || !f["path"].is_string())
        throw Error(Errc::invalid_argument, field + ".path must be a string", field + ".path");
      if (!f.contains("data") || !f["data"].is_string())
        throw Error(Errc::invalid_argument, field + ".data must be base64", field + ".data");
      recipes::FileEntry e;
      e.path = f["path"].get<std::string>();
      if (f.contains("mode")) {
        if (!f["mode"].is_number_integer() || f["mode"].get<int64_t>() < 0 ||
            f["mode"].get<int64_t>() > 07777)
          throw Error(Errc::invalid_argument, field + ".mode must be 0..4095", field + ".mode");
        e.mode = f["mode"].get<uint32_t>();
      }
      auto data = base64_decode(f["data"].get<std::string>());
      if (!data)
        throw Error(Errc::invalid_argument, field + ".data is not base64", field + ".data");
      e.data = std::move(*data);
      out.files.push_back(std::move(e));
    }
  }
  return out;
}

}  // namespace

namespace serve {

void build_image(const RouteContext& c) {
  check_query_keys(c.query, {});
  Exchange& ex = c.ex;
  recipes::BuildRequest req = parse_build(ex.read_body(kMaxBuildBody));
  auto line = [&](const json& j) { return ex.write_chunk(j.dump() + "\n"); };
  bool gone = false;
  // The stream starts with the first event: errors before it (a bad recipe)
  // are ordinary 4xx answers.
  auto on_event = [&](const json& e) {
    if (gone) return false;
    if (!ex.streaming()) ex.begin_stream("application/x-ndjson");
    if (!line(e)) gone = true;
    // A client that hung up stops the build (its sandbox goes).
    pollfd p{ex.native_handle(), POLLRDHUP, 0};
    if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLERR | POLLRDHUP))) gone = true;
    return !gone;
  };
  json result;
  try {
    result = recipes::build(c.engine, c.engine.images().dir(), req, on_event);
  } catch (const Error& e) {
    if (!ex.streaming()) throw;
    if (gone) {
      ex.abort_stream();
      return;
    }
    end_stream_with_error(ex, error_body(to_string(e.code()), e.what(), e.field()));
    return;
  }
  if (!ex.streaming()) ex.begin_stream("application/x-ndjson");
  result["type"] = "done";
  line(result);
  ex.end_stream();
}

}  // namespace serve
}  // namespace airlock::daemon

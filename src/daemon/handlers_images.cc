// Image management routes (docs/design.md, "Images: import and management"):
// GET /v1/images, GET|DELETE /v1/images/{id}, POST /v1/images/{id}/import,
// GET /v1/df, POST /v1/prune. Images have no owner yet, so these are the
// operator's (unix socket) only: a tenant gets the 404 of an unknown route,
// after its body has been read (answering an upload before reading it
// breaks the client's pipe mid-send).
#include <fcntl.h>
#include <unistd.h>

#include "common/error.h"
#include "daemon/handlers.h"
#include "daemon/request.h"
#include "daemon/router.h"
#include "engine/api/service.h"
#include "engine/storage/image_name.h"
#include "engine/storage/image_store.h"

namespace airlock::daemon {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Streams the upload into `file` (never held in memory).
uint64_t receive_to_file(Exchange& ex, const fs::path& file) {
  int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    ex.discard_body();
    throw_errno("create " + file.string());
  }
  uint64_t total = 0;
  bool failed = false;
  while (auto chunk = ex.read_chunk(1 << 20)) {
    total += chunk->size();
    for (size_t done = 0; !failed && done < chunk->size();) {
      ssize_t n = ::write(fd, chunk->data() + done, chunk->size() - done);
      if (n < 0)
        failed = true;
      else
        done += static_cast<size_t>(n);
    }
  }
  ::close(fd);
  if (failed) throw Error(Errc::internal, "cannot store the upload in " + file.string());
  return total;
}

}  // namespace

// Operator only (the route table says so; dispatch checked).
namespace serve {

void list_images(const RouteContext& c) {
  check_query_keys(c.query, {});
  expect_no_body(c.ex);
  c.ex.send_json(200, c.engine.list_images());
}

void get_image(const RouteContext& c) {
  check_query_keys(c.query, {});
  expect_no_body(c.ex);
  c.ex.send_json(200, c.engine.inspect_image(c.id));
}

void delete_image(const RouteContext& c) {
  check_query_keys(c.query, {});
  expect_no_body(c.ex);
  c.engine.remove_image(c.id);
  c.ex.send_empty(204);
}

void import_image(const RouteContext& c) {
  Exchange& ex = c.ex;
  // A name the store could never hold is refused before the upload
  // costs any disk.
  if (!storage::is_image_name(c.id)) {
    ex.discard_body();
    storage::check_image_name(c.id, "name");
  }
  fs::path dir = c.engine.images().dir();
  fs::create_directories(dir);
  std::string tmpl = (dir / ".tmp-import-upload-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) {
    ex.discard_body();
    throw_errno("mkdtemp in " + dir.string());
  }
  fs::path tmp = tmpl;
  struct Cleanup {
    fs::path p;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(p, ec);
    }
  } cleanup{tmp};
  uint64_t n = receive_to_file(ex, tmp / "image.tar");
  check_query_keys(c.query, {"replace"});
  bool replace = query_bool(c.query, "replace", false);
  if (n == 0)
    throw Error(Errc::invalid_argument,
                "the body must be the image archive (docker save or OCI layout tar)", "body");
  ex.send_json(201, c.engine.import_image(c.id, tmp / "image.tar", replace));
}

void disk_usage(const RouteContext& c) {
  check_query_keys(c.query, {});
  expect_no_body(c.ex);
  c.ex.send_json(200, c.engine.disk_usage());
}

void prune(const RouteContext& c) {
  check_query_keys(c.query, {"dry_run"});
  expect_no_body(c.ex);
  c.ex.send_json(200, c.engine.prune(query_bool(c.query, "dry_run", false)));
}

}  // namespace serve
}  // namespace airlock::daemon

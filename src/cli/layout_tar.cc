#include "cli/layout_tar.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "common/error.h"

namespace airlock::cli {
namespace fs = std::filesystem;

namespace {

// Writes the tar; returns "" or what went wrong.
std::string write_tar(const fs::path& dir, int fd) {
  std::unique_ptr<archive, int (*)(archive*)> a(archive_write_new(), archive_write_free);
  archive_write_set_format_pax_restricted(a.get());
  if (archive_write_open_fd(a.get(), fd) != ARCHIVE_OK) return archive_error_string(a.get());
  std::error_code ec;
  std::vector<char> buf(1 << 16);
  for (auto it = fs::recursive_directory_iterator(dir, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    struct stat st;
    if (::lstat(it->path().c_str(), &st) != 0) return "cannot stat " + it->path().string();
    std::string rel = it->path().lexically_relative(dir).string();
    if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode))
      return "'" + rel + "' in the layout is neither a file nor a directory";
    std::unique_ptr<archive_entry, void (*)(archive_entry*)> e(archive_entry_new(),
                                                               archive_entry_free);
    archive_entry_set_pathname(e.get(), rel.c_str());
    archive_entry_copy_stat(e.get(), &st);
    if (archive_write_header(a.get(), e.get()) != ARCHIVE_OK) return archive_error_string(a.get());
    if (!S_ISREG(st.st_mode)) continue;
    int f = ::open(it->path().c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (f < 0) return "cannot open " + it->path().string();
    ssize_t n;
    while ((n = ::read(f, buf.data(), buf.size())) > 0)
      if (archive_write_data(a.get(), buf.data(), size_t(n)) < 0) {
        ::close(f);
        return archive_error_string(a.get());
      }
    ::close(f);
  }
  if (ec) return "cannot walk " + dir.string() + ": " + ec.message();
  if (archive_write_close(a.get()) != ARCHIVE_OK) return archive_error_string(a.get());
  return "";
}

}  // namespace

LayoutTar::LayoutTar(const fs::path& dir) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) throw_errno("pipe");
  read_fd_ = p[0];
  int w = p[1];
  writer_ = std::thread([this, dir, w] {
    error_ = write_tar(dir, w);
    ::close(w);
  });
}

void LayoutTar::finish() {
  if (read_fd_ >= 0) ::close(read_fd_);
  read_fd_ = -1;
  if (writer_.joinable()) writer_.join();
  if (!error_.empty()) throw Error(Errc::invalid_argument, error_, "archive");
}

LayoutTar::~LayoutTar() {
  if (read_fd_ >= 0) ::close(read_fd_);
  if (writer_.joinable()) writer_.join();
}

}  // namespace airlock::cli

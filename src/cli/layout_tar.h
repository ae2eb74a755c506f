// `airlock image import NAME DIR`: an OCI image layout given as a directory
// is sent to the daemon as a tar stream written on the fly (libarchive), so
// the daemon has one input format and the CLI writes no temporary file.
#pragma once

#include <filesystem>
#include <thread>

namespace airlock::cli {

// Starts a thread writing a tar of `dir`'s regular files and directories
// (symlinks and anything else are refused: a layout holds neither) to a
// pipe; returns the read end in `fd`. The thread ends when the tar is
// written or the reader closes its end; join it after closing `fd`.
class LayoutTar {
 public:
  explicit LayoutTar(const std::filesystem::path& dir);
  ~LayoutTar();
  LayoutTar(const LayoutTar&) = delete;
  LayoutTar& operator=(const LayoutTar&) = delete;
  int fd() const { return read_fd_; }
  // Closes the read end and waits for the writer; rethrows its error.
  void finish();

 private:
  int read_fd_ = -1;
  std::thread writer_;
  std::string error_;
};

}  // namespace airlock::cli

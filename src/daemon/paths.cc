#include "daemon/paths.h"

#include <pwd.h>
#include <unistd.h>

#include <cstdlib>

#include "common/error.h"

namespace airlock::daemon {

std::filesystem::path default_data_dir() {
  if (geteuid() == 0) return "/var/lib/airlock";
  if (const char* xdg = std::getenv("XDG_DATA_HOME"); xdg && xdg[0] == '/')
    return std::filesystem::path(xdg) / "airlock";
  const char* home = std::getenv("HOME");
  if (!home || home[0] != '/') {
    // No usable $HOME (e.g. under a service manager): ask the password database.
    struct passwd* pw = getpwuid(geteuid());
    if (!pw || !pw->pw_dir)
      throw Error(Errc::invalid_argument, "cannot find a home directory; pass --data-dir",
                  "data-dir");
    home = pw->pw_dir;
  }
  return std::filesystem::path(home) / ".local" / "share" / "airlock";
}

std::filesystem::path default_socket(const std::filesystem::path& data_dir) {
  return data_dir / "airlockd.sock";
}

std::filesystem::path default_image_dir(const std::filesystem::path& data_dir) {
  if (const char* dir = std::getenv("AIRLOCK_IMAGE_DIR"); dir && dir[0]) return dir;
  return data_dir / "images";
}

std::filesystem::path exe_dir() {
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) throw Error(Errc::internal, "cannot resolve /proc/self/exe: " + ec.message());
  return exe.parent_path();
}

}  // namespace airlock::daemon

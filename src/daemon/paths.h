// Default locations shared by airlockd and the airlock CLI, so that a CLI
// started without flags finds (or starts) the daemon a user expects.
//
//   data dir:  /var/lib/airlock as root, else $XDG_DATA_HOME/airlock,
//              else ~/.local/share/airlock
//   socket:    <data dir>/airlockd.sock
//   images:    $AIRLOCK_IMAGE_DIR, else <data dir>/images
#pragma once

#include <filesystem>

namespace airlock::daemon {

std::filesystem::path default_data_dir();
std::filesystem::path default_socket(const std::filesystem::path& data_dir);
std::filesystem::path default_image_dir(const std::filesystem::path& data_dir);
// Directory of the running executable (/proc/self/exe), for finding
// airlockd, airlock-guest and share/airlock beside it.
std::filesystem::path exe_dir();

}  // namespace airlock::daemon

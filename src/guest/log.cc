#include "guest/log.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>

namespace airlock::guest {
namespace {
int g_fd = STDERR_FILENO;
}

void log_to_console() {
  int fd = open("/dev/console", O_WRONLY | O_NOCTTY | O_CLOEXEC | O_NONBLOCK);
  if (fd >= 0) g_fd = fd;
}

void logf(const char* fmt, ...) {
  char line[1024];
  int n = snprintf(line, sizeof line, "airlock-guest: ");
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(line + n, sizeof line - n - 1, fmt, ap);
  va_end(ap);
  if (m < 0) m = 0;
  size_t len = std::min<size_t>(n + m, sizeof line - 2);
  line[len++] = '\n';
  // One write() per line so lines from a crashing child do not interleave.
  ssize_t r = write(g_fd, line, len);
  (void)r;
}

}  // namespace airlock::guest

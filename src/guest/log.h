// Console logging for the guest agent: one line per call, prefixed
// "airlock-guest: ". As PID 1 it goes to /dev/console (the host keeps the
// serial console log); on a development host to stderr.
#pragma once

namespace airlock::guest {

// Routes log lines to /dev/console (PID 1) instead of stderr.
void log_to_console();
// printf-style; never throws, never blocks for long.
void logf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace airlock::guest

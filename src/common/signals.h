// The signal state a freshly started program should see, set between fork
// (or clone) and exec. Async-signal-safe: system calls only.
//
//   if (::fork() == 0) { reset_signals(); ...; ::execv(...); }
#pragma once

#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <cstdint>

namespace airlock {

// Empty signal mask and every disposition back to SIG_DFL. exec resets
// handled signals but keeps ignored ones, and our parents ignore some (the
// daemon SIGPIPE; a CI runner handed us glibc's two real-time signals, 32
// and 33, ignored). The raw system call, because glibc's sigaction() refuses
// those two; an all-zero kernel sigaction is SIG_DFL with no flags, mask or
// restorer on every architecture. SIGKILL and SIGSTOP fail harmlessly.
inline void reset_signals() noexcept {
  const std::array<unsigned long, 4> dfl{};
  for (int s = 1; s < NSIG; ++s)
    ::syscall(SYS_rt_sigaction, s, dfl.data(), nullptr, sizeof(uint64_t));
  const uint64_t none = 0;
  ::syscall(SYS_rt_sigprocmask, SIG_SETMASK, &none, nullptr, sizeof(uint64_t));
}

}  // namespace airlock

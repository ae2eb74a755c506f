// Pieces shared by the GuestChannel operations split over several files
// (guest_channel.cc, guest_channel_watch.cc); not part of the channel's API.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>

#include "protocol/frame.h"

namespace airlock::channel::detail {

inline constexpr uint8_t kIn = 0, kOut = 1;
// After a deadline kills an operation, how long the guest gets to answer.
inline constexpr auto kKillGrace = std::chrono::seconds(10);

// Unregisters a stream however the operation ends.
struct StreamGuard {
  std::function<void()> release;
  ~StreamGuard() { release(); }
};

// A response frame's JSON, or the guest's error thrown as an Error.
nlohmann::json parse_response(const protocol::Frame& f);

}  // namespace airlock::channel::detail

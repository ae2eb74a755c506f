// PID-1 duties of the guest agent inside the VM (skipped when it runs on a
// development host with --listen-fd/--socket).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace airlock::guest {

// Mounts what the initramfs did not (/proc, /sys, /dev, /dev/pts, /dev/shm,
// /tmp, /sys/fs/cgroup), sets hostname "airlock", brings loopback up, grows
// the root ext4 to its block device. Logs and carries on after failures.
void pid1_setup();

// Creates /sys/fs/cgroup/airlock/{agent} with every available controller
// enabled for exec cgroups, moves the agent into .../agent and sets its
// oom_score_adj to -1000. Returns the root for exec cgroups, or "" if cgroup2
// is unusable (then exec tree-kill falls back to the process group).
std::string setup_cgroups(const std::string& mount_point = "/sys/fs/cgroup");

// Opens /dev/<port> for the virtio-serial port named `name`
// (/sys/class/virtio-ports/*/name) O_RDWR|O_NONBLOCK; -1 if not there (yet).
int open_virtio_port(const std::string& name);

// Sets CLOCK_REALTIME to `ns` since the epoch (the hello's time_ns and the
// set_time op). False (errno set) if the kernel refused.
bool set_clock_ns(int64_t ns);

// Applies a hello's time_ns (clock_settime), hostname and entropy
// (RNDADDENTROPY); ignores and logs invalid values.
void apply_hello(const nlohmann::json& hello);

}  // namespace airlock::guest

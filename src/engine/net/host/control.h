// The helper's control socket (run_dir/net-ctl.sock) as typed calls: one
// request and one reply line each, within 5 s. The JSON of the requests and
// replies (net/helper.h) is known here only; a refusal comes back as an
// Error with the helper's code and field.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

namespace airlock::engine::nethost {

// What the helper reports after removing a forward.
struct PortRemoved {
  std::optional<uint64_t> guest_port, flows_cut;
};

class Control {
 public:
  explicit Control(std::filesystem::path run_dir) : run_dir_(std::move(run_dir)) {}

  // Puts `normal` (a normalised policy) in force; the flows it cut. A refusal
  // is Error(invalid_argument) with the helper's field, else Error(internal).
  uint64_t set_policy(const nlohmann::json& normal);
  // Forwards 127.0.0.1:host_port to the guest's port; the host port the
  // helper bound (1024..65535; equal to host_port). A refusal is an Error with
  // the helper's code and field (field "host_port": taken or forwarded).
  int add_port(int guest_port, int host_port);
  // The forwards in force: [{"host", "host_port", "guest_port"}].
  nlohmann::json ports();
  PortRemoved remove_port(int host_port);

 private:
  // One request/reply; the helper's error reply rethrown with its code.
  nlohmann::json call(const nlohmann::json& request);
  std::filesystem::path run_dir_;
};

}  // namespace airlock::engine::nethost

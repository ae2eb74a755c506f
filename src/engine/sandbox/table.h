// The live sandboxes of this daemon, by id, under one lock that is never
// held while a sandbox is checked or changed: lookups hand out a shared_ptr
// and the caller works on the sandbox under its own lock. A sandbox that is
// not in the table is answered from the registry (why it is not running).
// Pool members are not in the table until they are handed out.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/registry/registry.h"
#include "engine/sandbox/sandbox.h"

namespace airlock::engine {

class SandboxTable {
 public:
  explicit SandboxTable(Registry& registry) : registry_(registry) {}

  // The live sandbox `id` in any state, or null.
  std::shared_ptr<Sandbox> find(const std::string& id);
  // The running sandbox `id` (its idle clock touched: any call counts), or
  // Error(not_found) / Error(conflict naming its state and why).
  std::shared_ptr<Sandbox> running(const std::string& id);
  // The live sandbox `id` in any state, or Error(not_found) / Error(conflict
  // naming the state it ended in).
  std::shared_ptr<Sandbox> live(const std::string& id);
  // Every live sandbox now (a snapshot: checks run outside the lock).
  std::vector<std::shared_ptr<Sandbox>> all();

  void put(const std::string& id, std::shared_ptr<Sandbox> sb);
  // Removes `id` if it is still `sb` (not a newer sandbox of the same id).
  void erase(const std::string& id, const Sandbox* sb);
  // Closes every channel and forgets every sandbox (engine shutdown: the VMs
  // keep running and the next engine re-adopts them).
  void close_all(const std::string& why);

 private:
  Registry& registry_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Sandbox>> live_;
};

}  // namespace airlock::engine
